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
Plus the time to a replacement when work had to move. The rules (scoring, when
to stop, when a victim is handled) are pure functions in :mod:`spotctl.core.drill`;
this module gathers what was recorded into its facts and records the drill.
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
from spotctl.core.contract import SeenNotice
from spotctl.core.drill import (
    MIN_NOTICE_SECONDS,
    DrainRound,
    DrillFacts,
    SeenTransition,
    VictimFacts,
    stop_reason,
    victim_handled,
)
from spotctl.core.drill import score as score_drill
from spotctl.core.errors import ConfigError, NotFoundError, RefusedError, StateError, UsageError
from spotctl.core.models import NodeState
from spotctl.core.ports import ReclaimPort

from .contract import seen_notice
from .reconcile import run_pass
from .runtime import Runtime

log = logging.getLogger(__name__)

ACTIVE_KEY = "drill:active"
MIN_NOTICE = MIN_NOTICE_SECONDS


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
    index = json.loads(rt.store.get_value("drill:index") or "[]")
    if drill["id"] not in index:
        index.append(drill["id"])
        rt.store.set_value("drill:index", json.dumps(index[-200:]), rt.now())


def drills(rt: Runtime) -> list[dict]:
    out = []
    for d in json.loads(rt.store.get_value("drill:index") or "[]")[::-1]:
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
        assert percent is not None  # exactly one of them, checked above
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
    if not isinstance(rt.contract, ReclaimPort):  # select() refused such a region already
        raise ConfigError(f"region {rt.region.name!r}: the contract feed offers no reclaim API to drill with")
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
    demand = last_pass.plan.demand if last_pass is not None and last_pass.plan is not None else None
    return stop_reason((seen_notice(n) for n in rt.store.notices_since(drill["started_at"])), demand,
                       rt.region.policy.drill_min_served_pct)


def _done(rt: Runtime, drill: dict) -> bool:
    for v in drill["victims"]:
        asked = "reclaimed_at" in v and "reclaim_error" not in v  # only then does its node matter
        node = rt.store.find_node(v["node"]) if asked else None
        if not victim_handled(refused="reclaim_error" in v, reclaimed_at=v.get("reclaimed_at"),
                              live=node is not None and node.live, now=rt.now(),
                              notice_seconds=drill["notice_seconds"]):
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
    """Score a drill (:func:`spotctl.core.drill.score`) from what was recorded: notices, transitions,
    accepted drain rounds (audit records), activations."""
    drill = load(rt, drill_id)
    return {"id": drill["id"], "region": drill["region"], "pool": drill["pool"], "status": drill["status"],
            "abort_reason": drill["abort_reason"], "started_at": drill["started_at"],
            "finished_at": drill["finished_at"], "notice_seconds": drill["notice_seconds"],
            **score_drill(facts(rt, drill))}


def facts(rt: Runtime, drill: dict) -> DrillFacts:
    """What was recorded of a drill's victims, as the facts its score is computed from."""
    notices = {n["id"]: seen_notice(n) for n in rt.store.notices_since(drill["started_at"] - 1)}
    hard_by_instance: dict[str | None, SeenNotice] = {}
    for n in notices.values():
        if n.kind == "hard":
            hard_by_instance.setdefault(n.instance_id, n)
    drains: dict[str, DrainRound] = {}  # node -> its first drain round every bound scheduler accepted
    for a in rt.store.audit_query(since=drill["started_at"] - 1, action="node.drain"):
        if a["result"] == "ok" and a["target"] not in drains:
            inputs = a.get("inputs") or {}
            drains[a["target"]] = DrainRound(at=a["at"], running=(inputs["running"] or 0) if "running" in inputs
                                             else None)
    victims = []
    for v in drill["victims"]:
        if "reclaim_error" in v or "reclaimed_at" not in v:
            victims.append(VictimFacts(node=v["node"], instance_id=v.get("instance_id"),
                                       reclaim_error=v.get("reclaim_error")))
            continue
        victims.append(VictimFacts(
            node=v["node"], instance_id=v.get("instance_id"), reclaimed_at=v["reclaimed_at"],
            hard_notice=hard_by_instance.get(v.get("instance_id")), first_notice=notices.get(v.get("notice_id") or ""),
            drain=drains.get(v["node"]),
            transitions=tuple(SeenTransition(t["to_state"], t["at"], t["reason"] or "")
                              for t in rt.store.transitions(v["node"])),
            activations=tuple(rt.store.activations_since(v["reclaimed_at"]))))
    return DrillFacts(notice_seconds=drill["notice_seconds"],
                      advisory_lead_seconds=drill.get("advisory_lead_seconds", 0), victims=tuple(victims))


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
