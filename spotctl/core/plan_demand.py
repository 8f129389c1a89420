"""The planner's demand steps: fill free room on our nodes, then pack the rest into new nodes.

:func:`fill_existing` places pending units on our own nodes that take work (building or active,
not cordoned, not leaving), node shape by node shape. :func:`pack_new` packs what is left into new
nodes of the cheapest, least risky pool whose forward calendar leaves time for the work to finish
and drain, replacement demand first; within headroom (host by host), pool limits, quota, spend cap,
launches per pass and the token budget. What no node takes is counted by reason.

The explanations they write use the tables' forms (:mod:`~spotctl.core.textfmt`): shapes
``8 vCPU/32 GiB``, times ``2026-12-01 18:14:46Z``, durations ``3h05m``, prices to 4 decimals with
their currency.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, NamedTuple

from .budget import Priority
from .capacity import Calendar
from .models import ActionKind, NodeState, PoolKind, PoolSpec, Shape
from .notices import calendar_advisory_due, node_protection
from .plan_classes import INF
from .plan_input import DemandClass, PlanInput
from .plan_state import PlanState
from .textfmt import duration_text, shape_text, when_text
from .timefmt import iso

#: The states of a node that new work may be planned onto (when it is not cordoned and not leaving).
TAKES_WORK = (NodeState.BUILDING, NodeState.ACTIVE, NodeState.INTENDED)
#: Demand classes left unplaced that the plan's explanation names one by one (in the plan's order: the
#: highest priority, longest and largest first); the rest are summed up in one line. Every unit is counted by
#: reason in the plan's ``unplaced`` whatever the number.
EXPLAIN_UNPLACED = 100


def unplaced_examples(d: DemandClass, left: int) -> tuple[str, ...]:
    """The example ids of the ``left`` units of ``d`` that no node takes. Units of one class are
    interchangeable; the schedulers start them in id order (oldest first), so the placed ones are the
    first ``count - left`` and the unplaced the rest: only those kept as examples can be named."""
    return d.examples[max(0, d.count - left):]


def fill_existing(st: PlanState) -> None:
    """Free room on our own nodes that will take work, used before any launch. Nodes of one pool with
    the same room and run-time window are filled alike, so that a large fleet costs one fill each."""
    inp, now, remaining = st.inp, st.now, st.remaining
    pools, reclaims, leaving, at_risk, policy = inp.pools, inp.host_reclaims, st.leaving, st.at_risk, inp.policy
    groups: dict[tuple[str, int, int, int, float], list[str]] = {}  # (pool, room, window: INF none) -> nodes
    for n in inp.nodes:
        if n.cordoned or n.state not in TAKES_WORK or n.id in leaving or n.id in at_risk:
            continue  # at risk: landed on a soon-reserved host, its work is re-planned (hostaware)
        pool = pools.get(n.pool)
        if pool is None:
            v = r = g = 0
        else:
            s, u = pool.shape, n.used
            v, r, g = max(0, s.vcpu - u.vcpu), max(0, s.ram_mb - u.ram_mb), max(0, s.gpus - u.gpus)
        window = INF
        if n.host and n.host in reclaims:
            # a node whose host a reservation takes serves only work that ends in time (the same window
            # its schedulers are told: node_protection)
            until, _ = node_protection(reclaims[n.host], now, policy, 0)
            if until is not None:
                window = until - now
                if window <= 0:
                    continue
        groups.setdefault((n.pool, v, r, g, window), []).append(n.id)
    index = st.index()
    for (pool_name, v, r, g, w), ids in sorted(groups.items()):  # (keys are distinct: lists never compared)
        room, until = Shape(v, r, g), None if w == INF else w
        lids = index.of_pool.get(pool_name, [])
        left = len(ids)
        idx = 0
        while left > 0:
            pattern = index.fill(pool_name, lids, room, remaining, until)
            if not pattern:
                break
            reps = min([left] + [remaining[k] // c for k, c in pattern.items()])
            for k, c in pattern.items():
                remaining[k] -= c * reps
                st.covered += c * reps
                index.placed(k, remaining)
            st.used_nodes.update(ids[idx: idx + reps])
            idx += reps
            left -= reps


def pool_risk(advisories: int, reclaims: int) -> float:
    """What a pool's price is inflated by for its risk: a quarter per active advisory and per recent reclaim."""
    return 1.0 + 0.25 * advisories + 0.25 * reclaims


def pool_score(pool: PoolSpec, price: float, advisories: int, reclaims: int) -> float:
    """Price per vCPU-hour, inflated by risk (advisories, recent reclaims)."""
    return price / max(pool.shape.vcpu, 1) * pool_risk(advisories, reclaims)


def nodes_by_pool(inp: PlanInput) -> dict[str, int]:
    """Our nodes per pool (every one, leaving or not: they count against the pool's limit)."""
    out: dict[str, int] = {}
    for n in inp.nodes:
        out[n.pool] = out.get(n.pool, 0) + 1
    return out


@dataclass
class Launches:
    """What the plan may still launch, across pools and priority rounds."""

    spend: float  # per hour: our nodes that stay, and the launches planned so far
    room: int  # launches left in this pass
    quota_inst: int | None
    quota_vcpu: int | None
    quota_ram: int | None
    existing: dict[str, int]  # pool -> our nodes
    classes: dict[str, DemandClass]  # demand class key -> the class
    planned: dict[str, int] = field(default_factory=dict)  # pool -> nodes launched by this plan so far
    budget_out: bool = False
    block: dict[str, str] = field(default_factory=dict)  # demand class key -> last reason it could not be placed

    def held(self, st: PlanState, name: str, pool: PoolSpec, price: float, launched: int, free: int,
             limit_left: int, tokens: bool = True) -> str | None:
        """Why one more node of ``pool`` may not be launched (None: it may); ``tokens`` False: the token budget is
        the caller's to check (in its own priority class)."""
        policy, cap = st.inp.policy, st.inp.policy.spend_cap_per_hour
        if launched >= free:
            return f"no headroom left in {name}"
        if launched >= limit_left:
            return f"pool {name} at its limit of {pool.max_nodes} nodes"
        if tokens and self.budget_out:
            return "token budget exhausted for this pass"
        if self.room <= 0:
            return f"at most {policy.max_launches_per_pass} launches per pass"
        if self.quota_inst is not None and self.quota_inst <= 0:
            return "spot project quota (instances) exhausted"
        if self.quota_vcpu is not None and self.quota_vcpu < pool.shape.vcpu:
            return "spot project quota (vCPU) exhausted"
        if self.quota_ram is not None and self.quota_ram < pool.shape.ram_mb:
            return "spot project quota (RAM) exhausted"
        if cap is not None and self.spend + price > cap + 1e-9:
            return f"spend cap {cap}/h reached"
        return None

    def bound(self, reps: int, pool: PoolSpec, price: float, cap: float | None) -> int:
        """``reps`` nodes of ``pool``, bounded by quota and the spend cap."""
        if self.quota_inst is not None:
            reps = min(reps, self.quota_inst)
        if self.quota_vcpu is not None:
            reps = min(reps, self.quota_vcpu // max(pool.shape.vcpu, 1))
        if self.quota_ram is not None:
            reps = min(reps, self.quota_ram // max(pool.shape.ram_mb, 1))
        if cap is not None:
            reps = min(reps, int((cap - self.spend + 1e-9) // price) if price > 0 else reps)
        return reps

    def one_more(self, st: PlanState, name: str, pool: PoolSpec, price: float) -> str | None:
        """Why one node of ``pool`` more than this plan launches already may not be launched (None: it may); the
        token budget is left to the caller (consolidation, in its own class)."""
        hr = st.inp.headroom.get(name)
        planned = self.planned.get(name, 0)
        return self.held(st, name, pool, price, 0, (hr.free if hr else 0) - planned,
                         pool.max_nodes - self.existing.get(name, 0) - planned, tokens=False)

    def take_one(self, name: str, pool: PoolSpec, price: float) -> None:
        """One node of ``pool`` more is launched by this plan."""
        self.take(1, pool, price)
        self.planned[name] = self.planned.get(name, 0) + 1

    def rank(self, name: str) -> int:
        """The number in its pool of the next node launched there (ours, those planned, and it)."""
        return self.existing.get(name, 0) + self.planned.get(name, 0) + 1

    def take(self, reps: int, pool: PoolSpec, price: float) -> None:
        self.room -= reps
        self.spend += price * reps
        if self.quota_inst is not None:
            self.quota_inst -= reps
        if self.quota_vcpu is not None:
            self.quota_vcpu -= pool.shape.vcpu * reps
        if self.quota_ram is not None:
            self.quota_ram -= pool.shape.ram_mb * reps


def pack_new(st: PlanState) -> None:
    """Pack the demand left into new nodes: replacement capacity in a first round, pending units in a second;
    then count what no node takes, by reason. Within a round, each batch of identical new nodes goes to the pool
    whose next node costs the least for what it packs (:class:`PoolPack`: its price, inflated by risk, over the
    worth of the units a node of it takes now; under a spend cap, over their number), so that RAM-bound work goes
    to RAM-rich pools and a spend cap buys the most units; pools are asked again as the demand left changes (a
    lazy greedy: a pool's cost only rises as its demand is taken)."""
    inp, prices = st.inp, st.prices
    ls = Launches(spend=sum(prices.get(n.pool, n.price) for n in inp.nodes if n.id not in st.leaving),
                  room=inp.policy.max_launches_per_pass, quota_inst=inp.quota.instances,
                  quota_vcpu=inp.quota.vcpu, quota_ram=inp.quota.ram_mb, existing=nodes_by_pool(inp),
                  classes={d.key: d for d in st.demand})
    pool_order = sorted((pool_score(pool, prices[name], inp.advisories.get(name, 0),
                                    inp.recent_reclaims.get(name, 0)), name)
                        for name, pool in inp.pools.items() if prices.get(name) is not None)
    if inp.rate_card is None:
        for d in st.demand:
            if st.remaining[d.key]:
                ls.block[d.key] = "rate card unavailable: no launches without prices"
        st.explain.append("rate card unavailable: launches are held until prices are known")
        pool_order = []
    # what a node is worth: the units it packs at the cheapest resource prices; under a spend cap, their number
    worth = unit_worth(st, [name for _, name in pool_order]) if inp.policy.spend_cap_per_hour is None else None
    # Each pool's packing ends for one reason, given to every class it could have taken that is left
    # (or, for a calendar too close, to those longer than its window): kept per pool, not per class
    index = st.index()
    ends: dict[tuple[bool, str], tuple[int, str, float | None]] = {}  # (round, pool) -> (order, reason, window)
    for rnd, priority in ((True, Priority.REPLACEMENT), (False, Priority.LAUNCH)):
        pack_round(st, ls, priority, rnd, pool_order, worth, ends)
    st.launches = ls  # what the plan may still launch: consolidation's moves take from it
    last: dict[int, list[tuple[int, str, float | None]]] = {}  # pool set -> its pools' ends, last first
    remaining, set_of_pos, unplaced, explain = st.remaining, index.set_of_pos, st.unplaced, st.explain
    told = 0  # classes left unplaced explained one by one (the first EXPLAIN_UNPLACED, in the plan's order)
    demand = st.demand
    lefts = [remaining[d.key] for d in demand]
    for pos in compress(range(len(demand)), lefts):  # (the classes with units left: most are placed)
        d, left = demand[pos], lefts[pos]
        if d.pools:
            sid = set_of_pos[pos]
            ends_of = last.get(sid)
            if ends_of is None:
                rnd = index.replacement[sid]
                ends_of = last[sid] = sorted((ends[(rnd, p)] for p in d.pools if (rnd, p) in ends), reverse=True)
            reason = ls.block.get(d.key, "no pool could take it")
            for _, why, window in ends_of:
                if window is None:
                    reason = why
                    break
                if d.expected_seconds > window:
                    reason = f"{why}{duration_text(d.expected_seconds)} of work + drain"
                    break
        else:
            reason = "no pool serves it (scheduler binding or node shape)"
        unplaced[reason] = unplaced.get(reason, 0) + left
        told += 1
        if told > EXPLAIN_UNPLACED:
            continue
        examples = unplaced_examples(d, left)
        placed = f" ({d.count - left} of the {d.count} placed)" if left < d.count else ""
        explain.append(f"{d.scheduler} {shape_text(d.shape)} ×{left} unplaced{placed}: {reason}"
                       + (f" (e.g. {', '.join(examples[:3])})" if examples else ""))
    if told > EXPLAIN_UNPLACED:
        explain.append(f"… and {told - EXPLAIN_UNPLACED} more demand classes unplaced, not listed one by one (the "
                       f"first {EXPLAIN_UNPLACED} are above; every unit is counted by reason in the plan's "
                       f"unplaced: {sum(unplaced.values())} in all)")


def unit_worth(st: PlanState, pools: list[str]) -> tuple[float, float, float]:
    """What a vCPU, a MiB of RAM and a GPU cost per hour at the cheapest per-resource price among ``pools``. A
    unit's worth is its dominant resource at those prices (:meth:`PoolPack.cost`), the same whichever pool
    takes it, so that pools of different shapes compare by what a node packs for its price, not by vCPU alone."""
    pv = pr = pg = INF
    for name in pools:
        shape, price = st.inp.pools[name].shape, st.prices[name]
        if shape.vcpu:
            pv = min(pv, price / shape.vcpu)
        if shape.ram_mb:
            pr = min(pr, price / shape.ram_mb)
        if shape.gpus:
            pg = min(pg, price / shape.gpus)
    return (0.0 if pv == INF else pv), (0.0 if pr == INF else pr), (0.0 if pg == INF else pg)


@dataclass
class PoolPack:
    """One pool's new nodes in one round, batch by batch (a batch: identical nodes of one packing pattern and
    calendar window), and the next batch it would launch."""

    name: str
    pool: PoolSpec
    price: float
    score: float  # price per vCPU-hour x risk (pool_score)
    risk: float
    free: int  # new nodes that fit now, less those planned earlier in this plan
    existing: int  # our nodes, and those planned earlier in this plan
    limit_left: int
    lids: list[int]
    launched: int = 0
    units: int = 0
    segments: list[list[Any]] = field(default_factory=list)  # [nodes, safe_until, longest unit seconds] per batch
    placed: set[str] = field(default_factory=set)  # the demand classes these nodes take units of
    earliest_safe: float | None = None
    first: int = 0  # when its first batch was taken (decision order)

    def cost(self, pattern: dict[str, int], classes: dict[str, DemandClass],
             worth: tuple[float, float, float] | None) -> float:
        """The node's price, inflated by risk, per unit of worth it packs (lower is better; 1.0: a node as
        cheap as the cheapest resource prices and full); ``worth`` None (a spend cap is set: the money is what
        runs out, and the cap should buy the most units), per unit it packs."""
        if worth is None:
            return self.price * self.risk / max(1, sum(pattern.values()))
        pv, pr, pg = worth
        value = 0.0
        for k, c in pattern.items():
            s = classes[k].shape
            value += c * max(s.vcpu * pv, s.ram_mb * pr, s.gpus * pg)
        return self.price * self.risk / value if value > 0 else INF


def pack_round(st: PlanState, ls: Launches, priority: Priority, rnd: bool, pool_order: list[tuple[float, str]],
               worth: tuple[float, float, float] | None,
               ends: dict[tuple[bool, str], tuple[int, str, float | None]]) -> None:
    """One round of launches (replacement capacity, or pending units): batch by batch to the pool whose next node
    costs least for what it packs, until no pool can take more; one launch action per pool that launches."""
    inp, now, index = st.inp, st.now, st.index()
    packs: dict[str, PoolPack] = {}
    heap: list[tuple[float, int, str]] = []
    for turn, (score, name) in enumerate(pool_order):
        if not index.has_demand(name, rnd):
            continue
        if inp.pool_failures.get(name, 0) > now:
            st.explain.append(f"{name}: skipped, launch failed recently")
            ends[(rnd, name)] = (len(ends), f"pool {name} failed to launch recently (skipped until "
                                            f"{iso(inp.pool_failures[name], sep=' ')})", None)
            continue
        pool = inp.pools[name]
        hr = inp.headroom.get(name)
        existing = ls.existing.get(name, 0) + ls.planned.get(name, 0)
        pk = packs[name] = PoolPack(
            name=name, pool=pool, price=st.prices[name], score=score,
            risk=pool_risk(inp.advisories.get(name, 0), inp.recent_reclaims.get(name, 0)),
            free=(hr.free if hr else 0) - ls.planned.get(name, 0), existing=existing,
            limit_left=max(0, pool.max_nodes - existing), lids=index.of_pool_round.get((rnd, name), []))
        heap.append((0.0, turn, name))  # every pool is asked once, in score order, before any batch is taken
    heapq.heapify(heap)
    order = 0
    while heap:
        _, turn, name = heapq.heappop(heap)
        pk = packs[name]
        nxt = next_batch(st, ls, pk)
        if not isinstance(nxt, Batch):
            ends[(rnd, name)] = (len(ends), *nxt)
            continue
        pattern, safe_until, n_total = nxt
        cost = pk.cost(pattern, ls.classes, worth)
        if heap and cost > heap[0][0] * (1 + 1e-9):
            heapq.heappush(heap, (cost, turn, name))  # another pool packs more for its price now: ask it first
            continue
        if not take_batch(st, ls, pk, priority, pattern, safe_until, n_total):
            ends[(rnd, name)] = (len(ends), "token budget exhausted for this pass", None)
            continue
        if pk.launched and not pk.first:
            order += 1
            pk.first = order
        heapq.heappush(heap, (cost, turn, name))
    for pk in sorted((p for p in packs.values() if p.launched), key=lambda p: p.first):
        launch_action(st, ls, priority, pk)


class Batch(NamedTuple):
    pattern: dict[str, int]  # class key -> units per node
    safe_until: float  # when the calendar may take the nodes' capacity back
    n_total: int  # the first node's number in the pool (ours, those planned, and these)


def next_batch(st: PlanState, ls: Launches, pk: PoolPack) -> Batch | tuple[str, float | None]:
    """The next batch ``pk`` would launch: (pattern, safe_until, the node's number in the pool), or why it can
    launch no more: (reason, window)."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    name, pool = pk.name, pk.pool
    why = ls.held(st, name, pool, pk.price, pk.launched, pk.free, pk.limit_left)
    if why:
        return why, None
    cal = inp.calendars.get(name)
    n_total = pk.existing + pk.launched + 1
    safe_until = cal.safe_until(n_total, now) if cal else now + 24 * 3600
    if cal and calendar_advisory_due(safe_until, now + pool.boot_seconds, policy):
        # the same rule that cordons a node ahead of a reservation: a node launched now would
        # be cordoned before it is up, and the work meant for it could never land there
        return (f"calendar: {name} takes capacity back at {when_text(safe_until, now)}; a node launched now "
                f"would be cordoned by the calendar advisory ({duration_text(policy.calendar_advisory_seconds)} "
                f"ahead) before it boots"), None
    window = safe_until - now - policy.drain_seconds - pool.boot_seconds
    if name in inp.no_notice_pools:
        window = min(window, policy.no_notice_max_seconds)
        if pool.kind is PoolKind.BAREMETAL:
            window = min(window, policy.no_notice_max_seconds / 2)
    pattern = st.index().fill(name, pk.lids, pool.shape, st.remaining, window)
    if not pattern:  # the work longer than the window is told so (see pack_new)
        return f"calendar: {name} takes capacity back at {when_text(safe_until, now)}, too soon for ", window
    return Batch(pattern, safe_until, n_total)


def take_batch(st: PlanState, ls: Launches, pk: PoolPack, priority: Priority, pattern: dict[str, int],
               safe_until: float, n_total: int) -> bool:
    """Launch identical nodes of ``pattern`` in ``pk``'s pool: as many as units, headroom, limits, quota, spend
    and the calendar's step allow. False: the token budget is out."""
    remaining, index, policy = st.remaining, st.index(), st.inp.policy
    cal = st.inp.calendars.get(pk.name)
    reps = min(remaining[k] // c for k, c in pattern.items())
    reps = min(reps, pk.free - pk.launched, pk.limit_left - pk.launched, ls.room)
    reps = ls.bound(reps, pk.pool, pk.price, policy.spend_cap_per_hour)
    if cal:
        reps = min(reps, same_window_count(cal, n_total, st.now))
    reps = max(reps, 1)
    granted = st.tokens(priority, reps)
    if granted <= 0:
        if not ls.budget_out:
            st.explain.append(f"{pk.name}: token budget exhausted")
        ls.budget_out = True
        return False
    reps = granted
    for k, c in pattern.items():
        remaining[k] -= c * reps
        pk.units += c * reps
        pk.placed.add(k)
        index.placed(k, remaining)
    pk.segments.append([reps, safe_until, max(ls.classes[k].expected_seconds for k in pattern)])
    pk.launched += reps
    ls.take(reps, pk.pool, pk.price)
    pk.earliest_safe = safe_until if pk.earliest_safe is None else min(pk.earliest_safe, safe_until)
    return True


def launch_action(st: PlanState, ls: Launches, priority: Priority, pk: PoolPack) -> None:
    """The one launch action of a pool's nodes in a round, and its explanation."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    name, pool, price, cal = pk.name, pk.pool, pk.price, inp.calendars.get(pk.name)
    ls.planned[name] = ls.planned.get(name, 0) + pk.launched
    per_hour = f"{price:.4f} {inp.rate_card.currency}/node-hour" if inp.rate_card else f"{price:.4f}/node-hour"
    what = ("replacement capacity for " + ", ".join(sorted({e for k in pk.placed for e in ls.classes[k].examples}))
            if priority is Priority.REPLACEMENT else f"{pk.units} pending units")
    earliest_safe = pk.earliest_safe
    st.add(ActionKind.LAUNCH, priority,
           f"{what}: {pk.launched} × {name} ({shape_text(pool.shape)}) at {per_hour}"
           + (f"; the calendar keeps the capacity until {when_text(earliest_safe, now)}"
              if earliest_safe and cal and earliest_safe < cal.end else ""),
           pool=name, count=pk.launched, units=pk.units, price=price,
           inputs={"safe_until": earliest_safe, "headroom": pk.free, "score": round(pk.score, 6),
                   "segments": pk.segments})
    st.explain.append(f"{name}: launch {pk.launched} node{'s' if pk.launched != 1 else ''} for {pk.units} units "
                      f"(score {pk.score:.4f}, {pk.free} new nodes fit now, {per_hour})")
    drop = next_drop(cal, now) if cal else None
    if drop is not None:
        at, before, after = drop
        st.explain.append(
            f"{name}: the calendar lowers its spot capacity from {before} to {after} nodes at {when_text(at, now)} "
            f"(a reservation starts on some of its hosts). The cloud picks each node's host: a node that lands on "
            f"one of those is advised (cordoned: no new work) by the provider's calendar notice or the calendar "
            f"advisory ({duration_text(policy.calendar_advisory_seconds)} ahead), and drained before the "
            f"reservation starts")


def next_drop(cal: Calendar, now: float) -> tuple[float, int, int] | None:
    """When the forward calendar next lowers the pool's spot capacity: (time, capacity before, after)."""
    now_cap = cal.capacity_at(now)
    for when, c in cal.steps:
        if when > now and c < now_cap:
            return when, now_cap, c
    return None


def fill_room(room: Shape, cands: list[DemandClass], remaining: dict[str, int],
              window: float | None) -> dict[str, int]:
    """Greedy fill of one node's room: class key -> units (in the plan's order: plan_input.demand_order); work
    longer than ``window`` (seconds, None: no limit) is left out."""
    pattern: dict[str, int] = {}
    for d in cands:
        left = remaining[d.key]
        if left <= 0 or (window is not None and d.expected_seconds > window):
            continue
        if not d.shape.fits_in(room):
            continue
        if d.shape == Shape():
            continue
        k = min(left, d.shape.count_in(room))
        if k <= 0:
            continue
        pattern[d.key] = k
        room = room - d.shape.times(k)
    return pattern


def same_window_count(cal: Calendar, n: int, now: float) -> int:
    """How many more nodes (from the n-th on) share the n-th node's safe window."""
    levels = sorted({c for _, c in cal.steps if c >= n})
    if not levels:
        return 1
    return max(1, levels[0] - n + 1)
