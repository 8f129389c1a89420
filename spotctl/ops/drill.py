"""Reclaim drills (``spotctl exercise-reclaim``): rehearse the provider's reclaim and score it.

A drill picks victims in one pool under guardrails (a count or a percentage,
at most ``policy.drill_max_pool_pct`` of the pool, one drill per region at a
time), asks the provider's reclaim API to reclaim them in waves (each call
takes a token of the "drill" class), lets the reconciler handle the notices as
it would in production, and stops early when demand served drops below
``policy.drill_min_served_pct`` or a notice arrives with less than 120 s left.

The score, per victim: the notice was delivered within 1 s; it left >= 120 s
at receipt; the node was drained before the deadline; no running work was
lost; the capacity was returned (deleted, allocations freed) by the deadline.
Plus the time to a replacement when work had to move.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
from collections.abc import Callable

from spotctl.core.budget import Priority
from spotctl.core.errors import ConfigError, NotFoundError, RefusedError, StateError, UsageError
from spotctl.core.models import NodeState
from spotctl.core.ports import ReclaimPort

from .reconcile import run_pass
from .runtime import Runtime

log = logging.getLogger(__name__)

ACTIVE_KEY = "drill:active"
MIN_NOTICE = 120


def _key(drill_id: str) -> str:
    return f"drill:{drill_id}"


def load(rt: Runtime, drill_id: str) -> dict:
    raw = rt.store.get_value(_key(drill_id))
    if raw is None:
        raise NotFoundError(f"no drill {drill_id!r} in region {rt.region.name!r}",
                            hint="`spotctl exercise-reclaim list` shows the region's drills")
    return json.loads(raw)


def _save(rt: Runtime, drill: dict) -> None:
    rt.store.set_value(_key(drill["id"]), json.dumps(drill, sort_keys=True), rt.now())
    index = json.loads(rt.store.get_value("drill:index", "[]"))
    if drill["id"] not in index:
        index.append(drill["id"])
        rt.store.set_value("drill:index", json.dumps(index[-200:]), rt.now())


def drills(rt: Runtime) -> list[dict]:
    out = []
    for d in json.loads(rt.store.get_value("drill:index", "[]"))[::-1]:
        x = load(rt, d)
        out.append({k: x[k] for k in ("id", "pool", "status", "started_at", "finished_at") if k in x}
                   | {"victims": len(x["victims"])})
    return out


def select(rt: Runtime, pool: str, count: int | None, percent: float | None, notice: int, advisory_lead: int) -> dict:
    """Choose victims under the guardrails; nothing is changed."""
    rt.region.pool(pool)  # NotFoundError for an unknown pool
    if (count is None) == (percent is None):
        raise UsageError("give exactly one of --count or --percent")
    if notice < MIN_NOTICE:
        raise UsageError(f"--notice must be at least {MIN_NOTICE} s (the contract's minimum), got {notice}")
    if advisory_lead < 0:
        raise UsageError("--advisory-lead must be >= 0")
    if not isinstance(rt.contract, ReclaimPort):
        raise ConfigError(f"region {rt.region.name!r}: the contract feed offers no reclaim API to drill with")
    candidates = sorted((n for n in rt.store.nodes(live_only=True)
                         if n.pool == pool and n.state is NodeState.ACTIVE and n.instance_id and not n.notice_id),
                        key=lambda n: n.id)
    live = [n for n in rt.store.nodes(live_only=True) if n.pool == pool]
    if count is None:
        if not 0 < percent <= 100:
            raise UsageError(f"--percent must be in (0, 100], got {percent}")
        count = max(1, math.floor(len(live) * percent / 100))
    if count < 1:
        raise UsageError(f"--count must be at least 1, got {count}")
    cap = math.floor(len(live) * rt.region.policy.drill_max_pool_pct / 100)
    facts = {"pool": pool, "count": count, "candidates": len(candidates), "pool_nodes": len(live),
             "max_by_policy": cap, "notice_seconds": notice, "advisory_lead_seconds": advisory_lead}
    if count > cap:
        raise RefusedError(f"a drill may take at most {rt.region.policy.drill_max_pool_pct:g}% of pool {pool} "
                           f"({cap} of {len(live)} nodes); asked for {count}", details=facts,
                           hint="lower --count, or raise policy.drill_max_pool_pct")
    if count > len(candidates):
        raise RefusedError(f"pool {pool} has {len(candidates)} active nodes without a notice; asked for {count}",
                           details=facts)
    active = rt.store.get_value(ACTIVE_KEY)
    if active and load(rt, active)["status"] == "running":
        owner = load(rt, active).get("owner") or {}
        dead = not (owner.get("host") == socket.gethostname() and _alive(owner.get("pid")))
        raise RefusedError(f"drill {active} is still running in region {rt.region.name!r}: one drill at a time",
                           hint=f"its process is gone: `spotctl exercise-reclaim abort {active}`" if dead and owner
                           else f"`spotctl exercise-reclaim status {active}`")
    seed = f"{rt.region.name}|{pool}|{rt.now()}"
    chosen = sorted(candidates, key=lambda n: hashlib.sha1(f"{seed}|{n.id}".encode()).hexdigest())[:count]
    return {**facts, "victims": [{"node": n.id, "instance_id": n.instance_id} for n in chosen]}


def start(rt: Runtime, selection: dict) -> dict:
    now = rt.now()
    drill_id = "drill-" + hashlib.sha1(f"{rt.region.name}|{now}|{selection['pool']}".encode()).hexdigest()[:10]
    victims = selection["victims"]
    size = max(1, math.ceil(len(victims) / 3))
    drill = {"id": drill_id, "region": rt.region.name, "pool": selection["pool"], "status": "running",
             "started_at": now, "finished_at": None, "actor": rt.actor,
             "owner": {"host": socket.gethostname(), "pid": os.getpid()},  # who runs it (abort checks it is gone)
             "notice_seconds": selection["notice_seconds"], "advisory_lead_seconds": selection["advisory_lead_seconds"],
             "waves": [victims[i:i + size] for i in range(0, len(victims), size)], "issued": 0,
             "victims": [dict(v, wave=i // size) for i, v in enumerate(victims)], "abort_reason": None}
    with rt.store.tx():
        rt.store.set_value(ACTIVE_KEY, drill_id, now)
        _save(rt, drill)
        rt.store.audit(actor=rt.actor, action="drill.start", target=selection["pool"], result="running",
                       inputs={"drill": drill_id, **{k: v for k, v in selection.items() if k != "victims"},
                               "victims": [v["node"] for v in victims]}, at=now)
        rt.store.cloud_event("io.spotctl.drill.started", drill_id, {
            "drill": drill_id, "pool": selection["pool"], "victims": [v["node"] for v in victims],
            "notice_seconds": selection["notice_seconds"]}, now)
    return drill


def _issue_wave(rt: Runtime, drill: dict) -> None:
    wave = drill["waves"][drill["issued"]]
    if rt.take_token(Priority.DRILL, len(wave)) < len(wave):
        raise RefusedError("the token budget cannot cover this wave of reclaim calls now")
    ids, errors = _reclaim(rt, [v["instance_id"] for v in wave], drill)
    now = rt.now()
    for x in drill["victims"]:
        if x["instance_id"] in ids:
            x.update(notice_id=ids[x["instance_id"]], reclaimed_at=now)
        elif x["instance_id"] in errors:
            x.update(reclaim_error=errors[x["instance_id"]])  # refused by the provider: scored as failed
    drill["issued"] += 1
    result = "issued" if len(ids) == len(wave) else "partial" if ids else "failed"
    rt.store.audit(actor=rt.actor, action="drill.reclaim", target=drill["pool"], result=result,
                   inputs={"drill": drill["id"], "wave": drill["issued"], "nodes": [v["node"] for v in wave],
                           **({"refused": errors} if errors else {})}, at=now)


def _reclaim(rt: Runtime, instance_ids: list[str], drill: dict) -> tuple[dict[str, str | None], dict[str, str]]:
    """Call the provider's reclaim API (ReclaimPort, one signature on the simulator and the HTTP
    feed): instance id -> the notice (or advisory, with an advisory lead) it issued, and instance
    id -> why it was not reclaimed."""
    rec = rt.contract.reclaim(instance_ids, drill["notice_seconds"], drill["advisory_lead_seconds"], drill["id"])
    out: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for iid in instance_ids:
        r = rec.receipt(iid)
        if r is None or not r.ok:
            errors[iid] = (r.error if r is not None else None) or "no receipt"
            log.warning("drill %s: the reclaim API did not reclaim %s: %s", drill["id"], iid, errors[iid])
            continue
        out[iid] = r.notice_id or r.advisory_id
    drill.setdefault("reclaims", []).append(rec.id)
    return out, errors


def _stop_condition(rt: Runtime, drill: dict, last_pass) -> str | None:
    for n in rt.store.notices_since(drill["started_at"]):
        if n["kind"] == "hard" and n["deadline"] is not None and n["deadline"] - n["first_seen_at"] < MIN_NOTICE - 1:
            return f"notice {n['id']} arrived with {int(n['deadline'] - n['first_seen_at'])} s left (< {MIN_NOTICE} s)"
    if last_pass is not None and last_pass.plan is not None:
        d = last_pass.plan.demand
        pending = d.get("pending") or 0
        if pending >= 10:
            served = 100.0 * (pending - d.get("unplaced", 0)) / pending
            if served < rt.region.policy.drill_min_served_pct:
                return f"demand served dropped to {served:.0f}% (< {rt.region.policy.drill_min_served_pct:g}%)"
    return None


def _done(rt: Runtime, drill: dict) -> bool:
    grace = 60
    for v in drill["victims"]:
        if "reclaim_error" in v:
            continue  # the provider refused it: nothing to wait for
        if "reclaimed_at" not in v:
            return False
        node = rt.store.find_node(v["node"])
        if node is not None and node.live and rt.now() < v["reclaimed_at"] + drill["notice_seconds"] + grace:
            return False
    return True


def run(rt: Runtime, drill: dict, *, tick: Callable[[], None], progress: Callable[[dict], None] = lambda _: None,
        max_seconds: float = 1800, wait: float = 0.0) -> dict:
    """Issue the waves and let the reconciler handle them, until every victim is gone (or the time is up).
    Each wave's reclaim calls are made under the region lock (waiting up to ``wait`` s for it).

    Whatever stops it — an error, Ctrl-C, SIGTERM — the drill ends ``aborted`` with its partial score
    (audited), never ``running`` for good; the error then goes on to the caller."""
    try:
        return _run(rt, drill, tick=tick, progress=progress, max_seconds=max_seconds, wait=wait)
    except BaseException as e:
        if drill["status"] == "running":
            why = ("terminated" if type(e).__name__ == "Terminated" else "interrupted") if isinstance(
                e, KeyboardInterrupt) else (
                f"error: {getattr(e, 'message', None) or e}" if isinstance(e, Exception) else type(e).__name__)
            drill.update(status="aborted", abort_reason=f"{why}"[:300])
            try:
                _finish(rt, drill)
            except StateError as e2:  # the state database itself failed (read-only, deleted, damaged): no
                if not isinstance(e, StateError):  # traceback; said once, by the caller, when it is the cause
                    log.error("drill %s: could not record its end (%s); `spotctl exercise-reclaim abort %s`",
                              drill["id"], e2.message, drill["id"])
            except Exception:
                log.exception("drill %s: could not record its end; `spotctl exercise-reclaim abort %s`",
                              drill["id"], drill["id"])
        raise


def _run(rt: Runtime, drill: dict, *, tick: Callable[[], None], progress: Callable[[dict], None],
         max_seconds: float, wait: float = 0.0) -> dict:
    t_end = rt.now() + max_seconds
    last = None
    while True:
        if drill["status"] == "running" and drill["issued"] < len(drill["waves"]):
            reason = _stop_condition(rt, drill, last)
            if reason:
                drill.update(status="aborted", abort_reason=reason)
                rt.store.audit(actor=rt.actor, action="drill.abort", target=drill["pool"], result="aborted",
                               inputs={"drill": drill["id"], "reason": reason}, at=rt.now())
            else:  # the reclaim changes the (simulated) provider's world: under the region lock
                with rt.locked(wait, f"exercise-reclaim {drill['id']} wave {drill['issued'] + 1}, by {rt.actor}"):
                    _issue_wave(rt, drill)
        _save(rt, drill)
        rt.sync_world()
        last = run_pass(rt)  # handle what the provider just sent, at once
        progress(status(rt, drill["id"]))
        if (drill["issued"] >= len(drill["waves"]) or drill["status"] == "aborted") and _done(rt, drill):
            break
        if rt.now() > t_end:
            drill["abort_reason"] = drill["abort_reason"] or "time is up before every victim was handled"
            break
        tick()
    if drill["status"] == "running":
        drill["status"] = "done" if _done(rt, drill) else "timed-out"
    return _finish(rt, drill)


def _finish(rt: Runtime, drill: dict) -> dict:
    """End a drill as it stands (its status set by the caller): saved, no longer active, scored, audited."""
    drill["finished_at"] = rt.now()
    with rt.store.tx():
        _save(rt, drill)
        rt.store.set_value(ACTIVE_KEY, "", rt.now())
        rep = report(rt, drill["id"])
        rt.store.audit(actor=rt.actor, action="drill.finish", target=drill["pool"], result=drill["status"],
                       inputs={"drill": drill["id"], "score": rep["score"], "abort_reason": drill["abort_reason"]},
                       at=rt.now())
        rt.store.cloud_event("io.spotctl.drill.finished", drill["id"], {
            "drill": drill["id"], "pool": drill["pool"], "status": drill["status"], "score": rep["score"],
            "abort_reason": drill["abort_reason"]}, rt.now())
    return rep


def status(rt: Runtime, drill_id: str) -> dict:
    drill = load(rt, drill_id)
    states = {}
    for v in drill["victims"]:
        node = rt.store.find_node(v["node"])
        states[v["node"]] = str(node.state) if node else "unknown"
    return {"id": drill["id"], "pool": drill["pool"], "status": drill["status"], "waves": len(drill["waves"]),
            "issued": drill["issued"], "victims": states, "abort_reason": drill["abort_reason"],
            "started_at": drill["started_at"], "now": rt.now()}


def report(rt: Runtime, drill_id: str) -> dict:
    """Score a drill from what was recorded: notices, transitions, actions, audit records."""
    drill = load(rt, drill_id)
    notices = {n["id"]: n for n in rt.store.notices_since(drill["started_at"] - 1)}
    by_instance: dict[str, dict] = {}
    for n in notices.values():
        if n["kind"] == "hard":
            by_instance.setdefault(n["instance_id"], n)
    drains = {}  # node -> its first drain round every bound scheduler accepted (evidence, not the state change)
    for a in rt.store.audit_query(since=drill["started_at"] - 1, action="node.drain"):
        if a["result"] == "ok":
            drains.setdefault(a["target"], a)
    rows = []
    checks = passed = 0
    for v in drill["victims"]:
        if "reclaim_error" in v:  # the provider's reclaim API refused it: a failed check, not a skipped one
            rows.append({"node": v["node"], "reclaim_error": v["reclaim_error"]})
            checks += 1
            continue
        if "reclaimed_at" not in v:
            rows.append({"node": v["node"], "skipped": "not reclaimed (drill stopped before its wave)"})
            continue
        n = by_instance.get(v["instance_id"])  # the hard notice: what the notice checks are about
        first = notices.get(v.get("notice_id") or "")
        advised = first is not None and first["kind"] != "hard"
        trans = rt.store.transitions(v["node"])
        at = {t["to_state"]: t["at"] for t in trans}
        if n is not None:
            deadline = n["deadline"]
        elif advised and first["deadline"] is not None:
            deadline = first["deadline"]  # the advisory announces when the hard notice's deadline falls
        else:
            deadline = v["reclaimed_at"] + drill.get("advisory_lead_seconds", 0) + drill["notice_seconds"]
        latency = None if not n or n.get("delivered_at") is None else round(n["delivered_at"] - n["issued_at"], 3)
        left = None if not n else round(n["deadline"] - n["first_seen_at"], 1)
        lead = None if not n or n["deadline"] is None else round(n["deadline"] - n["issued_at"], 1)
        drain = drains.get(v["node"])
        drained_at = drain["at"] if drain is not None else None
        running = (drain or {}).get("inputs", {}).get("running", 0) or 0
        drained_in_time = drained_at is not None and drained_at <= deadline
        returned_at = at.get("deleting")
        # returned by us: deleted, and its release verified — not taken back by the provider at the deadline
        gone = any(t["to_state"] == "gone" and not t["reason"].startswith("reclaimed after notice") for t in trans)
        replacement = _replacement_time(rt, drill, v, drained_at) if running else None
        # With an advisory lead the node may be drained and returned before the hard notice comes:
        # the notice's own checks (delivery, lead) were then not exercised — neither passed nor failed.
        unchecked = ["delivery_latency", "notice_lead"] if n is None and advised and "gone" in at else []
        if drain is not None and "running" not in drain.get("inputs", {}):
            unchecked.append("jobs_lost")  # that round did not say what ran there (a watcher round)
        row = {
            "node": v["node"], "notice": n["id"] if n else None, "advisory": first["id"] if advised else None,
            "unchecked": unchecked, "delivery_latency_s": latency,
            "notice_lead_s": lead, "left_at_receipt_s": left, "drained_at": drained_at, "drained_before_deadline": drained_in_time,
            "jobs_requeued": running if drained_in_time else 0, "jobs_lost": 0 if drained_in_time else running,
            "time_to_replacement_s": replacement,
            "capacity_returned_by_deadline": bool(returned_at is not None and returned_at <= deadline and gone),
            "final_state": trans[-1]["to_state"] if trans else None,
        }
        for name, ok in (("delivery_latency", latency is not None and latency <= 1.0),
                         ("notice_lead", lead is not None and lead >= MIN_NOTICE),
                         ("drained_before_deadline", drained_in_time), ("jobs_lost", row["jobs_lost"] == 0),
                         ("capacity_returned", row["capacity_returned_by_deadline"])):
            if name in unchecked:
                continue
            checks += 1
            passed += int(bool(ok))
        rows.append(row)
    return {"id": drill["id"], "region": drill["region"], "pool": drill["pool"], "status": drill["status"],
            "abort_reason": drill["abort_reason"], "started_at": drill["started_at"],
            "finished_at": drill["finished_at"], "notice_seconds": drill["notice_seconds"],
            "score": round(100.0 * passed / checks, 1) if checks else None, "checks": checks, "passed": passed,
            "victims": rows}


def _replacement_time(rt: Runtime, drill: dict, victim: dict, drained_at: float | None) -> float | None:
    """Seconds from the reclaim to a node launched afterwards (elsewhere) becoming active."""
    t0 = victim["reclaimed_at"]
    times = [at - t0 for node, at in rt.store.activations_since(t0) if node != victim["node"]]
    return round(min(times), 1) if times else None


def abort(rt: Runtime, drill_id: str, reason: str | None = None) -> dict:
    """End a drill whose process died (``running`` without a live owner): aborted with its partial score,
    audited. Refused while its owner process still runs on this host (Ctrl-C it instead)."""
    drill = load(rt, drill_id)
    if drill["status"] != "running":
        raise RefusedError(f"drill {drill_id} is {drill['status']}, not running: nothing to abort")
    owner = drill.get("owner") or {}
    if owner.get("host") == socket.gethostname() and _alive(owner.get("pid")):
        raise RefusedError(f"drill {drill_id} is still run by process {owner['pid']} on this host",
                           hint="stop that process (Ctrl-C): the drill then ends aborted by itself")
    why = reason or (f"its process ({owner.get('pid')} on {owner.get('host')}) is gone" if owner
                     else "aborted by an operator")
    drill.update(status="aborted", abort_reason=why[:300])
    rt.store.audit(actor=rt.actor, action="drill.abort", target=drill["pool"], result="aborted",
                   inputs={"drill": drill_id, "reason": why[:300], "owner": owner}, at=rt.now())
    return _finish(rt, drill)


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
