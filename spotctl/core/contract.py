"""Provider-contract terms as pure functions of observed facts (the ops layer gathers the facts).

The five terms, per pool, each ``met``, ``degraded`` (present but late or out of bounds), ``missing``
(not offered, or not read) or ``unknown`` (offered, but nothing observed shows that it works). **A
term is ``met`` only on evidence observed** (hard notices on time, a rate card in date, a reservation
service read, a status call answered); otherwise it is not met, and says why.

1. notice      — a hard notice >= 120 s before deletion, delivered to the node in <= 1 s
2. advisory    — an early warning when reclaim risk rises (hard notices are preceded by one)
3. rate_card   — a price per pool, refreshed every 5 minutes
4. reservations — reservation and forward-capacity data (Blazar) can be read
5. reclaim_api — the provider's reclaim API answers (drills depend on it)

A pool with any term not met runs under the no-notice policy — except a notice or advisory term that
is ``unknown`` only because no hard notice came in the window (``no evidence yet``): the feed was read and
nothing late was seen, which is every quiet pool's normal state, so the pool's state is ``unknown``
and it keeps the normal policy (its first hard notice decides). :func:`change_kind` says when the
recorded state flips the policy (the ops layer records the flip: audit record + lifecycle event).

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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .models import RateCard

MIN_LEAD_SECONDS = 120.0
MAX_DELIVERY_SECONDS = 1.0
TERMS = ("notice", "advisory", "rate_card", "reservations", "reclaim_api")
WINDOW_SECONDS = 24 * 3600
RATE_CARD_MAX_AGE = 300 + 60  # refreshed every 5 minutes, with a minute of slack
NO_NOTICE_FEED = "no contract feed with notices is configured"
STATIC_RATE_CARD = "no rate-card feed is configured (list prices from the config)"
NO_RESERVATIONS = "no reservation service is read (Blazar is disabled: [openstack] blazar = false)"
NO_RECLAIM_API = "the contract feed offers no reclaim API"
NO_STATUS_CALL = "the feed offers a reclaim API but no status call to check that it answers"
NO_HARD_NOTICE_TO_WARN = ("no evidence yet: no hard notice in the window whose advisory could be checked; "
                          "a drill with --advisory-lead sends both")
NO_HARD_NOTICE = ("no evidence yet: no hard notice in the last {window} to show their lead (>= 120 s) and "
                  "delivery (<= 1 s); a drill (`spotctl exercise-reclaim`) sends some")


@dataclass(frozen=True, slots=True)
class SeenNotice:
    """A notice as observed: when it was issued, its deadline, and when it reached us (the contract's
    notice term is about ``kind == "hard"`` ones; the advisory term also reads the others)."""

    id: str
    issued_at: float
    deadline: float | None
    first_seen_at: float | None = None
    delivered_at: float | None = None
    kind: str = "hard"  # hard | advisory | calendar
    instance_id: str | None = None
    pool: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReclaimApiFacts:
    """What was observed of the provider's reclaim API this pass."""

    offered: bool                     # the feed implements the reclaim API
    status_call: bool = False         # ... and a status call that shows whether it answers
    status_error: str | None = None   # why this pass's status call failed (None: it answered)
    provider_status: object = None    # the status call's body (kept as evidence, not trusted as ours)


@dataclass(frozen=True)
class ContractFacts:
    """What one pass observed of the provider's contract, region-wide (the ops layer gathers it)."""

    now: float
    reclaim: ReclaimApiFacts
    provides_notices: bool = False          # a notice feed is configured
    notices_error: str | None = None        # why the notice feed was not read this pass (None: it was)
    notices: tuple[SeenNotice, ...] = ()    # every notice seen in the window (every kind, every pool)
    rate_card: RateCard | None = None
    rate_card_error: str | None = None      # why there is no rate card this pass
    cloud_error: str | None = None          # why the cloud (and its reservations) was not read
    reads_reservations: bool = False        # a reservation service (Blazar) is read
    reservations: Mapping[str, int] = field(default_factory=dict)  # pool -> reservations in the horizon
    restore_notices: int = 3
    restore_hold_seconds: float = 3600.0
    window_seconds: float = WINDOW_SECONDS


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
                restore_hold_seconds: float = 3600.0, window_seconds: float = WINDOW_SECONDS) -> dict[str, Any]:
    """The hard-notice term over the notices seen in the window: ``met`` or ``degraded``, with evidence;
    ``unknown`` when there is none (nothing observed shows that notices come on time, nor that they
    do not)."""
    ordered = sorted(notices, key=lambda n: (n.issued_at, n.id))
    late = [(n, lateness(n)) for n in ordered]
    bad = [(n, why) for n, why in late if why]
    leads = [n.deadline - n.issued_at for n in ordered if n.deadline is not None]
    lat = [n.delivered_at - n.issued_at for n in ordered if n.delivered_at is not None]
    evidence: dict[str, Any] = {
        "hard_notices": len(ordered), "late": len(bad),
        "lead_min_s": round(min(leads), 3) if leads else None,
        "left_at_receipt_min_s": min((round(n.deadline - n.first_seen_at, 3) for n in ordered
                                      if n.deadline is not None and n.first_seen_at is not None), default=None),
        "delivery_max_s": round(max(lat), 3) if lat else None,
        "delivery_unknown": len(ordered) - len(lat),
        "restore_rule": {"on_time_in_a_row": restore_notices, "hold_seconds": restore_hold_seconds},
    }
    if not ordered:
        hours = window_seconds / 3600
        evidence["error"] = NO_HARD_NOTICE.format(window=f"{hours:g} h" if hours >= 1 else f"{window_seconds:g} s")
        return {"state": "unknown", "evidence": evidence}
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


def _pct(values: Sequence[float], q: float) -> float | None:
    """The contract evidence's p50/p95, as it always was (index round(q * (n - 1)), to the ms); not yet
    spotctl.core.stats.percentile, whose nearest rank differs: folding it in changes reported values."""
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))], 3)


def pool_notice_term(hard: Sequence[SeenNotice], facts: ContractFacts) -> dict[str, Any]:
    """Term 1 for one pool's hard notices: :func:`notice_term`, with the lead and delivery percentiles."""
    leads = [n.deadline - n.issued_at for n in hard if n.deadline is not None]
    lat = [n.delivered_at - n.issued_at for n in hard if n.delivered_at is not None]
    term = notice_term(list(hard), facts.now, restore_notices=facts.restore_notices,
                       restore_hold_seconds=facts.restore_hold_seconds, window_seconds=facts.window_seconds)
    term["evidence"].update(lead_p50_s=_pct(leads, 0.5), delivery_p50_s=_pct(lat, 0.5),
                            delivery_p95_s=_pct(lat, 0.95), window_s=facts.window_seconds)
    return term


def advisory_term(notices: Sequence[SeenNotice]) -> dict[str, Any]:
    """Term 2 for one pool's notices (the feed was read): ``degraded`` when more than half of the hard
    notices came without an advisory (or calendar warning) for their instance; drill notices excepted."""
    hard = [n for n in notices if n.kind == "hard"]
    warned = {n.instance_id for n in notices if n.kind in ("advisory", "calendar")}
    unwarned = [n for n in hard if n.instance_id not in warned and "drill" not in (n.reason or "")]
    evidence: dict[str, Any] = {"advisories": sum(1 for n in notices if n.kind != "hard"),
                                "hard_without_advisory": len(unwarned)}
    if not hard:  # nothing to judge the advisories by: not met, not failed
        return {"state": "unknown", "evidence": {**evidence, "error": NO_HARD_NOTICE_TO_WARN}}
    return {"state": "degraded" if len(unwarned) * 2 > len(hard) else "met", "evidence": evidence}


def rate_card_term(pool: str, rate_card: RateCard | None, now: float, error: str | None = None) -> dict[str, Any]:
    """Term 3: ``met`` with a fed (not static) price for the pool, in date and refreshed within
    :data:`RATE_CARD_MAX_AGE`; ``degraded`` when stale; ``missing`` without a fed price."""
    rc = rate_card
    if rc is None or pool not in rc.prices or rc.version == "static":
        if rc is None:
            why = error if error is not None else "no rate card"
        elif rc.version == "static":
            why = STATIC_RATE_CARD
        else:
            why = f"the rate card has no price for {pool}"
        return {"state": "missing", "evidence": {"error": why}}
    age = now - rc.valid_from
    stale = age > RATE_CARD_MAX_AGE or now > rc.valid_until
    return {"state": "degraded" if stale else "met",
            "evidence": {"version": rc.version, "age_s": round(age, 1), "price": rc.prices[pool],
                         "valid_until": rc.valid_until}}


def reservations_term(pool: str, facts: ContractFacts) -> dict[str, Any]:
    """Term 4: ``met`` when the reservation service was read this pass, else ``missing``."""
    if facts.cloud_error is not None:
        return {"state": "missing", "evidence": {"error": facts.cloud_error}}
    if not facts.reads_reservations:
        return {"state": "missing", "evidence": {"error": NO_RESERVATIONS}}
    return {"state": "met", "evidence": {"reservations_in_horizon": facts.reservations.get(pool, 0),
                                         "read_at": facts.now}}


def reclaim_api_term(r: ReclaimApiFacts) -> dict[str, Any]:
    """Term 5: ``met`` only when a status call answered this pass; ``unknown`` when the API is offered
    with no status call to show it answers; ``missing`` when it is not offered or the call failed."""
    if not r.offered:
        return {"state": "missing", "evidence": {"error": NO_RECLAIM_API}}
    if not r.status_call:
        return {"state": "unknown", "evidence": {"error": NO_STATUS_CALL}}
    if r.status_error is not None:
        return {"state": "missing", "evidence": {"error": r.status_error}}
    return {"state": "met", "evidence": {"status_call": "answered",
                                         "provider_view": provider_reclaim_view(r.provider_status)}}


def provider_reclaim_view(body: object) -> object:
    """What the provider's status says of its reclaim API (kept as evidence, not trusted as ours)."""
    terms = body.get("terms") if isinstance(body, dict) else None
    if isinstance(terms, list):
        return next((t.get("state") for t in terms if isinstance(t, dict) and t.get("term") == "reclaim_api"), None)
    return None


def pool_terms(pool: str, facts: ContractFacts) -> dict[str, Any]:
    """Every term for one pool: ``{"state": met|unknown|degraded, "failing": [...], "terms": {...}}``;
    ``failing`` lists the terms not met, ``state`` is ``unknown`` when the only one is a notice term
    with no evidence yet (see :func:`breaking`)."""
    mine = [n for n in facts.notices if n.pool == pool]
    terms: dict[str, dict[str, Any]] = {}
    if not facts.provides_notices or facts.notices_error is not None:
        why = facts.notices_error or NO_NOTICE_FEED
        terms["notice"] = {"state": "missing", "evidence": {"error": why}}
        terms["advisory"] = {"state": "missing", "evidence": {"error": why}}
    else:
        terms["notice"] = pool_notice_term([n for n in mine if n.kind == "hard"], facts)
        terms["advisory"] = advisory_term(mine)
    terms["rate_card"] = rate_card_term(pool, facts.rate_card, facts.now, facts.rate_card_error)
    terms["reservations"] = reservations_term(pool, facts)
    terms["reclaim_api"] = reclaim_api_term(facts.reclaim)
    failing = [k for k in TERMS if terms[k]["state"] != "met"]
    report = {"state": "met", "failing": failing, "terms": terms}
    if failing:
        report["state"] = "degraded" if breaking(report) else "unknown"
    return report


def breaking(pool_report: Mapping[str, Any]) -> list[str]:
    """The failing terms that put a pool under the no-notice policy: all of them but a notice or advisory
    term with no evidence yet (``unknown``: no hard notice in the window; see the module's docstring)."""
    terms = pool_report.get("terms", {})
    return [k for k in pool_report["failing"]
            if not (k in ("notice", "advisory") and terms.get(k, {}).get("state") == "unknown")]


def evaluate(region: str, pools: Iterable[str], facts: ContractFacts) -> dict[str, Any]:
    """The contract report: each pool's terms, and whether every pool meets every term."""
    report = {name: pool_terms(name, facts) for name in pools}
    return {"region": region, "now": facts.now, "pools": report,
            "met": all(p["state"] == "met" for p in report.values())}


def degraded_pools(report: Mapping[str, Any]) -> frozenset[str]:
    """The pools of a report that run under the no-notice policy (a term not met, see :func:`breaking`)."""
    return frozenset(name for name, p in report["pools"].items() if p["state"] == "degraded")


def recorded_value(pool_report: Mapping[str, Any]) -> str:
    """A pool's contract state as recorded: ``met``, ``degraded:`` and the terms that break it, or
    ``unknown:`` and the terms with no evidence yet."""
    if pool_report["state"] == "met":
        return "met"
    if pool_report["state"] == "degraded":
        return "degraded:" + ",".join(breaking(pool_report))
    return "unknown:" + ",".join(pool_report["failing"])


def recorded_failing(value: str | None) -> list[str]:
    """The terms a recorded value counts as breaking ([] for ``met``, ``unknown:…`` or nothing recorded)."""
    if not value or not value.startswith("degraded:"):
        return []
    return value.split(":", 1)[1].split(",")


def change_kind(before: str | None, pool_report: Mapping[str, Any]) -> str | None:
    """Whether a pool's recorded contract state flips its policy: ``degraded`` (or degraded by other
    terms), ``restored`` (back to the normal policy), or None (no change, the first sight of a pool under
    the normal policy, or met <-> unknown, which changes no policy: nothing to announce)."""
    if before == recorded_value(pool_report):
        return None
    if pool_report["state"] == "degraded":
        return "degraded"
    return "restored" if before is not None and before.startswith("degraded:") else None


def late_notice_report(pool: str, before: str | None, notice: SeenNotice, now: float) -> dict[str, Any] | None:
    """The report that flips a pool's notice term when a late hard notice is seen (by the watcher,
    between passes): None when the notice kept the contract, or the recorded state (``before``)
    already counts the notice term as failing. The other recorded failing terms are kept."""
    why = lateness(notice)
    if not why:
        return None
    failing_before = recorded_failing(before)
    if "notice" in failing_before:
        return None
    failing = sorted(set(failing_before) | {"notice"})
    term = {"state": "degraded", "evidence": {"late": 1, "last_late": {"id": notice.id, "why": why,
                                                                      "issued_at": notice.issued_at}}}
    return {"now": now, "pools": {pool: {"state": "degraded", "failing": failing, "terms": {"notice": term, **{
        t: {"state": "degraded", "evidence": {"recorded": before}} for t in failing if t != "notice"}}}}}
