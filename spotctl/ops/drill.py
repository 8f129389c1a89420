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
this module runs and records the drill, :mod:`spotctl.ops.drill_record` reads the
record back and gathers its facts. Before the first wave, :func:`select_when_ready`
waits (bounded, a pass at a time) for a pool's booting nodes.
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
from spotctl.core.drill import MIN_NOTICE_SECONDS, replacement_settled, shortfall_ready_at, stop_reason, victim_handled
from spotctl.core.errors import ConfigError, RefusedError, StateError, UsageError
from spotctl.core.models import NodeState
from spotctl.core.ports import ReclaimPort
from spotctl.core.timefmt import iso

from .contract import seen_notice
from .drill_record import INDEX_KEY, drills, facts, key, load, replacements, report, status
from .metrics import record_drill_score
from .reconcile import run_pass
from .runtime import Runtime

__all__ = ["ACTIVE_KEY", "abort", "drills", "facts", "load", "replacements", "report", "run", "select",
           "select_when_ready", "start", "status"]

log = logging.getLogger(__name__)

ACTIVE_KEY = "drill:active"
MIN_NOTICE = MIN_NOTICE_SECONDS


def _save(rt: Runtime, drill: dict) -> None:
    rt.store.set_value(key(drill["id"]), json.dumps(drill, sort_keys=True), rt.now())
    index = json.loads(rt.store.get_value(INDEX_KEY) or "[]")
    if drill["id"] not in index:
        index.append(drill["id"])
        rt.store.set_value(INDEX_KEY, json.dumps(index[-200:]), rt.now())


def busiest_pool(rt: Runtime) -> str:
    """The pool a drill without ``--pool`` takes: the one with the most live nodes of ours (ties: by name), so
    that its share under ``policy.drill_max_pool_pct`` is the largest. Refused when no pool has a node yet."""
    counts: dict[str, int] = {}
    for n in rt.store.nodes(live_only=True):
        if n.pool in rt.region.pools:
            counts[n.pool] = counts.get(n.pool, 0) + 1
    if not counts:
        raise RefusedError(f"region {rt.region.name!r} has no live spot nodes to drill yet",
                           hint="`spotctl reconcile` launches them for pending work; or give --pool")
    return min(counts, key=lambda p: (-counts[p], p))


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
    if not live:  # nothing to take a share of: say what the pool lacks, not that 1 is over 0 %
        raise _not_ready(rt, pool, count, 0, live, facts)
    if count > cap:
        raise RefusedError(f"a drill may take at most {rt.region.policy.drill_max_pool_pct:g}% of pool {pool} "
                           f"({cap} of {len(live)} nodes); asked for {count}", details=facts,
                           hint="lower --count, or raise policy.drill_max_pool_pct")
    if count > len(candidates):
        raise _not_ready(rt, pool, count, len(candidates), live, facts)
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


BOOTING = (NodeState.INTENDED, NodeState.BUILDING)
#: seconds past the expected boot that the suggested --wait-ready allows (a pass must then see them active)
WAIT_READY_SLACK = 30


def _not_ready(rt: Runtime, pool: str, count: int, active: int, live: list, facts: dict) -> RefusedError:
    """The refusal when a pool has too few active nodes without a notice: what the others are doing, and
    when enough of its booting nodes are expected active (each one's launch time + the pool's boot time)."""
    boot = rt.region.pool(pool).boot_seconds
    booting = [n.created_at + boot for n in live if n.state in BOOTING]
    others: dict[str, int] = {}
    for n in live:
        if n.state not in BOOTING and not (n.state is NodeState.ACTIVE and not n.notice_id):
            label = "active with a notice" if n.state is NodeState.ACTIVE else str(n.state)
            others[label] = others.get(label, 0) + 1
    now = rt.now()
    ready_at = shortfall_ready_at(count - active, booting)
    msg = f"pool {pool} has {active} active nodes without a notice; asked for {count}"
    if others:
        msg += " (not eligible: " + ", ".join(f"{k} {v}" for k, v in sorted(others.items())) + ")"
    details = {**facts, "active": active, "booting": len(booting), "boot_seconds": boot, "ready_at": ready_at,
               "not_eligible": others}
    if ready_at is None:
        msg += f"; only {len(booting)} more are booting" if booting else "; none is booting"
        return RefusedError(msg, details=details, hint=f"launch more first (`spotctl launch --pool {pool}`; they "
                                                        f"boot in about {boot} s), or drill fewer")
    when = iso(ready_at, sep=" ")
    if ready_at > now:
        msg += (f"; {len(booting)} more are booting: enough of them are expected active at {when} (in "
                f"{math.ceil(ready_at - now)} s: each node's launch time + the pool's boot time of {boot} s)")
        wait = math.ceil(ready_at - now) + WAIT_READY_SLACK
        hint = (f"run the same command with --wait-ready {wait} (it runs a reconcile pass when they are due and "
                f"starts the drill once they are active), or run `spotctl reconcile` after {when} and try again")
    else:
        msg += (f"; {len(booting)} booting nodes were expected active by {when} (their launch time + the "
                f"pool's boot time of {boot} s): no reconcile pass has seen them active since")
        hint = "run `spotctl reconcile` and try again, or add --wait-ready SECONDS (it runs passes until then)"
    return RefusedError(msg, details=details, hint=hint)


def select_when_ready(rt: Runtime, pool: str, count: int | None, percent: float | None, notice: int,
                      advisory_lead: int, *, wait_ready: float, tick: Callable[[], None],
                      progress: Callable[[dict], None] = lambda _: None) -> dict:
    """:func:`select`, waiting up to ``wait_ready`` seconds for the pool's booting nodes when too few are
    active yet and enough are expected active within that time (the refusal's ``ready_at``).

    Nothing waits inside a pass: this runs one reconcile pass at once (nodes may have booted since the
    last one) and then one after each ``tick()`` once they are due, each under the region lock and
    released in between. ``progress`` gets what is awaited at each step. Still short at the end (or when
    they cannot make it in time): the refusal, saying when they will be ready."""
    t_end = rt.now() + wait_ready
    passed_at: float | None = None
    while True:
        try:
            return select(rt, pool, count, percent, notice, advisory_lead)
        except RefusedError as e:
            at = e.details.get("ready_at")
            now = rt.now()
            if wait_ready <= 0 or at is None or at > t_end or now >= t_end:
                raise
            if passed_at is None or (now >= at and now > passed_at):
                run_pass(rt)  # marks the nodes that have booted active
                passed_at = rt.now()
                continue
            progress({**e.details, "pool": pool, "now": now, "until": t_end, "message": e.message})
        tick()


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


#: how long a wave may wait for its tokens (the drill class keeps a reserve for every class above it)
TOKEN_WAIT_SECONDS = 300


def _issue_wave(rt: Runtime, drill: dict) -> bool:
    """Send the next wave's reclaim calls, one token of the "drill" class each; False (nothing sent) while
    the budget cannot cover them yet: the wave waits for the bucket to refill, up to TOKEN_WAIT_SECONDS."""
    wave = drill["waves"][drill["issued"]]
    now = rt.now()
    if rt.bucket().available(Priority.DRILL, now) < len(wave) or rt.take_token(Priority.DRILL, len(wave)) < len(wave):
        drill.setdefault("tokens_short_since", now)
        b = rt.bucket()
        drill["waiting_for"] = (f"{len(wave)} token(s) for wave {drill['issued'] + 1} (the drill class leaves "
                                f"{b.reserve(Priority.DRILL):g} of {b.burst} to higher classes; refills {b.rate:g}/s)")
        return False
    drill.pop("tokens_short_since", None)
    drill["waiting_for"] = None
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
    return True


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
    short = drill.get("tokens_short_since")
    if short is not None and rt.now() - short >= TOKEN_WAIT_SECONDS:
        return (f"the token budget could not cover wave {drill['issued'] + 1} for {TOKEN_WAIT_SECONDS} s "
                "(higher classes used it)")
    demand = last_pass.plan.demand if last_pass is not None and last_pass.plan is not None else None
    return stop_reason((seen_notice(n) for n in rt.store.notices_since(drill["started_at"])), demand,
                       rt.region.policy.drill_min_served_pct)


def _done(rt: Runtime, drill: dict) -> bool:
    """Every victim handled (:func:`victim_handled`), and every replacement launched for one active or
    given up on (:func:`replacement_settled`), so that the time to a replacement is measured."""
    now = rt.now()
    if not all(replacement_settled(r, now) for rs in replacements(rt, drill).values() for r in rs):
        return False
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
        record_drill_score(rt, drill["pool"], rep["score"])
        rt.store.audit(actor=rt.actor, action="drill.finish", target=drill["pool"], result=drill["status"],
                       inputs={"drill": drill["id"], "score": rep["score"], "abort_reason": drill["abort_reason"]},
                       at=rt.now())
        rt.store.cloud_event("io.spotctl.drill.finished", drill["id"], {
            "drill": drill["id"], "pool": drill["pool"], "status": drill["status"], "score": rep["score"],
            "abort_reason": drill["abort_reason"]}, rt.now())
    return rep


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
