"""The fast path: ``spot-reconciler watch`` long-polls the provider's notice log and
handles each notice at once (target: <= 2 s from receipt to drains accepted).

It shares the region's state database, lock and token budget with the timer's
passes: a notice is handled under the same lock (waiting briefly if a pass holds
it), through the same actions, intents, audit records and outbox. The notice
cursor is persisted after each batch is handled, so nothing is missed or handled
twice across restarts (handling is idempotent: a node already draining is left).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from spotctl.core.actions import Action, ActionKind
from spotctl.core.budget import Priority
from spotctl.core.contract import SeenNotice
from spotctl.core.errors import ConfigError, RefusedError, SpotctlError
from spotctl.core.lifecycle import forced_round
from spotctl.core.models import Node, NodeState, Notice, NoticeKind
from spotctl.core.notices import decide_notice
from spotctl.core.ports import NoticeStream

from . import contract
from .act import Outcome, execute, execute_drains
from .runtime import Runtime
from .sync import notice_event

log = logging.getLogger(__name__)

CURSOR_KEY = "contract:notice-cursor"
LOCK_WAIT_SECONDS = 10.0


def _stream(rt: Runtime):
    if not isinstance(rt.contract, NoticeStream):
        raise ConfigError(
            f"region {rt.region.name!r}: the watcher needs a contract feed with a notice log",
            hint=f"configure [regions.{rt.region.name}.contract] with the provider's url "
                 "(try `spotctl sim serve` for the demo region)")
    return rt.contract


def _lock(rt: Runtime, stop: threading.Event) -> None:
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while not rt.lock(purpose="notice handling, by the watcher"):
        if stop.is_set() or time.monotonic() > deadline:
            raise RefusedError("the region lock stayed busy; the next pass will handle the notice")
        time.sleep(0.02)


def handle(rt: Runtime, notice: Notice, received_at: float, stop: threading.Event | None = None) -> dict:
    """Act on one notice now. Returns what was done and how fast."""
    return handle_batch(rt, [notice], received_at, stop)[0]


def handle_batch(rt: Runtime, notices: list[Notice], received_at: float,
                 stop: threading.Event | None = None) -> list[dict]:
    """Act on a batch of notices now, all at once, as the planner would (:func:`~spotctl.core.notices.decide_notice`):
    every hard notice's node is drained in every scheduler concurrently (a reclaim storm of 50 notices
    in one poll is cordoned within seconds), advisories cordon (or drain, when their reclaim is near).
    One event per notice: what was done and how fast."""
    stop = stop or threading.Event()
    t0 = time.monotonic()
    rt.store.defer_checkpoints()  # no commit of the fast path copies the log (see checkpoint() below)
    events: list[dict] = []
    todo: list[tuple[dict, Action, Node, Notice]] = []
    taken: set[str] = set()  # the nodes a notice of this batch already acts on (a storm: one lookup each)
    for notice in notices:
        out: dict = {"notice": notice.id, "kind": str(notice.kind), "instance_id": notice.instance_id,
                     "deadline_in_s": None if notice.deadline is None else round(notice.deadline - received_at, 3),
                     "delivery_latency_s": None if notice.delivered_at is None else
                     round(notice.delivered_at - notice.issued_at, 3)}
        events.append(out)
        node = rt.store.node_by_instance(notice.instance_id)
        with rt.store.tx():
            new = rt.store.see_notice(notice_id=notice.id, node_id=node.id if node else None,
                                      instance_id=notice.instance_id, kind=str(notice.kind),
                                      issued_at=notice.issued_at, deadline=notice.deadline, reason=notice.reason,
                                      at=received_at, delivered_at=notice.delivered_at,
                                      pool=notice.pool or (node.pool if node else None))
            if new and node is not None:
                notice_event(rt.store, notice, node, received_at)
        pool = notice.pool or (node.pool if node else None)
        if notice.kind is NoticeKind.HARD and pool:
            flip = contract.record_late_notice(rt, pool, SeenNotice(
                id=notice.id, issued_at=notice.issued_at, deadline=notice.deadline, first_seen_at=received_at,
                delivered_at=notice.delivered_at), received_at)
            if flip:
                out["contract_change"] = flip
        if node is None or not node.live:
            out["action"] = "none: not one of our live nodes"
            continue
        # the planner's rule (one decision in core); the watcher reads no scheduler, so a node still
        # booting is not known to one: the next pass cordons it once it has registered
        decision = decide_notice(notice, node.state, received_at, rt.region.policy, cordoned=node.cordoned,
                                 cordoned_by_us=node.cordoned, known=node.state is not NodeState.BUILDING)
        if decision is None or decision.kind is None:
            out["action"] = f"none: {decision.reason}" if decision else f"none: node {node.id} is {node.state}"
            continue
        if node.id in taken:
            out["action"] = f"none: node {node.id} is handled by another notice of this batch"
            continue
        kind = decision.kind
        action = Action(id="w-" + hashlib.sha1(f"{notice.id}|{kind}".encode()).hexdigest()[:12], kind=kind,
                        priority=decision.priority, reason=f"{decision.reason}, handled by the watcher",
                        pool=node.pool, node=node.id, deadline=decision.deadline,
                        inputs={**decision.inputs, "received_at": received_at, "source": "watcher"})
        todo.append((out, action, node, notice))
        taken.add(node.id)
    if not todo:
        rt.store.checkpoint()
        return events
    _lock(rt, stop)
    try:
        drains = []
        for out, action, node, notice in todo:
            fresh = rt.store.node(node.id)
            if notice.kind is NoticeKind.HARD and fresh.notice_id != notice.id:  # recorded as observe does
                rt.store.update_node(fresh, notice_id=notice.id, notice_deadline=notice.deadline)
            if action.kind == "drain":
                drains.append((out, action))
        results = dict(zip((a.id for _, a in drains), execute_drains(rt, [a for _, a in drains], None)))
        for out, action, node, _ in todo:
            result: Outcome = results[action.id] if action.id in results else execute(rt, action, None)
            out.update(action=action.kind, node=node.id, status=result.status,
                       seconds_to_accepted=round(time.monotonic() - t0, 4),
                       schedulers=result.data.get("accepted_seconds"))
    finally:
        rt.unlock()
    rt.store.checkpoint()  # the log into the database once the drains are accepted, not inside a commit
    return events


def continue_drains(rt: Runtime) -> list[Outcome]:
    """One more drain round on every node draining for a hard notice (evict what is left; near the
    deadline, the forced last round), between notice batches, so the fast path keeps emptying nodes
    between timer passes. Never waits: when a pass holds the region lock, that pass does it."""
    now = rt.now()
    nodes = [n for n in rt.store.nodes(states=(NodeState.DRAINING,))
             if n.notice_deadline is not None and n.notice_deadline > now]
    if not nodes or not rt.lock(purpose="drain rounds, by the watcher"):
        return []
    outs = []
    try:
        for n in nodes:
            force = forced_round(n.notice_deadline, now)
            action = Action(id="wc-" + hashlib.sha1(f"{n.id}|{now:.3f}".encode()).hexdigest()[:12], kind=ActionKind.DRAIN,
                            priority=Priority.RECLAIM, reason=f"drain continues (notice {n.notice_id}), by the watcher"
                            + ("; last round before the deadline" if force else ""), pool=n.pool, node=n.id,
                            deadline=n.notice_deadline,
                            inputs={"notice": n.notice_id, "continue": True, "source": "watcher",
                                    **({"force": True} if force else {})})
            outs.append(execute(rt, action, None))
    finally:
        rt.unlock()
    rt.store.checkpoint()
    return outs


def watch(rt: Runtime, *, stop: threading.Event, wait: float = 20.0, max_batches: int | None = None,
          on_event: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
    """Long-poll and handle notices until ``stop`` is set. Returns counters."""
    stream = _stream(rt)
    cursor = rt.store.get_value(CURSOR_KEY)
    stats: dict[str, Any] = {"batches": 0, "notices": 0, "handled": 0, "errors": 0, "cursor": cursor}
    backoff = 1.0
    idle = 0.0  # a feed that answers "nothing new" at once (no long-poll) is asked less and less often
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            notices, nxt = stream.poll(cursor, wait)
            backoff = 1.0
        except SpotctlError as e:
            stats["errors"] += 1
            log.warning("notice feed: %s (retrying in %.0fs)", e.message, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
            continue
        received = rt.now()
        stats["notices"] += len(notices)
        try:
            evs = handle_batch(rt, notices, received, stop) if notices else []
        except SpotctlError as e:
            stats["errors"] += 1
            evs = [{"notice": nt.id, "error": e.message} for nt in notices]
            log.warning("notices %s: %s", ", ".join(nt.id for nt in notices), e.message)
        for ev in evs:
            if ev.get("status"):
                stats["handled"] += 1
            log.info("notice %s: %s", ev["notice"], ev)
            if on_event:
                on_event(ev)
        if nxt != cursor:
            cursor = nxt
            rt.store.set_value(CURSOR_KEY, cursor, received)
        try:
            stats["drain_rounds"] = stats.get("drain_rounds", 0) + len(continue_drains(rt))
        except SpotctlError as e:
            stats["errors"] += 1
            log.warning("continuing drains: %s", e.message)
        stats["cursor"] = cursor
        stats["batches"] += 1
        if max_batches is not None and stats["batches"] >= max_batches:
            break
        if not notices and wait > 0 and time.monotonic() - t0 < wait / 2:
            idle = min(max(idle * 2, 0.25), wait)  # it did not hold the poll: back off, up to one wait
            stats["idle_waits"] = stats.get("idle_waits", 0) + 1
            stop.wait(idle)
        else:
            idle = 0.0
    return stats
