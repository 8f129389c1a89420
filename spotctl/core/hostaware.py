"""Host-aware placement: on which hosts a new node may land, and what a landing on the wrong one means.

The forward calendar says how many nodes a pool can hold until when (``Calendar.safe_until``); it does not
say *which* hosts those are. A cloud that picks any host with room (real Nova knows nothing of Blazar's
calendar) may put a node meant for 8 hours of work on a host a reservation takes in 20 minutes. Two pure
rules close the gap, and the adapters only apply them:

- **before the boot** (:func:`launch_choices`, :func:`pick_host`): a node of a launch may land only on a
  host that no reservation takes before ``not_before`` = now + boot + the longest work packed for it (at
  least ``default_pod_seconds``) + drain + the advisory's drain margin (the same margin :func:`~spotctl.core.notices.node_protection`
  keeps). The plan records ``not_before`` per packing segment in the launch action's inputs
  (``host_choice``), so the choice is replayable from the recorded plan input; the cloud port receives
  it as a :class:`HostChoice`. The simulator honours it; the OpenStack adapter enforces it with a
  host-targeted boot where the operator allows one (``target_hosts``), picking the host with
  :func:`pick_host` from what it reads of Placement and Blazar just before the boot.
- **after the boot** (:func:`landed_at_risk`): a new node (building, or active with nothing running) whose
  host a reservation takes before the work that could land on it would end and drain is a calendar risk:
  the plan closes it to new work early (``protect_windows``), leaves it out of the room it fills
  (``fill_existing``), so that the work meant for it is re-planned onto other nodes, and says why.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Any

__all__ = ["HOST_RULE", "HostChoice", "LaunchNodes", "choice_for_node", "choose_hosts", "host_acceptable",
           "landed_at_risk", "launch_choices", "not_before", "pick_host", "reclaims_by_host"]

from .capacity import host_fit
from .config import Policy
from .models import ActionKind, HostCapacity, HostChoice, NodeState, PoolSpec, Reservation, host_acceptable
from .notices import node_protection
from .plan_state import PlanState
from .textfmt import when_text
from .timefmt import iso


def not_before(now: float, pool: PoolSpec, policy: Policy, longest_seconds: float) -> float:
    """The earliest host reclaim a new node of ``pool`` carrying ``longest_seconds`` of work can live with:
    boot, the work, then the drain that begins ``drain_seconds + advisory_drain_margin_seconds`` before a
    reservation (:func:`~spotctl.core.notices.node_protection`)."""
    return (now + pool.boot_seconds + max(0.0, longest_seconds) + policy.drain_seconds
            + policy.advisory_drain_margin_seconds)


def launch_choices(inputs: dict[str, Any], now: float, pool: PoolSpec, policy: Policy) -> list[float]:
    """``not_before`` of each packing segment of a launch action (its ``segments``: [nodes, safe_until,
    longest unit seconds], as :func:`~spotctl.core.plan_demand.take_batch` records them). The work counted is
    at least ``default_pod_seconds``: what the landing rule (:func:`landed_at_risk`, through
    ``protect_windows``) expects could land on any new node, so that a node placed by this bound is never
    flagged by that rule in the next pass."""
    floor = policy.default_pod_seconds
    return [round(not_before(now, pool, policy, max(float(seg[2]), floor)), 3) for seg in inputs.get("segments") or []]


def choice_for_node(inputs: dict[str, Any], index: int) -> HostChoice | None:
    """The host choice of the ``index``-th node of a launch action, from its recorded inputs (None: the
    action carries none — a plan from before host-aware placement, or a replacement without segments)."""
    return LaunchNodes(inputs).choice(index)


class LaunchNodes:
    """A launch action's recorded inputs, node by node: which of its segments (``[nodes, safe until, longest
    work]``, in order) the ``index``-th node belongs to, found by bisection (a launch of n replacement nodes has
    up to n segments; a walk per node was n² a launch)."""

    def __init__(self, inputs: dict[str, Any]):
        self.inputs = inputs
        segments = inputs.get("segments")
        self.segments: list[Any] = segments if isinstance(segments, list) else []
        self.ends = list(accumulate(int(seg[0]) for seg in self.segments))  # each segment's end (exclusive)
        hc = inputs.get("host_choice")
        bounds = (hc.get("not_before") or []) if isinstance(hc, dict) else []
        self.bounds: list[Any] = bounds if isinstance(bounds, list) and len(bounds) == len(self.segments) else []

    def _segment(self, index: int) -> int:
        """The segment of the ``index``-th node (past the end: the last one)."""
        return min(bisect_right(self.ends, index), len(self.segments) - 1)

    def choice(self, index: int) -> HostChoice | None:
        """The host choice of the ``index``-th node (None: the action carries none)."""
        if not self.bounds:
            return None
        return HostChoice(float(self.bounds[self._segment(index)]))

    def inputs_of(self, index: int) -> dict[str, Any]:
        """The inputs as they concern the ``index``-th node: its own segment (``[1, safe until, longest
        work]``) and its own host choice bound, in place of the action's lists of them. A launch of n
        replacement nodes lists up to n segments: each node's audit record carrying them all was n² entries a
        launch (475 nodes: 6 MB of records). The action's row keeps the lists; ``LaunchNodes(a).choice(i)`` is
        ``LaunchNodes(a.inputs_of(i)).choice(0)``."""
        if not self.segments:
            return self.inputs
        k = self._segment(index)
        out = {**self.inputs, "segments": [[1, *self.segments[k][1:]]]}
        if self.bounds:
            out["host_choice"] = {**self.inputs["host_choice"], "not_before": [self.bounds[k]]}
        return out


def reclaims_by_host(reservations: list[Reservation], pools: dict[str, PoolSpec], now: float) -> dict[str, float]:
    """When a reservation takes each host back from the spot pool: the lease's start minus the pool's
    cleaning time, the earliest of the leases that have not ended (never before ``now``)."""
    out: dict[str, float] = {}
    for r in reservations:
        pool = pools.get(r.pool)
        at = r.start - (pool.cleaning_seconds if pool else 0)
        for h in r.hosts:
            if r.end > now and (h not in out or at < out[h]):
                out[h] = max(at, now)
    return out


def pick_host(hosts: list[HostCapacity], pool: PoolSpec, reclaims: dict[str, float], choice: HostChoice,
              now: float, taken: dict[str, int] | None = None) -> str | None:
    """The host a targeted boot of one node of ``pool`` asks for: among the pool's hosts with room for one
    more node (less ``taken``: nodes already sent there and not yet counted) that no reservation takes
    before ``choice.not_before``, the one whose reclaim comes *soonest* (hosts without a reservation last),
    so that long windows are kept for long work; then the most room, then the name. None: no host fits."""
    best: tuple[float, int, str] | None = None
    for h in hosts:
        if h.pool != pool.name:
            continue
        at = reclaims.get(h.name, h.reserved_from)
        if at is not None and at <= now:
            continue
        if not choice.acceptable(at):
            continue
        room = host_fit(h, pool, include_ours=False) - (taken or {}).get(h.name, 0)
        if room <= 0:
            continue
        key = (float("inf") if at is None else at, -room, h.name)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def landed_at_risk(state: NodeState, running: int, reclaim_at: float | None, now: float, policy: Policy,
                   longest_seconds: int) -> bool:
    """A new node (building, or active with nothing running yet) that landed on a host a reservation takes
    before the work that could land there (``longest_seconds``) would end and drain: its window
    (:func:`~spotctl.core.notices.node_protection`) is closed."""
    if reclaim_at is None or running or state not in (NodeState.BUILDING, NodeState.ACTIVE):
        return False
    _, closed = node_protection(reclaim_at, now, policy, longest_seconds)
    return closed


def choose_hosts(st: PlanState) -> None:
    """The planner's step after packing: each launch action records, per packing segment, the earliest host
    reclaim its nodes can live with (``host_choice.not_before``), and the plan says so for every pool whose
    forward calendar has a reservation within reach."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    for a in st.actions:
        if a.kind is not ActionKind.LAUNCH or a.pool not in inp.pools or not a.inputs.get("segments"):
            continue
        pool = inp.pools[a.pool]
        bounds = launch_choices(a.inputs, now, pool, policy)
        a.inputs["host_choice"] = {"not_before": bounds, "rule": HOST_RULE}
        cal = inp.calendars.get(a.pool)
        drop = next(((t, c) for t, c in cal.steps if t > now) if cal else iter(()), None)
        if drop is None or drop[0] >= max(bounds):
            continue  # no reservation within reach of these nodes: any host will do
        lo, hi = min(bounds), max(bounds)
        span = when_text(lo, now) if hi <= lo else f"{when_text(lo, now)} to {iso(hi, sep=' ')} (by the work packed)"
        st.explain.append(
            f"{a.pool}: the {a.count} new node{'s' if a.count != 1 else ''} may land only on hosts no reservation "
            f"takes before {span}: boot + work + drain; the cloud keeps them off hosts reserved sooner where the "
            f"region lets it (host_placement), and a node that lands on one anyway is closed to new work")


HOST_RULE = "host reclaim >= now + boot + longest work + drain + advisory drain margin"
