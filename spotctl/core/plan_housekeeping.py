"""The planner's first steps: node housekeeping, then the calendar at run time.

:func:`housekeeping` decides, node by node, what a notice asks for (:func:`~spotctl.core.notices.decide_notice`:
drain, delete, cordon, uncordon), runs the next round of each drain under way and returns failed
nodes; the work on nodes about to go becomes replacement demand. :func:`protect_windows` tells
each node's schedulers by when its work must end when a reservation takes its host.

Each advised node (cordoned for an advisory: no new work) is explained, grouped by pool, host and
notice: which notice, when its host is taken back and when the node is drained (:func:`advised_line`).
"""

from __future__ import annotations

from .budget import Priority
from .config import Policy
from .hostaware import landed_at_risk
from .lifecycle import bound_schedulers, forced_round
from .models import ActionKind, NodeState, Notice, NoticeKind, Scheduler
from .notices import advisory_stage, calendar_notice, decide_notice, node_protection
from .plan_input import REPLACEMENT, DemandClass, NodeView
from .plan_state import PlanState
from .textfmt import duration_text, when_text
from .timefmt import iso


def housekeeping(st: PlanState) -> None:
    """Reclaim handling, advisories, drains under way and failed builds, for every node in order; then
    one replacement demand class per node whose running work must move; then why nodes are advised."""
    # (pool, host, from our calendar, not registered yet, kind, reason, deadline) -> the nodes' notices
    advised: dict[tuple[str, str, bool, bool, str, str, float], list[Notice]] = {}
    for n in st.inp.nodes:
        notice = node_notice(st, n)
        d = decide_notice(notice, n.state, st.now, st.inp.policy, cordoned=n.cordoned,
                          cordoned_by_us=n.cordoned_by_us, known=n.known, running=n.running)
        if d is not None and notice is not None and notice.kind is not NoticeKind.HARD and d.leaving \
                and d.kind in (ActionKind.CORDON, None):
            unregistered = d.kind is None and not n.cordoned and not n.known
            key = (n.pool, n.host or "-", n.notice is None, unregistered, str(notice.kind), notice.reason,
                   -1.0 if notice.deadline is None else notice.deadline)
            advised.setdefault(key, []).append(notice)
        if d is not None:
            if d.leaving:
                st.leaving.add(n.id)
            if d.replace:
                st.to_replace.append(n)
            if d.kind is not None and (d.kind is not ActionKind.DELETE or st.tokens(d.priority, 1)):
                st.add(d.kind, d.priority, d.reason, node=n.id, pool=n.pool, deadline=d.deadline, inputs=d.inputs)
        elif n.state is NodeState.DRAINING:
            drain_round(st, n, notice)
        elif n.state is NodeState.FAILED:
            st.leaving.add(n.id)
            if st.tokens(Priority.CONSOLIDATION, 1):
                st.add(ActionKind.DELETE, Priority.CONSOLIDATION, "instance failed to build", node=n.id, pool=n.pool)
    replacement_demand(st)
    for (pool, host, from_calendar, unregistered, *_), notices in sorted(advised.items()):
        st.explain.append(advised_line(pool, host, notices, from_calendar, st.now, st.inp.policy,
                                       unregistered=unregistered))


def advised_line(pool: str, host: str, notices: list[Notice], from_calendar: bool, now: float, policy: Policy,
                 *, unregistered: bool = False) -> str:
    """Why nodes of ``pool`` on ``host`` are advised (cordoned: no new work) for their ``notices`` (one each,
    alike), and what comes next: the host taken back at the deadline, replacements pre-spun, the drain.
    ``unregistered``: still booting, unknown to their schedulers: cordoned once they register."""
    notice, count = notices[0], len(notices)
    if from_calendar:
        why = (f"the calendar advisory (a reservation takes the host; announced "
               f"{duration_text(policy.calendar_advisory_seconds)} ahead)")
    else:
        what = "calendar notice" if notice.kind is NoticeKind.CALENDAR else "advisory"
        why = (f"the provider's {what} {notice.id}" if count == 1 else f"the provider's {what}s") + (
            f" ({notice.reason})" if notice.reason else "")
    state = "to be advised once they register" if unregistered else "advised"
    head = f"{pool}: {count} node{'s' if count != 1 else ''} on host {host} {state} (cordoned: no new work) for {why}"
    if notice.deadline is None:
        return head + (f"; no deadline: drained from {iso(notice.issued_at + policy.advisory_drain_seconds, sep=' ')} "
                       f"unless it clears first")
    drain_at = notice.deadline - policy.drain_seconds - policy.advisory_drain_margin_seconds
    stage = advisory_stage(notice, now, policy)
    prespin = ("replacements pre-spun now" if stage == "prespin" else
               f"replacements pre-spun from {iso(notice.deadline - policy.advisory_prespin_lead_seconds, sep=' ')}")
    return head + (f"; the host is taken back at {when_text(notice.deadline, now)}; {prespin}, "
                   f"drained from {iso(drain_at, sep=' ')}")


def node_notice(st: PlanState, n: NodeView) -> Notice | None:
    """The node's notice; without one, the calendar advisory of a reservation that takes its host
    (Blazar says so: an advisory, early), once it is due."""
    if n.notice is None and n.host and n.host in st.inp.host_reclaims:
        return calendar_notice(n.host, n.pool, st.inp.host_reclaims[n.host], st.now, st.inp.policy)
    return n.notice


def drain_round(st: PlanState, n: NodeView, notice: Notice | None) -> None:
    """A drain is a state machine across passes: each pass runs one more round (evict what is left)
    until the node is empty; near a hard notice's deadline the last round is forced (what still
    cannot move is deleted with the time left), then the capacity is returned."""
    inp, now = st.inp, st.now
    st.leaving.add(n.id)
    overdue = n.drain_started is not None and now - n.drain_started >= inp.policy.drain_seconds
    deadline = notice.deadline if notice is not None else None
    deadline_near = forced_round(deadline, now)
    pr = Priority.RECLAIM if notice is not None else Priority.CONSOLIDATION
    if n.running and deadline_near and notice is not None and deadline is not None:
        st.add(ActionKind.DRAIN, pr, f"notice {notice.id} deadline in {int(deadline - now)}s: last drain round, delete "
               f"the {n.running} workload(s) still there", node=n.id, pool=n.pool, deadline=deadline,
               inputs={"notice": notice.id, "running": n.running, "continue": True, "force": True})
    elif n.running and not overdue:
        st.add(ActionKind.DRAIN, pr, f"drain continues: {n.running} workload(s) still on the node", node=n.id,
               pool=n.pool, deadline=deadline, inputs={"running": n.running, "continue": True,
                                                      **({"notice": notice.id} if notice else {})})
    # empty only on evidence: every scheduler the node is bound to was read and shows nothing there
    pool = inp.pools.get(n.pool)
    seen_empty = n.running == 0 and n.known and not (
        bound_schedulers(pool) & inp.usage_unread if pool is not None else inp.usage_unread)
    if seen_empty or overdue or deadline_near:
        why = "drained and empty" if seen_empty else ("drain time is up" if overdue else "notice deadline is near")
        if st.tokens(pr, 1):
            st.add(ActionKind.DELETE, pr, f"{why}: return the capacity", node=n.id, pool=n.pool)


def replacement_demand(st: PlanState) -> None:
    """Replacement capacity, planned before ordinary demand (priority class "replacement"): one unit the
    size of what runs on each node about to go, in any other pool of the same kind that fits it."""
    pools = st.inp.pools
    for n in sorted(st.to_replace, key=lambda n: n.id):
        src = pools.get(n.pool)
        others = tuple(sorted(name for name, p in pools.items() if name != n.pool and n.used.fits_in(p.shape)
                              and (src is None or p.kind is src.kind)))
        st.add_demand(DemandClass(key=f"replace-{n.id}", scheduler=REPLACEMENT, shape=n.used, priority=1_000_000,
                                  expected_seconds=0, count=1, pools=others, examples=(n.id,)))


def protect_windows(st: PlanState) -> None:
    """The calendar at run time: each node's schedulers are told by when its work must end (a reservation
    takes its host), so that no scheduler starts work there that would be cut off; told again when that
    changes (closed to new work, or lifted when the reservation goes). A new node that landed on a host a
    reservation takes too soon (:func:`~spotctl.core.hostaware.landed_at_risk`) is a calendar risk: closed
    to new work, left out of the room :func:`~spotctl.core.plan_demand.fill_existing` fills (its work is
    re-planned), and explained."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    # the longest pending pod each pool could get (Kubernetes knows no durations: at least default_pod_seconds),
    # from one pass over the demand, not one per node (20k nodes × 2.5k classes took seconds)
    # (the longest per pool set first: classes share their pools tuple, so each set's pools are walked once)
    sets, of_class = inp.demand_sets
    longest_of: dict[int, int] = {}
    k8s = str(Scheduler.KUBERNETES)
    for d, i in zip(inp.demand, of_class):
        if d.scheduler == k8s and (i not in longest_of or d.expected_seconds > longest_of[i]):
            longest_of[i] = d.expected_seconds
    pods: dict[str, int] = {}
    for i, seconds in longest_of.items():
        for p in sets[i]:
            if p not in pods or seconds > pods[p]:
                pods[p] = seconds
    landed: dict[tuple[str, str, float], list[str]] = {}  # (pool, host, reclaim) -> new nodes at risk there
    for n in inp.nodes:
        if n.id in st.leaving or n.cordoned or n.state not in (NodeState.BUILDING, NodeState.ACTIVE):
            continue
        longest = max(pods[n.pool], policy.default_pod_seconds) if n.pool in pods else policy.default_pod_seconds
        reclaim_at = inp.host_reclaims.get(n.host) if n.host else None
        until, closed = node_protection(reclaim_at, now, policy, longest)
        risk = landed_at_risk(n.state, n.running, reclaim_at, now, policy, longest)
        if risk:  # the cloud put a new node where a reservation comes too soon: its work goes elsewhere
            if "slurm" not in bound_schedulers(inp.pools[n.pool]) if n.pool in inp.pools else True:
                st.at_risk.add(n.id)  # no scheduler there judges work by its duration: it takes none at all
            landed.setdefault((n.pool, n.host or "-", reclaim_at or 0.0), []).append(n.id)
        told = None if n.protected_until is None else round(n.protected_until)
        if (None if until is None else round(until)) == told and (closed == n.protect_closed or until is None):
            continue
        if until is None:
            why = "no reservation takes its host any more: lift the run-time window"
        else:
            why = (f"a reservation takes host {n.host} at {iso(reclaim_at or 0, sep=' ')}: work must end by "
                   f"{when_text(until, now)}")
            if closed:
                why += f"; shorter than the work that could land ({duration_text(longest)}): no new work"
            if risk:
                why = "calendar risk: the node landed on a soon-reserved host; " + why
        st.add(ActionKind.PROTECT, Priority.RECLAIM, why, node=n.id, pool=n.pool,
               inputs={"until": until, "closed": closed, "host": n.host, "longest_seconds": longest,
                       **({"landing_risk": True} if risk else {})})
    for (pool, host, at), ids in sorted(landed.items()):
        st.explain.append(
            f"{pool}: {len(ids)} new node{'s' if len(ids) != 1 else ''} landed on host {host}, which a reservation "
            f"takes at {when_text(at, now)}, before the work that could land there would end and drain "
            f"(calendar risk): closed to new work (Kubernetes: tainted; Slurm: only jobs that end in time), and the "
            f"work meant for {'them' if len(ids) != 1 else 'it'} is re-planned onto other nodes "
            f"({', '.join(sorted(ids)[:3])}{', …' if len(ids) > 3 else ''})")
