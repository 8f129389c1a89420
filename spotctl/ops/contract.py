"""Provider-contract conformance: the five terms, per pool, with evidence.

1. notice      — a hard notice >= 120 s before deletion, delivered to the node in <= 1 s
2. advisory    — an early warning when reclaim risk rises (hard notices are preceded by one)
3. rate_card   — a price per pool, refreshed every 5 minutes
4. reservations — reservation and forward-capacity data (Blazar) can be read
5. reclaim_api — the provider's reclaim API answers (drills depend on it)

Each term is ``met``, ``degraded`` (present but late or out of bounds) or
``missing``. A pool with any term not met runs under the no-notice policy;
every flip is recorded (audit record + lifecycle event) by the pass.
"""

from __future__ import annotations

import logging

from spotctl.core.contract import SeenNotice, lateness, notice_term
from spotctl.core.ports import ProviderStatus, ReclaimPort

from .observe import Snapshot, observe
from .runtime import Runtime

log = logging.getLogger(__name__)

TERMS = ("notice", "advisory", "rate_card", "reservations", "reclaim_api")
WINDOW_SECONDS = 24 * 3600
RATE_CARD_MAX_AGE = 300 + 60  # refreshed every 5 minutes, with a minute of slack


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))], 3)


def evaluate(rt: Runtime, snap: Snapshot) -> dict:
    """Each term per pool, with evidence, from this pass's observation and the notices on record."""
    now = snap.now
    provides_notices = rt.contract.provides_notices and "notices" not in snap.degraded
    seen = {n["id"]: n for n in rt.store.notices_since(now - WINDOW_SECONDS)}
    for nt in snap.notices:  # this pass's notices count even before they are recorded (seen now)
        seen.setdefault(nt.id, {"id": nt.id, "instance_id": nt.instance_id, "kind": str(nt.kind),
                                "issued_at": nt.issued_at, "deadline": nt.deadline, "delivered_at": nt.delivered_at,
                                "pool": nt.pool, "reason": nt.reason, "first_seen_at": now})
    seen = list(seen.values())
    reclaim = _reclaim_api(rt, snap)
    rc = snap.rate_card
    pools: dict[str, dict] = {}
    for name in rt.region.pools:
        mine = [n for n in seen if n.get("pool") == name]
        hard = [n for n in mine if n["kind"] == "hard"]
        leads = [n["deadline"] - n["issued_at"] for n in hard if n["deadline"] is not None]
        lat = [n["delivered_at"] - n["issued_at"] for n in hard if n.get("delivered_at") is not None]
        terms: dict[str, dict] = {}
        if not provides_notices:
            why = snap.degraded.get("notices") or "no contract feed with notices is configured"
            terms["notice"] = {"state": "missing", "evidence": {"error": why}}
            terms["advisory"] = {"state": "missing", "evidence": {"error": why}}
        else:
            pol = rt.region.policy
            term = notice_term([SeenNotice(id=n["id"], issued_at=n["issued_at"], deadline=n["deadline"],
                                           first_seen_at=n.get("first_seen_at"), delivered_at=n.get("delivered_at"))
                                for n in hard], now, restore_notices=pol.contract_restore_notices,
                               restore_hold_seconds=pol.contract_restore_hold_seconds)
            term["evidence"].update(lead_p50_s=_pct(leads, 0.5), delivery_p50_s=_pct(lat, 0.5),
                                    delivery_p95_s=_pct(lat, 0.95), window_s=WINDOW_SECONDS)
            terms["notice"] = term
            warned = {n["instance_id"] for n in mine if n["kind"] in ("advisory", "calendar")}
            unwarned = [n for n in hard if n["instance_id"] not in warned and "drill" not in (n["reason"] or "")]
            adv = {"advisories": sum(1 for n in mine if n["kind"] != "hard"), "hard_without_advisory": len(unwarned)}
            terms["advisory"] = {"state": "degraded" if hard and len(unwarned) * 2 > len(hard) else "met",
                                 "evidence": adv}
        if rc is None or name not in rc.prices or rc.version == "static":
            if rc is None:
                why = snap.degraded.get("rate_card", "no rate card")
            elif rc.version == "static":
                why = "no rate-card feed is configured (list prices from the config)"
            else:
                why = f"the rate card has no price for {name}"
            terms["rate_card"] = {"state": "missing", "evidence": {"error": why}}
        else:
            age = now - rc.valid_from
            stale = age > RATE_CARD_MAX_AGE or now > rc.valid_until
            terms["rate_card"] = {"state": "degraded" if stale else "met",
                                  "evidence": {"version": rc.version, "age_s": round(age, 1), "price": rc.prices[name],
                                               "valid_until": rc.valid_until}}
        if "cloud" in snap.degraded:
            terms["reservations"] = {"state": "missing", "evidence": {"error": snap.degraded["cloud"]}}
        elif not rt.cloud.reads_reservations:
            terms["reservations"] = {"state": "missing", "evidence": {
                "error": "no reservation service is read (Blazar is disabled: [openstack] blazar = false)"}}
        else:
            terms["reservations"] = {"state": "met", "evidence": {
                "reservations_in_horizon": sum(1 for r in snap.reservations if r.pool == name), "read_at": now}}
        terms["reclaim_api"] = reclaim
        state = "met" if all(t["state"] == "met" for t in terms.values()) else "degraded"
        pools[name] = {"state": state, "failing": [k for k in TERMS if terms[k]["state"] != "met"], "terms": terms}
    return {"region": rt.region.name, "now": now, "pools": pools,
            "met": all(p["state"] == "met" for p in pools.values())}


def _reclaim_api(rt: Runtime, snap: Snapshot) -> dict:
    if not isinstance(rt.contract, ReclaimPort):
        return {"state": "missing", "evidence": {"error": "the contract feed offers no reclaim API"}}
    if not isinstance(rt.contract, ProviderStatus):
        # offered, but nothing was called this pass to show that it answers: not "met"
        return {"state": "unknown", "evidence": {"error": "the feed offers a reclaim API but no status call to "
                                                          "check that it answers"}}
    # the status call is made by observe(), with the other sources and under the same deadline
    if snap.provider_status_error is not None:
        return {"state": "missing", "evidence": {"error": snap.provider_status_error}}
    return {"state": "met", "evidence": {"status_call": "answered",
                                         "provider_view": _provider_reclaim_view(snap.provider_status)}}


def _provider_reclaim_view(body) -> object:
    """What the provider's status says of its reclaim API (kept as evidence, not trusted as ours)."""
    terms = body.get("terms") if isinstance(body, dict) else None
    if isinstance(terms, list):
        return next((t.get("state") for t in terms if isinstance(t, dict) and t.get("term") == "reclaim_api"), None)
    return None


def degraded_pools(report: dict) -> frozenset[str]:
    return frozenset(name for name, p in report["pools"].items() if p["state"] != "met")


def record_changes(rt: Runtime, report: dict) -> list[dict]:
    """Persist each pool's contract state; a flip writes an audit record and a lifecycle event."""
    changes = []
    now = report["now"]
    with rt.store.tx():
        for name, p in sorted(report["pools"].items()):
            key = f"contract:{name}"
            value = p["state"] if p["state"] == "met" else "degraded:" + ",".join(p["failing"])
            before = rt.store.get_value(key)
            if before == value:
                continue
            rt.store.set_value(key, value, now)
            if before is None and p["state"] == "met":
                continue  # first sight of a healthy pool: nothing to announce
            kind = "restored" if p["state"] == "met" else "degraded"
            evidence = {t: p["terms"][t] for t in p["failing"]} if p["failing"] else {}
            rt.store.audit(actor=rt.actor, action=f"contract.{kind}", target=name, result=value,
                           inputs={"previous": before, "failing": p["failing"], "evidence": evidence,
                                   "policy": "no-notice" if kind == "degraded" else "normal"}, at=now)
            rt.store.cloud_event(f"io.spotctl.contract.{kind}", name,
                                 {"pool": name, "state": value, "previous": before, "failing": p["failing"]}, now)
            log.warning("pool %s: provider contract %s (%s)", name, kind, ", ".join(p["failing"]) or "all terms met")
            changes.append({"pool": name, "from": before, "to": value})
    return changes


def record_late_notice(rt: Runtime, pool: str, notice: SeenNotice, now: float) -> dict | None:
    """Flip a pool's notice term where a late notice is seen (the watcher), not a pass later: the
    same record as a pass's flip (audit record + lifecycle event). None when it was not late, or the
    pool already counts its notice term as failing."""
    why = lateness(notice)
    if not why or pool not in rt.region.pools:
        return None
    key = f"contract:{pool}"
    before = rt.store.get_value(key)
    failing = sorted(set(before.split(":", 1)[1].split(",")) | {"notice"}) if before and before.startswith(
        "degraded:") else ["notice"]
    if before and before.startswith("degraded:") and "notice" in before.split(":", 1)[1].split(","):
        return None
    term = {"state": "degraded", "evidence": {"late": 1, "last_late": {"id": notice.id, "why": why,
                                                                      "issued_at": notice.issued_at}}}
    report = {"now": now, "pools": {pool: {"state": "degraded", "failing": failing, "terms": {"notice": term, **{
        t: {"state": "degraded", "evidence": {"recorded": before}} for t in failing if t != "notice"}}}}}
    changes = record_changes(rt, report)
    return changes[0] if changes else None


def check(rt: Runtime, pool: str | None = None) -> dict:
    """``spotctl contract check``: observe now and evaluate every term (records nothing)."""
    if pool is not None:
        rt.region.pool(pool)  # NotFoundError for an unknown pool
    snap = observe(rt)
    report = evaluate(rt, snap)
    report["degraded"] = dict(snap.degraded)  # the sources not read (failed, or past the observe deadline)
    if pool is not None:
        report["pools"] = {pool: report["pools"][pool]}
        report["met"] = report["pools"][pool]["state"] == "met"
    report["recorded"] = {name: rt.store.get_value(f"contract:{name}") for name in report["pools"]}
    return report
