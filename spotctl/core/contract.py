"""Provider-contract terms as pure functions of observed facts (the ops layer gathers the facts).

Term 1, the hard notice: at least ``MIN_LEAD_SECONDS`` before deletion, delivered in at most
``MAX_DELIVERY_SECONDS``. A notice is **late** when any of what was observed says so:

- its lead (deadline - issued) is under the minimum;
- it was delivered more than the maximum after it was issued (when the delivery time is known);
- it carries no delivery time, and the time left when we first saw it (deadline - first seen) is
  under the minimum less the delivery allowance: without the provider's delivery stamp, our
  receipt is the evidence of when it arrived.

**Degrade and restore.** One late notice in the window degrades the term at once. The term is
restored when, after the latest late notice, ``restore_notices`` hard notices in a row came on time
*and* ``restore_hold_seconds`` have passed since the late one — so a provider that keeps its
contract again gets its pools back without waiting for the late notice to age out of the window,
and one good notice after a bad one does not flip the pool back and forth.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_LEAD_SECONDS = 120.0
MAX_DELIVERY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class SeenNotice:
    """A hard notice as observed: when it was issued, its deadline, and when it reached us."""

    id: str
    issued_at: float
    deadline: float | None
    first_seen_at: float | None = None
    delivered_at: float | None = None


def lateness(n: SeenNotice) -> list[str]:
    """Why a hard notice breaks the contract ([] when it kept it)."""
    why = []
    if n.deadline is None:
        return ["no deadline"]
    if n.deadline - n.issued_at < MIN_LEAD_SECONDS:
        why.append(f"lead {n.deadline - n.issued_at:.0f}s < {MIN_LEAD_SECONDS:.0f}s")
    if n.delivered_at is not None and n.delivered_at - n.issued_at > MAX_DELIVERY_SECONDS:
        why.append(f"delivered {n.delivered_at - n.issued_at:.1f}s after issue > {MAX_DELIVERY_SECONDS:g}s")
    if n.delivered_at is None and n.first_seen_at is not None \
            and n.deadline - n.first_seen_at < MIN_LEAD_SECONDS - MAX_DELIVERY_SECONDS:
        why.append(f"{n.deadline - n.first_seen_at:.0f}s left when first seen")
    return why


def notice_term(notices: list[SeenNotice], now: float, *, restore_notices: int = 3,
                restore_hold_seconds: float = 3600.0) -> dict:
    """The hard-notice term over the notices seen in the window: ``met`` or ``degraded``, with evidence."""
    ordered = sorted(notices, key=lambda n: (n.issued_at, n.id))
    late = [(n, lateness(n)) for n in ordered]
    bad = [(n, why) for n, why in late if why]
    leads = [n.deadline - n.issued_at for n in ordered if n.deadline is not None]
    lat = [n.delivered_at - n.issued_at for n in ordered if n.delivered_at is not None]
    evidence: dict = {
        "hard_notices": len(ordered), "late": len(bad),
        "lead_min_s": round(min(leads), 3) if leads else None,
        "left_at_receipt_min_s": min((round(n.deadline - n.first_seen_at, 3) for n in ordered
                                      if n.deadline is not None and n.first_seen_at is not None), default=None),
        "delivery_max_s": round(max(lat), 3) if lat else None,
        "delivery_unknown": len(ordered) - len(lat),
        "restore_rule": {"on_time_in_a_row": restore_notices, "hold_seconds": restore_hold_seconds},
    }
    if not bad:
        return {"state": "met", "evidence": evidence}
    last_bad, why = bad[-1]
    after = [n for n in ordered if (n.issued_at, n.id) > (last_bad.issued_at, last_bad.id)]
    held = now - last_bad.issued_at
    evidence.update(last_late={"id": last_bad.id, "why": why, "issued_at": last_bad.issued_at},
                    on_time_since=len(after), seconds_since_late=round(held, 1))
    if len(after) >= restore_notices and held >= restore_hold_seconds:
        evidence["restored"] = (f"{len(after)} notices on time since {last_bad.id} and none late for "
                                f"{held:.0f}s")
        return {"state": "met", "evidence": evidence}
    return {"state": "degraded", "evidence": evidence}
