"""Consolidation: save money without churn.

:func:`consolidate` runs after scale-down (idle nodes go first: retiring them disrupts no work) and
takes what is left of the same disruption budget. For each of our busy nodes, the dearest first, it
considers two moves:

- **retire**: the node's work fits in the free room of another of our nodes (one that takes work, that
  this plan puts nothing on, of a pool no pending work is left for): drain the node; its schedulers put
  the work there;
- **move** (spot → spot): one new node of a cheaper pool takes the node's work: launch it, drain the
  node (the drain is the existing state machine: ``plan_housekeeping.drain_round`` continues it and
  deletes the node once it is empty; the work evicted is pending demand that the new node takes).

A move is made only when every guard holds, checked in this order (``plan --explain`` names the first
that fails, per node):

1. the saving (the node's price against the target's, per node-hour) is at least
   ``consolidation_min_saving_pct`` on this rate card **and** on the one before it (two ticks: a pool that
   is cheap on one tick and dear the next never draws work; a saving with no earlier card to check
   against is "held 1 of 2 ticks");
2. the target is not riskier: no more advisories or recent reclaims than the node's pool, not under the
   no-notice policy when the node's pool is not, no recent launch failure; it has room (headroom, pool
   limit, quota, spend cap, launches per pass, after what the plan launched already); and its calendar
   keeps the new capacity at least as long as the node's host is kept (no reservation sooner);
3. the target serves the same work: same kind, scheduler bindings that run it (:func:`serves_like`);
4. the node has been up ``consolidation_min_node_age_seconds`` and its youngest workload has run
   ``consolidation_min_run_seconds``; a run time that its schedulers do not report is not long enough;
5. the disruption budget (``disruption_budget_pct``, one budget with scale-down) and the token budget
   (class consolidation, the lowest) allow.

A target never turns back into a source soon after: the new node is younger than the minimum age.
Pure: decides on the plan input and the plan state alone.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from .budget import Priority
from .lifecycle import bound_schedulers
from .models import ActionKind, NodeState, PoolSpec, Shape
from .notices import calendar_advisory_due
from .plan_demand import Launches
from .plan_input import NodeView
from .plan_state import PlanState
from .textfmt import duration_text, shape_text, when_text

#: Candidate nodes whose decision ``plan --explain`` gives one by one (the dearest first); the rest are
#: counted by reason in one line.
EXPLAIN_NODES = 20
#: The states of another node of ours whose free room may take a retired node's work.
_TAKES = (NodeState.ACTIVE,)


def disruption_allowed(staying: int, pct: float) -> int:
    """Nodes that scale-down and consolidation may take out of service in one pass, together: ``pct`` % of
    the ``staying`` nodes, at least one when ``pct`` is above 0."""
    allowed = int(staying * pct / 100)
    return max(1, allowed) if pct > 0 else 0


def _pct(src: float, dst: float) -> float:
    """The saving of ``dst`` against ``src`` per node-hour, in % of ``src``."""
    return (src - dst) / src * 100 if src > 0 else 0.0


def _fmt(pct: float) -> str:
    return f"{pct:.1f} %"


def consolidate(st: PlanState) -> None:
    """Retire or move busy nodes to cheaper capacity when every guard holds (see the module); say why each
    candidate moved or did not."""
    inp, policy = st.inp, st.inp.policy
    threshold = policy.consolidation_min_saving_pct
    if threshold <= 0:
        return  # off (the default): nothing decided, nothing said
    if inp.rate_card is None:
        st.explain.append("consolidation: no rate card: nothing is moved without prices")
        return
    deleted = {a.node for a in st.actions if a.kind is ActionKind.DELETE and a.node is not None}
    staying = [n for n in inp.nodes if n.id not in st.leaving]
    budget = disruption_allowed(len(staying), policy.disruption_budget_pct)
    left = budget - sum(1 for n in staying if n.id in deleted)  # scale-down's deletions come first
    cands = [n for n in staying if n.id not in deleted and n.id not in st.used_nodes and n.state is NodeState.ACTIVE
             and n.running > 0 and not n.cordoned and n.notice is None and n.known and n.pool in inp.pools
             and st.prices.get(n.pool) is not None]
    cands.sort(key=lambda n: (-(st.prices.get(n.pool) or 0.0), n.id))
    if left <= 0:
        st.explain.append(f"consolidation: disruption budget ({policy.disruption_budget_pct:g} % of the nodes, shared "
                          f"with scale-down) taken this pass: {len(cands)} busy nodes not looked at")
        return
    prev = inp.previous_rate_card
    room: Launches = st.launches
    # free room on our other nodes (for retiring a node): nodes that take work, get none from this plan, and of a
    # pool no pending work is left for (room that pending work would take is not room for a retired node's work:
    # the two would race for it, and the loser would launch a node: churn)
    index = st.index()
    free: dict[str, Shape] = {}
    for n in staying if policy.consolidation_retire else ():
        if n.id not in deleted and n.id not in st.used_nodes and n.state in _TAKES and not n.cordoned \
                and n.notice is None and n.known and n.pool in inp.pools and not index.has_demand(n.pool):
            r = (inp.pools[n.pool].shape - n.used).clamp()
            if r != Shape():
                free[n.id] = r
    views = {n.id: n for n in inp.nodes}
    moved: set[str] = set()  # nodes this step drains, or puts work on: neither is touched again
    told = moves = 0
    why_not: Counter[str] = Counter()
    targets: dict[tuple[str, Shape], list[tuple[float, str]]] = {}  # (pool, work's shape) -> cheaper pools
    memo: dict[tuple[Any, ...], Verdict | None] = {}
    for k, n in enumerate(cands):
        if left <= 0:  # the budget is taken: the rest are not looked at one by one
            why_not["disruption budget taken (not looked at)"] += len(cands) - k
            break
        if n.id in moved:
            continue
        key = (n.pool, n.used)
        if key not in targets:
            targets[key] = _targets(st, n)
        decision, reason = _decide(st, n, threshold, prev, room, free, views, moved, left, targets[key], memo)
        if decision:
            left -= 1
            moves += 1
        if decision or reason:
            told += 1
            if told <= EXPLAIN_NODES:
                st.explain.append(f"consolidation: {n.id} ({n.pool}): {reason}")
            else:
                why_not["moved" if decision else _category(reason)] += 1
    st.explain.append(f"consolidation: {len(cands)} busy node{'s' if len(cands) != 1 else ''} considered (minimum "
                      f"saving {_fmt(threshold)} on rate card {inp.rate_card.version} and the one before"
                      f" ({'none seen yet' if prev is None else prev[0]})): {moves} moved")
    if why_not:
        st.explain.append(f"consolidation: {sum(why_not.values())} more nodes not listed one by one ("
                          + ", ".join(f"{k}: {v}" for k, v in sorted(why_not.items())) + ")")


#: The guards, as the one-line summary of the nodes not explained one by one counts them (the first found).
_CATEGORIES = ("below the threshold", "held 1 of 2 ticks", "target riskier", "no headroom", "at its limit",
               "launches per pass", "quota", "spend cap", "node age", "run time", "not known", "disruption budget",
               "token budget")


def _category(reason: str) -> str:
    found = [(reason.find(c), c) for c in _CATEGORIES if c in reason]
    return min(found)[1] if found else "other"


def _risk(st: PlanState, name: str) -> tuple[int, int, bool]:
    inp = st.inp
    return inp.advisories.get(name, 0), inp.recent_reclaims.get(name, 0), name in inp.no_notice_pools


def _riskier(st: PlanState, src: str, dst: str) -> str | None:
    """Why pool ``dst`` is riskier than ``src`` (None: it is not)."""
    (sa, sr, sn), (da, dr, dn) = _risk(st, src), _risk(st, dst)
    if da > sa:
        return f"target riskier: {dst} has {da} advisories, {src} {sa}"
    if dr > sr:
        return f"target riskier: {dst} had {dr} reclaims in the last hour, {src} {sr}"
    if dn and not sn:
        return f"target riskier: {dst} plans under the no-notice policy (its provider contract is not met)"
    failed = st.inp.pool_failures.get(dst, 0.0)
    if failed > st.now:
        return f"target riskier: {dst} failed to launch recently (skipped until {when_text(failed, st.now)})"
    return None


def _kept_until(st: PlanState, n: NodeView) -> float:
    """Until when the node's host stays spot capacity (a reservation takes it; inf: none in the horizon)."""
    at = st.inp.host_reclaims.get(n.host) if n.host else None
    return math.inf if at is None else at


def serves_like(src: PoolSpec, dst: PoolSpec) -> bool:
    """Whether work that runs on a node of ``src`` can run on one of ``dst``: the same kind, every scheduler
    ``src`` is bound to binds ``dst`` too, the same Slurm partition with at least its features, at least its
    Kubernetes labels (node selectors) and no taint it does not have (tolerations)."""
    if dst.kind is not src.kind or not bound_schedulers(src) <= bound_schedulers(dst):
        return False
    if src.slurm.partition is not None and (dst.slurm.partition != src.slurm.partition
                                            or not set(src.slurm.features) <= set(dst.slurm.features)):
        return False
    return set(src.kubernetes.labels) <= set(dst.kubernetes.labels) and set(dst.kubernetes.taints) <= set(
        src.kubernetes.taints)


def _targets(st: PlanState, n: NodeView) -> list[tuple[float, str]]:
    """Pools that could take the node's work on one new node, cheapest first: (price, name)."""
    inp = st.inp
    src = inp.pools[n.pool]
    out = []
    for name, p in inp.pools.items():
        price = st.prices.get(name)
        if name != n.pool and price is not None and n.used.fits_in(p.shape) and serves_like(src, p):
            out.append((price, name))
    out.sort()
    return out


def _node_guard(st: PlanState, n: NodeView) -> str | None:
    """Why the node may not be preempted now (age, run time, what runs there unknown); None: it may."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    unread = bound_schedulers(inp.pools[n.pool]) & inp.usage_unread
    if unread:
        return f"what runs there is not known ({', '.join(sorted(unread))} not read this pass)"
    if n.launched_at is None:
        return "node age not known"
    age = now - n.launched_at
    if age < policy.consolidation_min_node_age_seconds:
        return (f"node age {duration_text(max(0.0, age))} below the minimum "
                f"{duration_text(policy.consolidation_min_node_age_seconds)}")
    if n.work_started_at is None:
        return "run time of its work not known (its schedulers do not say): not preempted"
    ran = now - n.work_started_at
    if ran < policy.consolidation_min_run_seconds:
        return (f"run time too short: its youngest workload has run {duration_text(max(0.0, ran))}, minimum "
                f"{duration_text(policy.consolidation_min_run_seconds)}")
    return None


def _decide(st: PlanState, n: NodeView, threshold: float, prev: tuple[str, dict[str, float]] | None, room: Launches,
            free: dict[str, Shape], views: dict[str, NodeView], moved: set[str], left: int,
            targets: list[tuple[float, str]], memo: dict[tuple[Any, ...], Verdict | None]) -> tuple[bool, str]:
    """One candidate: (moved?, why). An empty why: no cheaper place at all (not explained one by one)."""
    inp = st.inp
    price = st.prices[n.pool]
    version = inp.rate_card.version if inp.rate_card else "?"
    kept = _kept_until(st, n)
    # retire: the work fits in free room on another node of ours that is not riskier, whose host is kept as long
    spot = None
    for oid in sorted(free):
        o = views[oid]
        if oid == n.id or oid in moved or not n.used.fits_in(free[oid]):
            continue
        if not serves_like(inp.pools[n.pool], inp.pools[o.pool]):
            continue
        if _riskier(st, n.pool, o.pool) is None and _kept_until(st, o) >= kept:
            spot = o
            break
    tried: list[str] = []
    if spot is not None:
        prev_price = prev[1].get(n.pool) if prev else None
        if prev is None or prev_price is None or prev_price <= 0:
            tried.append(f"retire onto {spot.id}: saving 100.0 % held 1 of 2 ticks (no earlier rate card prices "
                         f"{n.pool})")
        else:
            why = _node_guard(st, n) or _budgets(st, n, left, 1)
            if why is None:
                free[spot.id] = (free[spot.id] - n.used).clamp()
                moved.update((n.id, spot.id))
                st.add(ActionKind.DRAIN, Priority.CONSOLIDATION,
                       f"consolidation: retire the node, its work ({shape_text(n.used)}) fits on {spot.id}: saves "
                       f"{price:.4f} {inp.rate_card.currency if inp.rate_card else ''}/h".rstrip(),
                       node=n.id, pool=n.pool,
                       inputs={"consolidation": {"kind": "retire", "onto": spot.id, "saving_pct": 100.0,
                                                 "rate_cards": [prev[0], version]}})
                return True, f"retired: its work fits on {spot.id} (saves the whole node, {price:.4f}/h)"
            tried.append(f"retire onto {spot.id}: {why}")
    verdict = _pick(st, n.pool, price, threshold, prev, room, kept, targets, memo)
    if verdict is None:
        return (False, "not moved: " + "; ".join(tried[:3])) if tried else (False, "")
    pick, found = verdict
    tried.extend(found)
    if pick is None:
        return (False, "not moved: " + "; ".join(tried[:3])) if tried else (False, "")
    p, name, pct = pick
    why = _node_guard(st, n) or _budgets(st, n, left, 2)
    if why is not None:  # the node's, or the pass's: no target does
        tried.append(f"move to {name}: saving {_fmt(pct)}: {why}")
        return False, "not moved: " + "; ".join(tried[:3])
    pool = inp.pools[name]
    cur = inp.rate_card.currency if inp.rate_card else ""
    info: dict[str, Any] = {"kind": "move", "from": n.pool, "to": name, "saving_pct": round(pct, 3),
                            "rate_cards": [prev[0] if prev else None, version], "node": n.id}
    st.add(ActionKind.LAUNCH, Priority.CONSOLIDATION,
           f"consolidation: 1 × {name} ({shape_text(pool.shape)}) at {p:.4f} {cur}/node-hour to take the work of "
           f"{n.id} ({n.pool}, {price:.4f} {cur}/node-hour)", pool=name, count=1, price=p,
           inputs={"consolidation": info, "headroom": (inp.headroom[name].free if name in inp.headroom else 0)})
    st.add(ActionKind.DRAIN, Priority.CONSOLIDATION,
           f"consolidation: move its work to {name}, {_fmt(pct)} cheaper on rate cards "
           f"{info['rate_cards'][0]} and {version}", node=n.id, pool=n.pool, inputs={"consolidation": info})
    room.take_one(name, pool, p)
    memo.clear()  # the room changed: every target is looked at again
    moved.add(n.id)
    return True, f"moved to {name}: saving {_fmt(pct)} (threshold {_fmt(threshold)}) held 2 of 2 ticks"


#: What :func:`_pick` found for a source pool, a node price and how long the node's host is kept: the target
#: (price, pool, saving %) or None, and why the targets before it were not taken.
Verdict = tuple[tuple[float, str, float] | None, list[str]]


def _pick(st: PlanState, src: str, price: float, threshold: float, prev: tuple[str, dict[str, float]] | None,
          room: Launches, kept: float, targets: list[tuple[float, str]], memo: dict[tuple[Any, ...], Verdict | None],
          ) -> Verdict | None:
    """The cheapest target pool whose own guards hold (saving on both ticks, risk, room, calendar), and why
    the cheaper ones fail; None: no pool is cheaper at all. The same for every node of one pool, work shape
    and host window until the room changes (``memo``, cleared by a move)."""
    key = (src, price, kept, id(targets))
    if key in memo:
        return memo[key]
    cheaper = [(p, name) for p, name in targets if p < price]
    out: Verdict | None = None
    if cheaper:
        tried: list[str] = []
        pick = None
        for p, name in cheaper:
            pct = _pct(price, p)
            if pct < threshold:
                tried.append(f"move to {name}: saving {_fmt(pct)} below the threshold {_fmt(threshold)}")
                break  # the cheapest saves the most: the others save less
            held = _held(prev, src, name, threshold)
            if held is not None:
                tried.append(f"move to {name}: saving {_fmt(pct)}, {held}")
                continue
            why = _riskier(st, src, name) or room.one_more(st, name, st.inp.pools[name], p) or _window(st, name, kept, room)
            if why is not None:  # this target's: another may do
                tried.append(f"move to {name}: saving {_fmt(pct)}: {why}")
                continue
            pick = (p, name, pct)
            break
        out = (pick, tried)
    memo[key] = out
    return out


def _held(prev: tuple[str, dict[str, float]] | None, src: str, dst: str, threshold: float) -> str | None:
    """Why the saving did not hold on the previous rate card (None: it did)."""
    if prev is None:
        return "held 1 of 2 ticks (no earlier rate card seen)"
    ps, pd = prev[1].get(src), prev[1].get(dst)
    if ps is None or pd is None:
        return f"held 1 of 2 ticks (rate card {prev[0]} priced {src if ps is None else dst} not)"
    was = _pct(ps, pd)
    if was < threshold:
        return f"held 1 of 2 ticks (on rate card {prev[0]} it was {_fmt(was)})"
    return None


def _window(st: PlanState, name: str, kept: float, room: Launches) -> str | None:
    """Why a new node of ``name`` would be kept a shorter time than the node it replaces (None: it would not)."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    cal = inp.calendars.get(name)
    if cal is None:
        return None
    rank = room.rank(name)
    until = cal.safe_until(rank, now)
    safe = math.inf if until >= cal.end else until
    pool = inp.pools[name]
    if math.isfinite(safe) and calendar_advisory_due(safe, now + pool.boot_seconds, policy):
        return f"target riskier: its calendar takes the capacity back at {when_text(safe, now)}, before a node boots"
    if safe < kept:
        kept_text = "the end of the calendar" if math.isinf(kept) else when_text(kept, now)
        return (f"target riskier: its calendar window is shorter (capacity taken back at {when_text(safe, now)}; "
                f"the node's host is kept until {kept_text})")
    return None


def _budgets(st: PlanState, n: NodeView, left: int, tokens: int) -> str | None:
    """The disruption budget, then the token budget (taken here when both allow)."""
    policy = st.inp.policy
    if left <= 0:
        return (f"disruption budget: {policy.disruption_budget_pct:g} % of the nodes this pass is taken "
                f"(scale-down and consolidation share it)")
    if st.bucket.available(Priority.CONSOLIDATION, st.now) < tokens:
        return "token budget: no tokens left for consolidation this pass"
    st.tokens(Priority.CONSOLIDATION, tokens)
    return None
