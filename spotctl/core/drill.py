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
percentage of counted checks passed, ``None`` when none was counted.
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
    """Seconds from the reclaim to another node launched afterwards becoming active (None: none yet)."""
    if v.reclaimed_at is None:
        return None
    t0 = v.reclaimed_at
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
    }
    passed = {
        "delivery_latency": latency is not None and latency <= MAX_DELIVERY_SECONDS,
        "notice_lead": lead is not None and lead >= MIN_NOTICE_SECONDS,
        "drained_before_deadline": drained_in_time,
        "jobs_lost": row["jobs_lost"] == 0,
        "capacity_returned": row["capacity_returned_by_deadline"],
    }
    return row, {name: (None if name in unchecked else bool(passed[name])) for name in CHECKS}


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

