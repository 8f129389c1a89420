"""The figures of a simulation report (``spotctl simulate``), each defined once, as pure functions of what
the simulated world counted (:class:`Counters`). The world gathers the counters; the CLI only writes
these figures out.

A *unit* is one Kubernetes pod or one Slurm job; each task of a burst (an array job, a scale-up) is a
unit of its own. The window is the simulated time, from the world's start to its end.

**Demand.** ``arrived`` counts every unit the world was given: those submitted during the window, the
backlog already queued when it began (``queued_at_start``: submitted up to 90 min before the start) and,
in a generated world, the units already running when it was built. At the end of the window each arrived
unit is in exactly one of four places, so that::

    arrived == started + pending + abandoned + excluded

- ``started``: started at least once, counted once however often it was interrupted and restarted:
  ``started == completed + running + requeued`` (``requeued``: interrupted, waiting to run again);
- ``pending``: waiting at the end, never started;
- ``abandoned``: never started within ``abandon_after_seconds`` (12 h) of its submit (or the end of its
  hold): its owner took it elsewhere;
- ``excluded``: not demand at the end: still held (a Slurm job held by its user, waiting on a
  dependency or a begin time; a pod that does not tolerate the spot taint) or withdrawn while held,
  by reason in ``excluded_by_reason``.

A unit that was excluded when it arrived and became demand later (its dependency met, its begin time
reached) counts where it ended up; ``excluded_at_arrival`` counts every unit excluded when it arrived.
(The report used to call that count ``excluded`` and subtract it from ``arrived``, while the released
units that then started stayed in ``started``: a served share above 100 %.)

``servable = arrived − excluded = started + pending + abandoned`` is the demand that spot capacity could
serve. Shares of demand are of it: ``served_pct = started / servable``, so never above 100 %;
``pending_pct`` and ``abandoned_pct`` likewise; ``excluded_pct`` is of ``arrived``. A share of nothing
is None (``-`` in a table), not 100 %.

**Waits**: from submit (or the end of a hold) to the first start, over the most recent first starts
(the world keeps 20 000; ``wait_samples`` says how many), as nearest-rank percentiles
(:func:`spotctl.core.stats.percentile`); 0 when nothing started.

**Interruptions** count runs, not units: a run stopped by a drain is requeued (``requeued_units``); a
run whose node went away is lost (``lost_units``: its unit is requeued too, its progress is lost). A
unit interrupted twice counts twice.

**Notices** are counted when issued, per node, by kind: ``hard`` (delete by a deadline, at least 120 s
ahead), ``advisory`` (reclaim risk rose: a surge, or a reservation within 30 min) and ``calendar`` (a
reservation takes the node's host at a known time). Each hard notice ends in one of four ways::

    hard == handled_before_deadline + missed + open_at_end + unscored

- handled before the deadline: the node was drained in every scheduler by then, or spotctl deleted it;
- missed: at the deadline work was still running, and the provider took the node anyway;
- open at the end: its deadline is after the window;
- unscored: its node was gone before the deadline for another reason (it vanished without notice).

``due_in_window = hard − open_at_end`` are those whose deadline fell in the window, and
``handled_pct = handled_before_deadline / due_in_window``.

**Cost**: node-seconds × the rate-card price in force, per pool, in the region's currency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from .stats import percentile


@dataclass(frozen=True, slots=True)
class Counters:
    """What a simulated world counted, read at the end of the window (see the module docstring)."""

    arrived: int = 0
    queued_at_start: int = 0
    excluded_at_arrival: int = 0
    started: int = 0
    completed: int = 0
    running: int = 0
    requeued: int = 0  # started, interrupted, waiting to run again at the end
    pending: int = 0  # waiting at the end, never started
    abandoned: int = 0
    abandon_after_seconds: float = 0.0  # a unit never started this long after its submit is abandoned
    held: Mapping[str, int] = field(default_factory=dict)  # still held at the end, by reason
    withdrawn: Mapping[str, int] = field(default_factory=dict)  # withdrawn while held, by reason
    waits: Sequence[float] = ()  # seconds from submit (or the end of a hold) to the first start
    requeued_runs: int = 0
    lost_runs: int = 0
    nodes_lost_without_notice: int = 0
    notices: Mapping[str, int] = field(default_factory=dict)  # issued, by kind: hard, advisory, calendar
    hard_handled: int = 0
    hard_missed: int = 0
    hard_open: int = 0  # hard notices whose deadline is after the window
    cost: Mapping[str, float] = field(default_factory=dict)  # by pool, in ``currency``
    node_seconds: Mapping[str, float] = field(default_factory=dict)  # by pool
    currency: str = ""


class Demand(TypedDict):
    arrived: int
    started: int
    completed: int
    running: int
    pending: int
    excluded: int
    abandoned: int
    served_pct: float | None
    servable: int
    requeued: int
    queued_at_start: int
    excluded_at_arrival: int
    excluded_by_reason: dict[str, int]
    still_held: int
    withdrawn: int
    pending_pct: float | None
    abandoned_pct: float | None
    excluded_pct: float | None
    wait_samples: int
    abandon_after_seconds: float


class Waits(TypedDict):
    p50: float
    p95: float
    max: float


class Interruptions(TypedDict):
    lost_units: int
    requeued_units: int
    nodes_lost_without_notice: int


class Notices(TypedDict):
    hard: int
    advisory: int
    calendar: int
    handled_before_deadline: int
    missed: int
    open_at_end: int
    unscored: int
    due_in_window: int
    handled_pct: float | None


class Cost(TypedDict):
    total: float
    currency: str
    by_pool: dict[str, float]
    node_hours_total: float


def share(part: int, whole: int) -> float | None:
    """``part`` of ``whole`` in percent, to 2 decimals; None when ``whole`` is 0 (a share of nothing)."""
    return round(100.0 * part / whole, 2) if whole else None


def _merge(*counts: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            if v:
                out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def demand(c: Counters) -> Demand:
    """Where the arrived units are at the end: ``arrived == started + pending + abandoned + excluded``."""
    still_held = sum(c.held.values())
    withdrawn = sum(c.withdrawn.values())
    excluded = still_held + withdrawn
    servable = c.started + c.pending + c.abandoned
    return {
        "arrived": c.arrived,
        "started": c.started,
        "completed": c.completed,
        "running": c.running,
        "pending": c.pending,
        "excluded": excluded,
        "abandoned": c.abandoned,
        "served_pct": share(c.started, servable),
        "servable": servable,
        "requeued": c.requeued,
        "queued_at_start": c.queued_at_start,
        "excluded_at_arrival": c.excluded_at_arrival,
        "excluded_by_reason": _merge(c.held, c.withdrawn),
        "still_held": still_held,
        "withdrawn": withdrawn,
        "pending_pct": share(c.pending, servable),
        "abandoned_pct": share(c.abandoned, servable),
        "excluded_pct": share(excluded, c.arrived),
        "wait_samples": len(c.waits),
        "abandon_after_seconds": c.abandon_after_seconds,
    }


def waits(c: Counters) -> Waits:
    """Wait to the first start: nearest-rank p50 and p95 and the maximum, in seconds (0 without starts)."""
    def pct(q: float) -> float:
        p = percentile(c.waits, q)
        return 0.0 if p is None else p

    return {"p50": pct(0.5), "p95": pct(0.95), "max": pct(1.0)}


def interruptions(c: Counters) -> Interruptions:
    """Runs stopped before they finished (by a drain: requeued; with their node: lost), and nodes the
    provider took without a hard notice."""
    return {"lost_units": c.lost_runs, "requeued_units": c.requeued_runs,
            "nodes_lost_without_notice": c.nodes_lost_without_notice}


def notices(c: Counters) -> Notices:
    """Notices issued by kind, and how each hard one ended:
    ``hard == handled_before_deadline + missed + open_at_end + unscored``."""
    hard = c.notices.get("hard", 0)
    due = hard - c.hard_open
    return {
        "hard": hard,
        "advisory": c.notices.get("advisory", 0),
        "calendar": c.notices.get("calendar", 0),
        "handled_before_deadline": c.hard_handled,
        "missed": c.hard_missed,
        "open_at_end": c.hard_open,
        "unscored": due - c.hard_handled - c.hard_missed,
        "due_in_window": due,
        "handled_pct": share(c.hard_handled, due),
    }


def cost(c: Counters) -> Cost:
    """Cost per pool and in total (4 decimals), and the node-hours it paid for."""
    return {
        "total": round(sum(c.cost.values()), 4),
        "currency": c.currency,
        "by_pool": {p: round(v, 4) for p, v in sorted(c.cost.items())},
        "node_hours_total": round(sum(c.node_seconds.values()) / 3600.0, 4),
    }


def node_hours(c: Counters) -> dict[str, float]:
    """Node-hours per pool (4 decimals)."""
    return {p: round(s / 3600.0, 4) for p, s in sorted(c.node_seconds.items())}
