"""Provider-contract conformance: the five terms, per pool, with evidence.

The terms and their rules are pure functions in :mod:`spotctl.core.contract` (a term is ``met`` only on
evidence observed); this module gathers what was observed (this pass's snapshot, the notices on record,
which ports the feed offers) into :class:`~spotctl.core.contract.ContractFacts`, and records each flip
(audit record + lifecycle event) where a pool's state changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from spotctl.core.contract import (
    TERMS,
    WINDOW_SECONDS,
    ContractFacts,
    ReclaimApiFacts,
    SeenNotice,
    change_kind,
    degraded_pools,
    late_notice_report,
    recorded_value,
)
from spotctl.core.contract import evaluate as evaluate_terms
from spotctl.core.ports import ProviderStatus, ReclaimPort

from .observe import Snapshot, observe
from .runtime import Runtime

log = logging.getLogger(__name__)

__all__ = ["TERMS", "check", "degraded_pools", "evaluate", "facts", "record_changes", "record_late_notice",
           "seen_notice"]


def seen_notice(row: Mapping) -> SeenNotice:
    """A notice as recorded by the store (a ``notices`` row), as an observed fact."""
    return SeenNotice(id=row["id"], issued_at=row["issued_at"], deadline=row["deadline"],
                      first_seen_at=row.get("first_seen_at"), delivered_at=row.get("delivered_at"),
                      kind=str(row["kind"]), instance_id=row.get("instance_id"), pool=row.get("pool"),
                      reason=row.get("reason") or "")


def facts(rt: Runtime, snap: Snapshot) -> ContractFacts:
    """What this pass observed of the contract: the snapshot, the notices on record in the window (this
    pass's count even before they are recorded: seen now), and which calls the feed offers."""
    now = snap.now
    seen = {n["id"]: seen_notice(n) for n in rt.store.notices_since(now - WINDOW_SECONDS)}
    for nt in snap.notices:
        seen.setdefault(nt.id, SeenNotice(id=nt.id, issued_at=nt.issued_at, deadline=nt.deadline, first_seen_at=now,
                                          delivered_at=nt.delivered_at, kind=str(nt.kind),
                                          instance_id=nt.instance_id, pool=nt.pool, reason=nt.reason or ""))
    reservations: dict[str, int] = {}
    for r in snap.reservations:
        reservations[r.pool] = reservations.get(r.pool, 0) + 1
    offered = isinstance(rt.contract, ReclaimPort)
    # the status call is made by observe(), with the other sources and under the same deadline
    status_call = offered and isinstance(rt.contract, ProviderStatus)
    pol = rt.region.policy
    return ContractFacts(
        now=now, provides_notices=bool(rt.contract.provides_notices), notices_error=snap.degraded.get("notices"),
        notices=tuple(seen.values()), rate_card=snap.rate_card, rate_card_error=snap.degraded.get("rate_card"),
        cloud_error=snap.degraded.get("cloud"), reads_reservations=bool(rt.cloud.reads_reservations),
        reservations=reservations,
        reclaim=ReclaimApiFacts(offered=offered, status_call=status_call,
                                status_error=snap.provider_status_error if status_call else None,
                                provider_status=snap.provider_status if status_call else None),
        restore_notices=pol.contract_restore_notices, restore_hold_seconds=pol.contract_restore_hold_seconds)


def evaluate(rt: Runtime, snap: Snapshot) -> dict:
    """Each term per pool, with evidence, from this pass's observation and the notices on record."""
    report = evaluate_terms(rt.region.name, rt.region.pools, facts(rt, snap))
    if log.isEnabledFor(logging.INFO):
        by_state: dict[str, list[str]] = {}
        for name, p in report["pools"].items():
            by_state.setdefault(p["state"], []).append(name + (f" ({', '.join(p['failing'])})" if p["failing"] else ""))
        log.info("contract: %s", "; ".join(f"{state} {', '.join(names)}" for state, names in sorted(by_state.items())))
    return report


def record_changes(rt: Runtime, report: dict) -> list[dict]:
    """Persist each pool's contract state; a flip writes an audit record and a lifecycle event."""
    changes = []
    now = report["now"]
    with rt.store.tx():
        for name, p in sorted(report["pools"].items()):
            key = f"contract:{name}"
            value = recorded_value(p)
            before = rt.store.get_value(key)
            if before == value:
                continue
            rt.store.set_value(key, value, now)
            kind = change_kind(before, p)
            if kind is None:
                continue  # first sight of a healthy pool: nothing to announce
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
    if pool not in rt.region.pools:
        return None
    report = late_notice_report(pool, rt.store.get_value(f"contract:{pool}"), notice, now)
    if report is None:
        return None
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
