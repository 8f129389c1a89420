"""What the planner's steps share while one plan is made.

:func:`spotctl.core.planner.plan` runs its sub-planners in order over one :class:`PlanState`; each
reads what the earlier ones decided (which nodes are leaving, what demand is left, which tokens
are spent) and adds its own actions and explanations. Nothing else is shared between them.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, eq, gt, itemgetter
from typing import Any, Callable

from .actions import Action
from .budget import Bucket, Priority
from .capacity import calendar_id
from .models import ActionKind, Shape
from .plan_classes import INF, ClassList
from .plan_digest import pool_sets
from .plan_input import REPLACEMENT, DemandClass, NodeView, PlanInput


@dataclass
class PlanState:
    inp: PlanInput
    plan_id: str
    prices: dict[str, float]  # pool -> price per node-hour (empty without a rate card)
    base_inputs: dict[str, Any]  # in every action's inputs: rate-card version, calendar id, budget tokens
    bucket: Bucket  # the token budget as this plan spends it: higher classes are planned first
    actions: list[Action] = field(default_factory=list)  # in the order decided (sorted by priority at the end)
    explain: list[str] = field(default_factory=list)
    # housekeeping ->
    leaving: set[str] = field(default_factory=set)  # nodes on their way out: no new work, no scale-down, no spend
    to_replace: list[NodeView] = field(default_factory=list)  # nodes whose running work needs capacity elsewhere
    demand: list[DemandClass] = field(default_factory=list)  # pending demand, then replacement demand
    remaining: dict[str, int] = field(default_factory=dict)  # demand class key -> units not placed yet
    # fill existing nodes ->
    used_nodes: set[str] = field(default_factory=set)  # our nodes that this plan puts work on
    at_risk: set[str] = field(default_factory=set)  # new nodes landed on a soon-reserved host, closed to all work
    covered: int = 0  # units placed on our existing nodes
    # pack new nodes ->
    unplaced: dict[str, int] = field(default_factory=dict)  # reason -> units that no node takes
    demand_index: DemandIndex | None = None  # the demand by pool set, made once the demand is complete
    launches: Any = None  # plan_demand.Launches: what the plan may still launch, once pack_new has run

    def index(self) -> DemandIndex:
        """The demand by pool set (:class:`DemandIndex`), made on first use after housekeeping."""
        if self.demand_index is None:
            n = len(self.inp.demand)
            prefix = self.inp.demand_sets if self.demand[:n] == list(self.inp.demand) else None
            self.demand_index = DemandIndex(self.demand, self.remaining, {k: p.shape for k, p in self.inp.pools.items()},
                                            pool_sets(self.demand, prefix))
        return self.demand_index

    @classmethod
    def start(cls, inp: PlanInput) -> PlanState:
        rc = inp.rate_card
        return cls(
            inp=inp, plan_id=inp.digest()[:12], prices=dict(rc.prices) if rc else {},
            base_inputs={"rate_card_version": rc.version if rc else None, "calendar_id": calendar_id(inp.calendars),
                         "budget_tokens": round(inp.budget.refill(inp.now).tokens, 3)},
            bucket=inp.budget.refill(inp.now), demand=list(inp.demand),
            remaining={d.key: d.count for d in inp.demand},
        )

    @property
    def now(self) -> float:
        return self.inp.now

    def add(self, kind: ActionKind, priority: Priority, reason: str, **kw: Any) -> Action:
        """Add an action; its inputs are the plan's base inputs and what ``inputs=`` adds."""
        a = Action(id=f"{self.plan_id}-{len(self.actions):03d}", kind=kind, priority=priority, reason=reason,
                   inputs={**self.base_inputs, **kw.pop("inputs", {})}, **kw)
        self.actions.append(a)
        return a

    def tokens(self, priority: Priority, n: int) -> int:
        """Take up to ``n`` tokens of the class ``priority`` from the plan's budget; how many were granted."""
        self.bucket, granted = self.bucket.take(n, priority, self.now)
        return granted

    def add_demand(self, d: DemandClass) -> None:
        self.demand.append(d)
        self.remaining[d.key] = d.count
        self.demand_index = None


def _columns(demand: list[DemandClass]) -> list[list[Any]]:
    """Each class's scheduler, key, vCPU, RAM, GPUs and duration, as six lists. (Comprehensions: CPython's
    specialised attribute loads make them faster than ``attrgetter``, which takes the generic path.)"""
    shapes = [d.shape for d in demand]
    return [[d.scheduler for d in demand], [d.key for d in demand], [s.vcpu for s in shapes],
            [s.ram_mb for s in shapes], [s.gpus for s in shapes], [d.expected_seconds for d in demand]]


def _picker(at: list[int]) -> Callable[[list[Any]], list[Any]]:
    """``a -> [a[p] for p in at]``, in C."""
    if len(at) > 1:
        get = itemgetter(*at)
        return lambda a: list(get(a))
    return lambda a: [a[p] for p in at]


class DemandIndex:
    """The plan's demand by pool set. Each distinct set of pools (and round: replacement demand or not) is
    one *set*; a set contained in a larger one shares that one's :class:`ClassList` (so a pool asks few
    lists: the classes of one binding differ only by which of its pools their shape fits, and a class a pool
    does not serve is skipped on a membership test). Classes share their pools tuple (``build_input`` interns
    them): the index costs one entry per class and one per pool of each distinct set, not one per class and
    pool."""

    def __init__(self, demand: list[DemandClass], remaining: dict[str, int], shapes: dict[str, Shape],
                 base: tuple[list[tuple[str, ...]], list[int]] | None = None) -> None:
        base_sets, of_class = base if base is not None else pool_sets(demand)
        # a set per pool set of the pending demand (same numbering), then one per pool set of replacement demand
        nb = len(base_sets)
        self.sets: list[frozenset[str]] = [frozenset(t) for t in base_sets]
        self.replacement: list[bool] = [False] * nb
        self.set_of_pos: list[int] = list(of_class)  # per class (in the plan's order): its set
        # each class's fields, read once: for the sets and for every list
        scheds, keys, *dims = _columns(demand)
        extra: dict[int, int] = {}
        for pos in compress(range(len(demand)), map(eq, scheds, repeat(REPLACEMENT))):
            i = of_class[pos]
            if i not in extra:
                extra[i] = len(self.sets)
                self.sets.append(self.sets[i])
                self.replacement.append(True)
            self.set_of_pos[pos] = extra[i]
        members: list[list[int]] = [[] for _ in self.sets]  # per set: its classes' positions, in order
        by_set, start = sorted(range(len(demand)), key=self.set_of_pos.__getitem__), 0  # (a stable sort, in C)
        for sid, k in sorted(Counter(self.set_of_pos).items()):
            members[sid], start = by_set[start:start + k], start + k
        alive = list(map(gt, map(remaining.get, keys, repeat(0)), repeat(0)))
        self._dims, self._alive = dims, alive  # for each list: its classes' vCPU, RAM, GPUs and duration; units left?
        self.set_live: list[int] = [0] * len(self.sets)  # per set: its classes with units left
        for sid, n in Counter(compress(self.set_of_pos, alive)).items():
            self.set_live[sid] = n
        list_of, by_pool, n_lists = self._group(demand, members, shapes)
        merged: list[list[int]] = [[] for _ in range(n_lists)]
        for sid, m in enumerate(members):
            merged[list_of[sid]].extend(m)
        for m in merged:
            m.sort()
        self._merged, self._demand, self._remaining = merged, demand, remaining
        self.lists: list[ClassList | None] = [None] * n_lists  # made when first asked
        self.sid_of: list[list[int]] = [[] for _ in merged]  # per list: each class's set
        self.loc: dict[str, tuple[int, int]] = {}  # class key -> (list, position): the classes last filled
        self.of_pool: dict[str, list[int]] = {}  # pool -> the lists to ask (any round)
        self.of_pool_round = by_pool  # (replacement?, pool) -> the lists to ask in that round
        for (_, name), lis in by_pool.items():
            self.of_pool.setdefault(name, []).extend(lis)
        self.sets_of: dict[tuple[bool, str], list[int]] = {}  # (replacement?, pool) -> the sets that contain it
        for sid, fs in enumerate(self.sets):
            for name in fs:
                self.sets_of.setdefault((self.replacement[sid], name), []).append(sid)

    def _group(self, demand: list[DemandClass], members: list[list[int]], shapes: dict[str, Shape],
               ) -> tuple[list[int], dict[tuple[bool, str], list[int]], int]:
        """Which list each set joins; the lists each (round, pool) asks; how many lists. A set joins the list
        of a larger set of its round that contains it when none of its classes (a sample of 16) fits a
        pool of that set that it lacks (as with the sets of one binding); replacement demand (one class per
        node to replace) shares a list with the sets it overlaps. A class put in a list whose pools do not all serve it is only
        skipped (a membership test), so this decides the cost, never the result."""
        roots: list[int] = []
        by_shape: list[dict[Shape, frozenset[str]]] = []  # per list: its root's pools by shape
        list_of: list[int] = [0] * len(self.sets)
        by_pool: dict[tuple[bool, str], list[int]] = {}
        for sid in sorted(range(len(self.sets)), key=lambda k: (-len(self.sets[k]), k)):
            fs, rnd = self.sets[sid], self.replacement[sid]
            if rnd:  # replacement demand: sets that share a pool share a list (one per pool kind, in effect)
                li = next((lis[0] for name in fs if (lis := by_pool.get((True, name)))), None)
                if li is None:
                    li = len(roots)
                    roots.append(sid)
                    by_shape.append({})
                list_of[sid] = li
                for name in fs:
                    lis = by_pool.setdefault((rnd, name), [])
                    if li not in lis:
                        lis.append(li)
                continue
            m = members[sid]
            sample = [demand[m[k * len(m) // 16]].shape for k in range(min(16, len(m)))]
            some = next(iter(fs), None)
            for li in by_pool.get((rnd, some), []) if some is not None else []:
                if fs <= self.sets[roots[li]] and not any(
                        c.fits_in(sh) for sh, names in by_shape[li].items() if not names <= fs for c in sample):
                    list_of[sid] = li
                    break
            else:
                list_of[sid] = len(roots)
                for name in fs:
                    by_pool.setdefault((rnd, name), []).append(len(roots))
                groups: dict[Shape, set[str]] = {}
                for name in fs:
                    if name in shapes:
                        groups.setdefault(shapes[name], set()).add(name)
                by_shape.append({sh: frozenset(names) for sh, names in groups.items()})
                roots.append(sid)
        return list_of, by_pool, len(roots)


    def has_demand(self, pool: str, replacement: bool | None = None) -> bool:
        """Whether some class ``pool`` serves (of that round; None: either) has units left."""
        live = self.set_live
        rounds = (False, True) if replacement is None else (replacement,)
        return any(live[s] > 0 for rnd in rounds for s in self.sets_of.get((rnd, pool), ()))

    def placed(self, key: str, remaining: dict[str, int]) -> None:
        """Units of ``key`` were placed: once none is left, the class is never found again."""
        if remaining[key] <= 0:
            li, j = self.loc[key]
            self._kill(li, j)

    def _make(self, li: int) -> ClassList:
        m = self._merged[li]
        pick = _picker(m)  # (its classes' units left as when the index was made: only the index places them)
        cl = self.lists[li] = ClassList(pick(self._demand), m, self._remaining, [pick(a) for a in self._dims],
                                        pick(self._alive))
        self.sid_of[li] = pick(self.set_of_pos)
        return cl

    def _kill(self, li: int, j: int) -> None:
        cl = self.lists[li] or self._make(li)
        if cl.alive[j]:
            self.set_live[self.sid_of[li][j]] -= 1
            cl.kill(j)

    def fill(self, pool: str, lids: list[int], room: Shape, remaining: dict[str, int],
             window: float | None) -> dict[str, int]:
        """What :func:`~spotctl.core.plan_demand.fill_room` returns for the classes ``pool`` serves in the
        lists ``lids``, in the plan's order: the lists merged, each asked only for its first class that fits."""
        v, r, g = room.vcpu, room.ram_mb, room.gpus
        w = INF if window is None else window
        heap: list[tuple[int, int, int, ClassList]] = []  # (the class's place in the plan's order, list, j, list)
        lists, first = self.lists, self._first
        for li in lids:
            cl = lists[li] or self._make(li)
            fv, fr, fg, fe = cl.floor  # (nothing left there fits: not asked)
            if cl.live <= 0 or fv > v or fr > r or fg > g or fe > w:
                continue
            j = first(pool, li, cl, 0, v, r, g, w, remaining)
            if j < len(cl.classes):
                heap.append((cl.order[j], li, j, cl))  # (orders are distinct: the tuples never compare further)
        pattern: dict[str, int] = {}
        if not heap:
            return pattern
        heapq.heapify(heap)
        loc = self.loc
        while heap:
            _, li, j, cl = heap[0]
            dv, dr, dg, de = cl.dims
            if dv[j] <= v and dr[j] <= r and dg[j] <= g and de[j] <= w:
                d = cl.classes[j]
                key, s = d.key, d.shape
                sv, sr, sg = s.vcpu, s.ram_mb, s.gpus
                k = remaining[key]  # as many as fit (Shape.count_in: the room is never negative here)
                if sv:
                    k = min(k, v // sv)
                if sr:
                    k = min(k, r // sr)
                if sg:
                    k = min(k, g // sg)
                pattern[key] = k
                loc[key] = li, j
                v, r, g = v - sv * k, r - sr * k, g - sg * k
            fv, fr, fg, fe = cl.floor
            if fv > v or fr > r or fg > g or fe > w:  # the room is below all that is left in the list
                heapq.heappop(heap)
                continue
            j = first(pool, li, cl, j + 1, v, r, g, w, remaining)  # (the room shrank since it was found)
            if j < len(cl.classes):
                heapq.heapreplace(heap, (cl.order[j], li, j, cl))
            else:
                heapq.heappop(heap)
        return pattern

    def _first(self, pool: str, li: int, cl: ClassList, i: int, v: int, r: int, g: int, w: float,
               remaining: dict[str, int]) -> int:
        """The first class of list ``li`` (``cl``) from ``i`` on that ``pool`` serves, fits and has units left.
        A hint per room (the first class that fits it) skips what was found not to fit before: rooms only
        shrink and classes only empty. The class at the start is tried before the blocks are searched (the
        next class in the plan's order is often of a shape close to the last one's)."""
        classes = cl.classes
        n = len(classes)
        hints = cl.hints
        hint_key = (v, r, g, w)
        hint = hints.get(hint_key, 0)
        if i > hint:
            j, first = i, False
        else:
            j, first = hint, True
        dv, dr, dg, de = cl.dims
        sets, sid_of = self.sets, self.sid_of[li]
        while True:
            if j >= n or not (dv[j] <= v and dr[j] <= r and dg[j] <= g and de[j] <= w):
                j = cl.first_fit(j, v, r, g, w)
                if j >= n:
                    break
            if remaining.get(classes[j].key, 0) <= 0:  # emptied outside the index
                self._kill(li, j)
                continue
            if first:
                hints[hint_key] = j
                first = False
            if pool in sets[sid_of[j]]:
                return j
            j += 1
        if first:
            hints[hint_key] = n
        return n
