"""The MILP reference of one plan's launch decision (issue 18), solved with HiGHS (``highspy``, the ``bench`` extra).

Benchmark code only: spotctl never imports this. :func:`decision` replays spotctl's planner on a
:class:`~spotctl.core.plan_input.PlanInput` up to its launch decision (housekeeping, the calendar at run
time, filling our existing nodes: the same sub-planners, in the same order as
:func:`spotctl.core.planner.plan`) and takes what is left to place, then lets the planner's own
``pack_new`` decide, and records what it launched. :func:`solve` states the same decision as a MILP:

Variables
    ``n[p, j]`` (integer) new nodes of pool ``p`` in its calendar segment ``j``: the planner's rule that
    the n-th node of a pool is safe until the forward calendar drops below n nodes, so the pool's new
    nodes fall into segments of equal safe window (at most the nodes that fit now host by host, the
    pool's ``max_nodes`` left); ``x[c, p, j]`` (integer) units of demand class ``c`` placed there.
Constraints
    a unit goes only where the planner's bindings allow (``c.pools``: scheduler binding and node shape)
    and only to a segment whose window (safe-until − now − drain − boot; the no-notice cap on degraded
    pools) covers its expected run (calendar-cut placements are excluded, not penalised); per pool
    segment, the units' total vCPU, RAM and GPUs fit in the nodes' (``n · shape``); units per class at
    most those left; quota (instances, vCPU, RAM), spend cap (the nodes that stay included), launches
    per pass and the token budget over all new nodes; a pool that failed recently, or without a price,
    takes nothing.
Objectives
    ``min_cost``: the least risk-weighted €/h (price × (1 + 0.25 · (advisories + recent reclaims)): the
    expected interruption cost as the planner scores it) of new nodes that place, class by class, at
    least what spotctl placed; ``max_units``: the most units placed within the €/h spotctl's launches
    cost (the spend-cap comparison).

:func:`plan` is the MILP as a planner (the same interface as :func:`spotctl.core.planner.plan`): spotctl's
plan with its launches replaced by the MILP's (objective ``place``: the most units, then the least
risk-weighted €/h). Its packing adds to the aggregate one a node-fraction restriction (Σ x_c / k_c ≤ n,
k_c: units of class c one node holds), exact for a segment of one class and conservative for mixes, so
that the nodes it launches can hold what it places; the schedulers then place the work as they do.

The packing is **aggregate** per pool segment (vCPU/RAM/GPU totals, not unit-by-node patterns): a
relaxation, so the MILP's value is a **bound** (a lower bound on the least cost, an upper bound on the
units that fit), and the gaps it gives are upper bounds of the gaps to the true optimum. A solve that
hits its time limit reports HiGHS' dual bound, which is a bound too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from spotctl.core.actions import Action, Plan
from spotctl.core.budget import Priority
from spotctl.core.models import ActionKind, PoolKind
from spotctl.core.notices import calendar_advisory_due
from spotctl.core.plan_demand import fill_existing, nodes_by_pool, pack_new, pool_risk
from spotctl.core.plan_housekeeping import housekeeping, protect_windows
from spotctl.core.plan_input import REPLACEMENT, DemandClass, PlanInput
from spotctl.core.plan_state import PlanState
from spotctl.core.planner import plan as spotctl_plan

INF = math.inf


def risk(inp: PlanInput, pool: str) -> float:
    """The planner's risk factor of a pool (:func:`spotctl.core.plan_demand.pool_risk`)."""
    return pool_risk(inp.advisories.get(pool, 0), inp.recent_reclaims.get(pool, 0))


@dataclass
class Segment:
    pool: str
    nodes: int  # at most this many new nodes share the window
    window: float  # seconds of work + nothing else that fits before the calendar takes the capacity


@dataclass
class Decision:
    """One launch decision: what was left to place after the planner's fill, and what spotctl launched."""

    inp: PlanInput
    classes: list[DemandClass]
    left: dict[str, int]  # class key -> units left after filling our nodes
    placed: dict[str, int]  # class key -> units spotctl placed on new nodes
    launches: dict[str, int]  # pool -> nodes spotctl launched
    cost: float  # €/h of spotctl's launches
    risk_cost: float  # the same, risk-weighted
    spend_left: float | None  # spend cap minus the nodes that stay (None: no cap)
    tokens: int  # launches the token budget allows (at the replacement class: the most any launch gets)
    tokens_launch: int  # ... at the launch class
    segments: list[Segment] = field(default_factory=list)

    @property
    def units(self) -> int:
        return sum(self.placed.values())


def decision(inp: PlanInput) -> Decision:
    st = PlanState.start(inp)
    for step in (housekeeping, protect_windows, fill_existing):
        step(st)
    left = {k: v for k, v in st.remaining.items() if v > 0}
    classes = [d for d in st.demand if left.get(d.key, 0) > 0 and d.pools]
    _, tokens = st.bucket.take(10**9, Priority.REPLACEMENT, st.now)  # the most any launch class may get
    _, tokens_launch = st.bucket.take(10**9, Priority.LAUNCH, st.now)
    spend = sum(st.prices.get(n.pool, n.price) for n in inp.nodes if n.id not in st.leaving)
    cap = inp.policy.spend_cap_per_hour
    n_before = len(st.actions)
    pack_new(st)
    launches: dict[str, int] = {}
    cost = risk_cost = 0.0
    for a in st.actions[n_before:]:
        if a.kind is ActionKind.LAUNCH and a.pool and a.count:
            launches[a.pool] = launches.get(a.pool, 0) + a.count
            cost += a.count * (a.price or 0.0)
            risk_cost += a.count * (a.price or 0.0) * risk(inp, a.pool)
    placed = {k: left[k] - st.remaining.get(k, 0) for k in left if left[k] - st.remaining.get(k, 0) > 0}
    d = Decision(inp, classes, left, placed, launches, cost, risk_cost,
                 None if cap is None else cap - spend, int(tokens), int(tokens_launch))
    d.segments = segments(inp, st.prices)
    return d


def segments(inp: PlanInput, prices: dict[str, float]) -> list[Segment]:
    """Each usable pool's new nodes, in segments of one safe window (as the planner's ``next_batch`` sees them)."""
    now, policy = inp.now, inp.policy
    existing = nodes_by_pool(inp)
    out: list[Segment] = []
    if inp.rate_card is None:
        return out
    for name, pool in sorted(inp.pools.items()):
        if prices.get(name) is None or inp.pool_failures.get(name, 0) > now:
            continue
        hr = inp.headroom.get(name)
        have = existing.get(name, 0)
        most = min(hr.free if hr else 0, max(0, pool.max_nodes - have), policy.max_launches_per_pass)
        cal = inp.calendars.get(name)
        last: Segment | None = None
        for i in range(1, most + 1):
            safe = cal.safe_until(have + i, now) if cal else now + 24 * 3600
            if cal and calendar_advisory_due(safe, now + pool.boot_seconds, policy):
                break
            window = safe - now - policy.drain_seconds - pool.boot_seconds
            if name in inp.no_notice_pools:
                window = min(window, policy.no_notice_max_seconds)
                if pool.kind is PoolKind.BAREMETAL:
                    window = min(window, policy.no_notice_max_seconds / 2)
            if last is not None and last.window == window:
                last.nodes += 1
            else:
                last = Segment(name, 1, window)
                out.append(last)
    return out


@dataclass
class Solution:
    status: str
    value: float  # the objective's bound: €/h (min_cost) or units (max_units)
    exact: bool  # solved to optimality (else: HiGHS' dual bound at the time limit)
    seconds: float
    units: int = 0
    cost: float = 0.0
    nodes: dict[str, int] = field(default_factory=dict)  # pool -> new nodes in the solution
    placed: dict[str, dict[str, int]] = field(default_factory=dict)  # pool -> class key -> units


def solve(d: Decision, objective: str = "min_cost", *, euro_per_hour: float | None = None,
          time_limit: float = 5.0) -> Solution:
    """The MILP of ``d`` (see the module's docstring); ``euro_per_hour``: the €/h budget of ``max_units``."""
    import highspy  # the bench extra: imported here only

    t0 = time.perf_counter()
    inp = d.inp
    prices = inp.rate_card.prices if inp.rate_card else {}
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.setOptionValue("threads", 1)
    ncols = 0
    integer: list[int] = []

    def col(cost: float, ub: float) -> int:
        nonlocal ncols
        h.addCol(cost, 0.0, ub, 0, [], [])
        integer.append(ncols)
        ncols += 1
        return ncols - 1

    rows: list[tuple[float, float, list[int], list[float]]] = []
    seg_cols: list[tuple[Segment, int]] = []
    by_class: dict[str, list[int]] = {c.key: [] for c in d.classes}
    maximise = objective == "max_units"
    place = objective == "place"  # the planner's: most units, then least cost
    weight = 1.0 + max((prices[s.pool] * risk(inp, s.pool) for s in d.segments), default=0.0)
    placements: list[tuple[str, str, int]] = []  # (pool, class key, column)
    for s in d.segments:
        pool = inp.pools[s.pool]
        price = prices[s.pool]
        cost = 1e-6 * price if maximise else price * risk(inp, s.pool)
        n = col(cost, s.nodes)
        seg_cols.append((s, n))
        xs: list[tuple[DemandClass, int]] = []
        for c in d.classes:
            if s.pool in c.pools and c.expected_seconds <= s.window:
                x = col(-1.0 if maximise else (-weight if place else 0.0), d.left[c.key])
                xs.append((c, x))
                by_class[c.key].append(x)
                placements.append((s.pool, c.key, x))
        if not xs:
            continue
        sh = pool.shape
        if place:  # the node-fraction restriction: what the nodes launched can hold
            rows.append((-INF, 0.0, [x for _, x in xs] + [n],
                         [1.0 / max(1, c.shape.count_in(sh)) for c, _ in xs] + [-1.0]))
        for attr, cap in (("vcpu", sh.vcpu), ("ram_mb", sh.ram_mb), ("gpus", sh.gpus)):
            idx = [x for c, x in xs if getattr(c.shape, attr)]
            if idx:
                rows.append((-INF, 0.0, idx + [n], [float(getattr(c.shape, attr)) for c, x in xs
                                                    if getattr(c.shape, attr)] + [-float(cap)]))
    for c in d.classes:
        idx = by_class[c.key]
        lo = float(d.placed.get(c.key, 0)) if objective == "min_cost" else 0.0
        if lo > 0 and not idx:
            return Solution("infeasible", INF, False, time.perf_counter() - t0)
        if idx:
            rows.append((lo, float(d.left[c.key]), idx, [1.0] * len(idx)))
    ns = [n for _, n in seg_cols]
    q = inp.quota
    shapes = [inp.pools[s.pool].shape for s, _ in seg_cols]
    if ns:
        tokens = d.tokens_launch if place else d.tokens
        rows.append((-INF, float(min(inp.policy.max_launches_per_pass, tokens)), ns, [1.0] * len(ns)))
        if q.instances is not None:
            rows.append((-INF, float(q.instances), ns, [1.0] * len(ns)))
        if q.vcpu is not None:
            rows.append((-INF, float(q.vcpu), ns, [float(sh.vcpu) for sh in shapes]))
        if q.ram_mb is not None:
            rows.append((-INF, float(q.ram_mb), ns, [float(sh.ram_mb) for sh in shapes]))
        euro = [float(prices[s.pool]) for s, _ in seg_cols]
        if d.spend_left is not None:
            rows.append((-INF, d.spend_left + 1e-9, ns, euro))
        if maximise and euro_per_hour is not None:
            rows.append((-INF, euro_per_hour + 1e-9, ns, euro))
    for lo, hi, idx, val in rows:
        h.addRow(lo, hi, len(idx), idx, val)
    if integer:
        h.changeColsIntegrality(len(integer), integer, [highspy.HighsVarType.kInteger] * len(integer))
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    secs = time.perf_counter() - t0
    if status == "Infeasible":
        return Solution("infeasible", INF, False, secs)
    exact = status == "Optimal"
    sol = h.getSolution().col_value if ncols else []
    units = int(round(sum(sol[x] for xs in by_class.values() for x in xs))) if ncols else 0
    cost = sum(sol[n] * prices[s.pool] for s, n in seg_cols) if ncols else 0.0
    if place:
        nodes: dict[str, int] = {}
        for s, n in seg_cols:
            k = int(round(sol[n]))
            if k:
                nodes[s.pool] = nodes.get(s.pool, 0) + k
        placed: dict[str, dict[str, int]] = {}
        for pool_name, key, x in placements:
            k = int(round(sol[x]))
            if k:
                placed.setdefault(pool_name, {})[key] = placed.get(pool_name, {}).get(key, 0) + k
        return Solution(status, float(units), exact, secs, units, cost, nodes, placed)
    if maximise:
        # the objective is −units + a tie-break: its dual bound bounds the units from above
        bound = float(units) if exact else -float(info.mip_dual_bound)
        return Solution(status, bound, exact, secs, units, cost)
    value = float(info.objective_function_value) if exact else float(info.mip_dual_bound)
    if not ncols:
        value = 0.0
    return Solution(status, value, exact, secs, units, cost)


def plan(inp: PlanInput, time_limit: float = 2.0) -> Plan:
    """The MILP as a planner: spotctl's plan for ``inp`` (housekeeping, protection, scale-down as it decides
    them) with its launches replaced by those of the ``place`` MILP (the most units, then the least cost)."""
    base = spotctl_plan(inp)
    d = decision(inp)
    keep = [a for a in base.actions if a.kind is not ActionKind.LAUNCH]
    launches: list[Action] = []
    if d.classes and d.segments:
        sol = solve(d, "place", time_limit=time_limit)
        prices = inp.rate_card.prices if inp.rate_card else {}
        kinds = {c.key: c.scheduler for c in d.classes}
        for pool_name, count in sorted(sol.nodes.items()):
            got = sol.placed.get(pool_name, {})
            replacement = any(kinds.get(k) == REPLACEMENT for k in got)
            units = sum(got.values())
            launches.append(Action(
                id="", kind=ActionKind.LAUNCH, priority=Priority.REPLACEMENT if replacement else Priority.LAUNCH,
                reason=f"MILP reference: {units} units on {count} × {pool_name} at {prices[pool_name]:.4f}/node-hour",
                pool=pool_name, count=count, units=units, price=prices[pool_name],
                inputs={"milp_status": sol.status}))
    ordered = sorted(enumerate(keep + launches), key=lambda ia: (ia[1].priority, ia[0]))
    actions = tuple(replace(a, id=f"{base.id}-{i:03d}") for i, (_, a) in enumerate(ordered))
    return replace(base, actions=actions)
