"""The demand classes of one pool set, indexed for the planner's first-fit question.

A :class:`ClassList` answers "the first class from position i on that fits this room and window" over
classes in the plan's order (plan_input.demand_order), skipping blocks whose minima cannot fit, and forgets a
class once its units are all placed. :class:`~spotctl.core.plan_state.DemandIndex` keeps one per set of
pools that serve the same classes.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, gt, not_

from .plan_input import DemandClass

INF = float("inf")
_B1, _B2, _B3 = 16, 256, 4096  # block sizes of the three levels of minima in a ClassList
_KEY = attrgetter("key")
_DIMS = tuple(attrgetter(f) for f in ("shape.vcpu", "shape.ram_mb", "shape.gpus", "expected_seconds"))


class ClassList:
    """The demand classes of one pool set (classes served by the same pools, in one round), in the plan's
    order, indexed for "the first class from position i that fits this room and window": minima of vCPU,
    RAM, GPUs and duration over blocks of 16, 256 and 4096 classes skip the blocks that cannot fit. A class
    whose units are all placed is never found again, nor one of an empty shape (it takes no room)."""

    __slots__ = ("alive", "classes", "dims", "flat", "floor", "hints", "live", "mins", "order")

    def __init__(self, classes: list[DemandClass], order: list[int], remaining: dict[str, int],
                 dims: list[list[float]] | None = None, alive: list[bool] | None = None) -> None:
        """``dims`` (this list's own, changed here) and ``alive``: the classes' vCPU, RAM, GPUs and duration
        and whether they have units left, when the caller has read them already (else read here, in C)."""
        self.classes = classes
        self.order = order  # each class's position in the plan's demand order
        if alive is None:
            alive = list(map(gt, map(remaining.get, map(_KEY, classes), repeat(0)), repeat(0)))
        self.alive = bytearray(alive)
        self.live = sum(self.alive)  # classes with units left (an empty shape included: it never fits)
        # a class with no units left or of an empty shape is never found
        dims = [list(map(f, classes)) for f in _DIMS] if dims is None else dims
        vc, rm, gp = dims[0], dims[1], dims[2]
        gone = list(compress(range(len(classes)), map(not_, self.alive)))
        gone += [j for j in compress(range(len(classes)), map(not_, vc)) if not rm[j] and not gp[j]]
        for j in gone:
            for a in dims:
                a[j] = INF
        self.dims = dims
        # each level's minima from the level below (a block of 256 is 16 blocks of 16)
        m1 = [_block_mins(a, _B1) for a in dims]
        m2 = [_block_mins(a, _B2 // _B1) for a in m1]
        self.mins = [m1, m2, [_block_mins(a, _B3 // _B2) for a in m2]]
        self.flat = (*m1, *m2, *self.mins[2])  # the same lists, for first_fit to unpack at once
        #: the least vCPU, RAM, GPUs and duration of any class with units left: a room below it fits none
        self.floor = [min(a, default=INF) for a in self.mins[2]]
        self.hints: dict[tuple[int, int, int, float], int] = {}  # room -> no class before it fits it

    def first_fit(self, i: int, v: int, r: int, g: int, w: float) -> int:
        """The first class from ``i`` on that fits ``v``/``r``/``g`` and runs at most ``w`` seconds
        (``len(classes)``: none). Blocks whose minima do not fit are skipped, level by level (the block
        that holds ``i`` too: its minima cover classes before ``i`` as well, which only makes them lower)."""
        dv, dr, dg, de = self.dims
        m1v, m1r, m1g, m1e, m2v, m2r, m2g, m2e, m3v, m3r, m3g, m3e = self.flat
        n = len(dv)
        while i < n:  # blocks of _B3
            b = i // _B3
            if m3v[b] > v or m3r[b] > r or m3g[b] > g or m3e[b] > w:
                i = (b + 1) * _B3
                continue
            e3 = min((b + 1) * _B3, n)
            while i < e3:  # blocks of _B2
                b = i // _B2
                if m2v[b] > v or m2r[b] > r or m2g[b] > g or m2e[b] > w:
                    i = (b + 1) * _B2
                    continue
                e2 = min((b + 1) * _B2, n)
                for b in range(i // _B1, (e2 - 1) // _B1 + 1):  # blocks of _B1
                    if m1v[b] > v or m1r[b] > r or m1g[b] > g or m1e[b] > w:
                        continue
                    for k in range(max(i, b * _B1), min((b + 1) * _B1, n)):
                        if dv[k] <= v and dr[k] <= r and dg[k] <= g and de[k] <= w:
                            return k
                i = e2
        return n

    def kill(self, j: int) -> None:
        """Class ``j`` has no units left: never found again. A minimum changes only where ``j`` held it
        alone (a tie leaves it as it is), and then only as far up as it was the minimum there too."""
        if not self.alive[j]:
            return
        self.alive[j] = 0
        self.live -= 1
        dims = self.dims
        if dims[0][j] == INF:  # an empty shape: never in the minima
            return
        (m1, m2, m3), b = self.mins, j // _B1
        b2, b3 = b // (_B2 // _B1), j // _B3
        for d, (a, l1, l2, l3) in enumerate(zip(dims, m1, m2, m3)):
            x = a[j]
            a[j] = INF
            if x > l1[b]:
                continue  # not the block's minimum: no minimum changes
            l1[b] = y = min(a[b * _B1:(b + 1) * _B1])
            if y == x or x > l2[b2]:
                continue
            l2[b2] = y = min(l1[b2 * (_B2 // _B1):(b2 + 1) * (_B2 // _B1)])
            if y == x or x > l3[b3]:
                continue
            l3[b3] = y = min(l2[b3 * (_B3 // _B2):(b3 + 1) * (_B3 // _B2)])
            if y != x:
                self.floor[d] = min(l3)


def _block_mins(a: list[float], size: int) -> list[float]:
    out = list(map(min, *[iter(a)] * size))  # the whole blocks (each min of ``size`` items in turn), in C
    if len(a) % size:
        out.append(min(a[len(out) * size:]))
    return out
