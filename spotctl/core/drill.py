"""Reclaim-drill decisions as pure functions of what was observed (``spotctl.ops.drill`` gathers it).

**Scoring.** Per victim, five checks, each passed only on evidence observed:

- ``delivery_latency`` — its hard notice was delivered within ``MAX_DELIVERY_SECONDS`` of issue (the
  provider's delivery stamp; no stamp is not a pass);
- ``notice_lead`` — the hard notice gave at least ``MIN_NOTICE_SECONDS`` (deadline - issued);
- ``drained_before_deadline`` — a drain round every bound scheduler accepted, before the deadline;
- ``jobs_lost`` — no running work was lost: what that drain round said ran there was requeued in time;
- ``capacity_returned`` — the node was deleting by the deadline and gone by our delete (not taken
  back by the provider at the deadline).

A check is **unchecked** (neither passed nor failed, and not counted) when nothing exercised it: the
hard notice's two checks when the node was given back on the advisory alone before its hard notice
came; ``jobs_lost`` when no drain round said what ran on the node. A victim the provider's reclaim
API refused is one failed check; a victim the drill never reached is not scored. The score is the
percentage of counted checks passed, ``None`` when none was counted. Each victim's row lists its
checks (:func:`check_rows`): the value observed, the threshold, and ``met``, ``missed`` or
``unchecked``.

**Replacements.** When work ran on a victim, the planner launches replacement capacity for it
(a launch whose reason starts with :data:`REPLACEMENT_REASON` and names the victim); the row lists
those launches and the time from the reclaim to the first of them becoming active. A drill waits
for them (:func:`replacement_settled`) so that this time is measured.

**Before a drill.** Victims are active nodes without a notice; :func:`shortfall_ready_at` says when
enough of a pool's booting nodes are expected to be active (their launch time + the pool's boot time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .contract import MAX_DELIVERY_SECONDS, MIN_LEAD_SECONDS, SeenNotice

MIN_NOTICE_SECONDS = int(MIN_LEAD_SECONDS)
#: how long after its notice's deadline a victim still alive keeps a drill waiting
DONE_GRACE_SECONDS = 60
#: pending work below which "demand served" is not judged (too little to say)
MIN_PENDING_TO_JUDGE = 10
CHECKS = ("delivery_latency", "notice_lead", "drained_before_deadline", "jobs_lost", "capacity_returned")
#: the transition reason of a node the provider took back at its deadline (not returned by us)
TAKEN_AT_DEADLINE = "reclaimed after notice"
#: how the reason of a launch the planner makes for a leaving node's work starts (core.plan_demand)
REPLACEMENT_REASON = "replacement capacity for "
#: states a replacement node does not leave again (it will never become active)
ENDED_STATES = frozenset({"gone", "failed", "lost"})


@dataclass(frozen=True, slots=True)
class DrainRound:
    """A victim's first drain round that every bound scheduler accepted (its ``node.drain`` audit record)."""

    at: float
    running: int | None = None  # the work running there, as the round said; None: the round did not say


@dataclass(frozen=True, slots=True)
class SeenTransition:
    to_state: str
    at: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReplacementLaunch:
    """A node the planner launched for a victim's work (its launch reason names the victim)."""

    node: str
    pool: str
    launched_at: float
    active_at: float | None = None  # when it first became active; None: not (yet)
    state: str = "intended"
    boot_seconds: float = 0.0  # its pool's configured boot time

    def to_dict(self, reclaimed_at: float | None) -> dict[str, Any]:
        return {"node": self.node, "pool": self.pool, "launched_at": self.launched_at, "active_at": self.active_at,
                "state": self.state, "expected_active_at": self.launched_at + self.boot_seconds,
                "active_after_s": None if self.active_at is None or reclaimed_at is None
                else round(self.active_at - reclaimed_at, 1)}


def replaced_nodes(reason: str) -> tuple[str, ...]:
    """The nodes a launch replaces, from its reason (``replacement capacity for a, b: 1 × pool …``);
    ``()`` for a launch for pending work."""
    if not reason.startswith(REPLACEMENT_REASON):
        return ()
    names = reason[len(REPLACEMENT_REASON):].split(":", 1)[0]
    return tuple(n.strip() for n in names.split(",") if n.strip())


def replacement_settled(r: ReplacementLaunch, now: float) -> bool:
    """Whether a drill has nothing more to wait for on a replacement: active, ended, or past its pool's
    boot time plus :data:`DONE_GRACE_SECONDS` (a slow boot is reported as it stands)."""
    return (r.active_at is not None or r.state in ENDED_STATES
            or now >= r.launched_at + r.boot_seconds + DONE_GRACE_SECONDS)


def shortfall_ready_at(short: int, booting_ready_at: Iterable[float]) -> float | None:
    """When ``short`` more of a pool's nodes are expected active, from the expected ready times of its
    booting nodes (each one's launch time + the pool's boot time); None when fewer are booting."""
    times = sorted(booting_ready_at)
    if short <= 0:
        return min(times, default=None)
    return times[short - 1] if len(times) >= short else None


@dataclass(frozen=True, slots=True)
class VictimFacts:
    """What was observed of one victim of a drill."""

    node: str
    instance_id: str | None = None
    reclaim_error: str | None = None         # the provider's reclaim API refused it
    reclaimed_at: float | None = None        # None: not reclaimed (the drill stopped before its wave)
    hard_notice: SeenNotice | None = None    # the first hard notice for its instance
    first_notice: SeenNotice | None = None   # what the reclaim call issued: the hard notice or an advisory
    drain: DrainRound | None = None
    transitions: tuple[SeenTransition, ...] = ()
    #: (node, when it became active) of the nodes launched at or after the reclaim
    activations: tuple[tuple[str, float], ...] = ()
    #: the launches the planner made for its work
    replacements: tuple[ReplacementLaunch, ...] = ()


@dataclass(frozen=True, slots=True)
class DrillFacts:
    notice_seconds: float
    advisory_lead_seconds: float = 0.0
    victims: tuple[VictimFacts, ...] = ()


def deadline(v: VictimFacts, notice_seconds: float, advisory_lead_seconds: float = 0.0) -> float:
    """When the victim's capacity is due back: its hard notice's deadline; else the advisory's (it
    announces when the hard notice's deadline falls); else what the drill asked for."""
    if v.hard_notice is not None and v.hard_notice.deadline is not None:
        return v.hard_notice.deadline
    first = v.first_notice
    if first is not None and first.kind != "hard" and first.deadline is not None:
        return first.deadline
    return (v.reclaimed_at or 0.0) + advisory_lead_seconds + notice_seconds


def replacement_seconds(v: VictimFacts) -> float | None:
    """Seconds from the reclaim to its replacement becoming active: the first of the launches made for its
    work, else (none known) another node launched afterwards (None: none active yet)."""
    if v.reclaimed_at is None:
        return None
    t0 = v.reclaimed_at
    if v.replacements:
        times = [r.active_at - t0 for r in v.replacements if r.active_at is not None]
    else:
        times = [at - t0 for node, at in v.activations if node != v.node]
    return round(min(times), 1) if times else None


def score_victim(v: VictimFacts, notice_seconds: float,
                 advisory_lead_seconds: float = 0.0) -> tuple[dict[str, Any], dict[str, bool | None]]:
    """One reclaimed victim's row (its evidence) and its checks: name -> passed, or None when unchecked."""
    n = v.hard_notice
    first = v.first_notice
    advised = first is not None and first.kind != "hard"
    at = {t.to_state: t.at for t in v.transitions}  # the last time it entered each state
    due = deadline(v, notice_seconds, advisory_lead_seconds)
    latency = None if n is None or n.delivered_at is None else round(n.delivered_at - n.issued_at, 3)
    left = None if n is None or n.deadline is None or n.first_seen_at is None else round(
        n.deadline - n.first_seen_at, 1)
    lead = None if n is None or n.deadline is None else round(n.deadline - n.issued_at, 1)
    drain = v.drain
    drained_at = drain.at if drain is not None else None
    running = (drain.running or 0) if drain is not None else 0
    drained_in_time = drained_at is not None and drained_at <= due
    returned_at = at.get("deleting")
    # returned by us: deleted, and its release verified — not taken back by the provider at the deadline
    gone = any(t.to_state == "gone" and not t.reason.startswith(TAKEN_AT_DEADLINE) for t in v.transitions)
    # With an advisory lead the node may be drained and returned before the hard notice comes:
    # the notice's own checks (delivery, lead) were then not exercised — neither passed nor failed.
    unchecked = ["delivery_latency", "notice_lead"] if n is None and advised and "gone" in at else []
    if drain is None or drain.running is None:
        unchecked.append("jobs_lost")  # no round said what ran there (none accepted, or a watcher round)
    row = {
        "node": v.node, "notice": n.id if n else None, "advisory": first.id if advised and first else None,
        "unchecked": unchecked, "delivery_latency_s": latency,
        "notice_lead_s": lead, "left_at_receipt_s": left, "drained_at": drained_at,
        "drained_before_deadline": drained_in_time,
        "jobs_requeued": running if drained_in_time else 0, "jobs_lost": 0 if drained_in_time else running,
        "time_to_replacement_s": replacement_seconds(v) if running else None,
        "capacity_returned_by_deadline": bool(returned_at is not None and returned_at <= due and gone),
        "final_state": v.transitions[-1].to_state if v.transitions else None,
        "reclaimed_at": v.reclaimed_at, "deadline": due,
        "replacements": [r.to_dict(v.reclaimed_at) for r in v.replacements],
    }
    passed = {
        "delivery_latency": latency is not None and latency <= MAX_DELIVERY_SECONDS,
        "notice_lead": lead is not None and lead >= MIN_NOTICE_SECONDS,
        "drained_before_deadline": drained_in_time,
        "jobs_lost": row["jobs_lost"] == 0,
        "capacity_returned": row["capacity_returned_by_deadline"],
    }
    results = {name: (None if name in unchecked else bool(passed[name])) for name in CHECKS}
    taken = any(t.to_state == "gone" and t.reason.startswith(TAKEN_AT_DEADLINE) for t in v.transitions)
    row["checks"] = check_rows(v, row, results, due, returned_at=returned_at, gone=gone, taken=taken)
    return row, results


def check_rows(v: VictimFacts, row: Mapping[str, Any], results: Mapping[str, bool | None], due: float, *,
               returned_at: float | None, gone: bool, taken: bool) -> list[dict[str, Any]]:
    """A victim's checks as rows: ``name``, ``result`` (met | missed | unchecked), the value ``observed``
    and the ``threshold`` it is held to (``op``: <=, >= or ==; ``unit``: s, or jobs), and a ``note`` saying
    what was or was not seen. Times are seconds after the reclaim call; the deadline is ``due``."""
    t0 = v.reclaimed_at if v.reclaimed_at is not None else due
    n = v.hard_notice
    advised_only = "delivery_latency" in row["unchecked"]

    def after(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 1)

    def no_notice(what: str) -> str:
        if advised_only:
            return "given back on the advisory, before any hard notice"
        return "no hard notice seen" if n is None else what

    due_after = round(due - t0, 1)
    drained, lost = row["drained_at"], row["jobs_lost"]
    if returned_at is None:
        returned = "taken back by the provider at its deadline" if taken else "not deleted"
    else:
        returned = ("then gone: its allocations freed" if gone else
                    "then taken back by the provider at its deadline" if taken else "not gone yet")
    if "jobs_lost" in row["unchecked"]:
        work = "no drain round said what ran there"
    else:
        work = f"{row['jobs_requeued']} requeued, {lost} lost"
    spec: list[tuple[str, Any, str, float, str, str]] = [
        ("delivery_latency", row["delivery_latency_s"], "<=", MAX_DELIVERY_SECONDS, "s",
         no_notice("no delivery stamp from the provider") if row["delivery_latency_s"] is None
         else "from the notice's issue to its delivery on the node"),
        ("notice_lead", row["notice_lead_s"], ">=", MIN_NOTICE_SECONDS, "s",
         no_notice("the notice has no deadline") if row["notice_lead_s"] is None
         else "from the notice's issue to its deadline"),
        ("drained_before_deadline", after(drained), "<=", due_after, "s",
         "no drain round every scheduler accepted" if drained is None
         else "when every bound scheduler accepted its drain"),
        ("jobs_lost", None if "jobs_lost" in row["unchecked"] else lost, "==", 0, "jobs", work),
        ("capacity_returned", after(returned_at), "<=", due_after, "s", returned),
    ]
    gone_at = next((t.at for t in v.transitions if t.to_state == "gone"), None) if gone else None
    out = []
    for name, observed, op, threshold, unit, note in spec:
        ok = results[name]
        out.append({"name": name, "result": "unchecked" if ok is None else "met" if ok else "missed",
                    "observed": observed, "op": op, "threshold": threshold, "unit": unit, "note": note})
    out[-1]["gone_after_s"] = after(gone_at)  # capacity_returned: when it was gone, freed by us
    return out


def score(facts: DrillFacts) -> dict[str, Any]:
    """The drill's score from its victims: ``{"score", "checks", "passed", "victims": [rows]}``."""
    rows = []
    checks = passed = 0
    for v in facts.victims:
        if v.reclaim_error is not None:  # the provider's reclaim API refused it: a failed check, not a skipped one
            rows.append({"node": v.node, "reclaim_error": v.reclaim_error})
            checks += 1
            continue
        if v.reclaimed_at is None:
            rows.append({"node": v.node, "skipped": "not reclaimed (drill stopped before its wave)"})
            continue
        row, results = score_victim(v, facts.notice_seconds, facts.advisory_lead_seconds)
        counted = [ok for ok in results.values() if ok is not None]
        checks += len(counted)
        passed += sum(counted)
        rows.append(row)
    return {"score": round(100.0 * passed / checks, 1) if checks else None, "checks": checks, "passed": passed,
            "victims": rows}


def stop_reason(notices: Iterable[SeenNotice], demand: Mapping[str, Any] | None,
                min_served_pct: float) -> str | None:
    """Why a drill must stop issuing waves (None: go on): a hard notice that reached us with less than the
    contract's minimum left, or demand served dropping below the policy's floor."""
    for n in notices:
        if n.kind == "hard" and n.deadline is not None and n.first_seen_at is not None \
                and n.deadline - n.first_seen_at < MIN_NOTICE_SECONDS - MAX_DELIVERY_SECONDS:
            return (f"notice {n.id} arrived with {int(n.deadline - n.first_seen_at)} s left "
                    f"(< {MIN_NOTICE_SECONDS} s)")
    if demand is not None:
        pending = demand.get("pending") or 0
        if pending >= MIN_PENDING_TO_JUDGE:
            served = 100.0 * (pending - demand.get("unplaced", 0)) / pending
            if served < min_served_pct:
                return f"demand served dropped to {served:.0f}% (< {min_served_pct:g}%)"
    return None


def victim_handled(*, refused: bool, reclaimed_at: float | None, live: bool, now: float,
                   notice_seconds: float) -> bool:
    """Whether a drill has nothing more to wait for on a victim: refused by the provider, or reclaimed
    and gone (or alive past its notice plus :data:`DONE_GRACE_SECONDS`)."""
    if refused:
        return True
    if reclaimed_at is None:
        return False
    return not live or now >= reclaimed_at + notice_seconds + DONE_GRACE_SECONDS

