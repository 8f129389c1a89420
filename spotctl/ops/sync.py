"""Sync: bring our node records in line with what a pass observed (``ops.observe``'s snapshot).

A node whose instance went ACTIVE is active; one the cloud gave up on is failed (and the pool
remembered as full for a while); a tagged instance we have no record of is adopted; a node whose
instance vanished is gone or lost; a hard notice is attached to its node. Every change is committed
in one transaction; the calls that follow it (one step of a building instance, a scheduler told to
forget a node) are made after it, never inside (rule 2).
"""


from __future__ import annotations

import logging

from spotctl.core.budget import Priority
from spotctl.core.capacity import also_full
from spotctl.core.errors import SpotctlError
from spotctl.core.lifecycle import plannable
from spotctl.core.models import Instance, Node, NodeState, Notice, NoticeKind, PoolSpec

from .observe import Snapshot
from .runtime import Runtime

log = logging.getLogger(__name__)


def sync_nodes(rt: Runtime, snap: Snapshot) -> tuple[dict[str, int], list[Node]]:
    """Bring node records in line with the cloud; adopt tagged strangers; attach notices.

    Returns counts of what changed, and the live nodes afterwards.
    """
    # Observe first, then write, then tell: no network call inside the write transaction (a slow
    # cloud or scheduler must not hold the database's write lock).
    released = _check_released(rt, snap)
    with rt.store.tx():  # one transaction: cheap when nothing changed, atomic when something did
        changed, live, vanished, steps = _sync_nodes(rt, snap, released)
    for node in vanished:
        _forget(rt, node)
    if steps:
        changed["advanced"] = _advance(rt, steps)
    return changed, live


def _check_released(rt: Runtime, snap: Snapshot) -> dict[str, bool]:
    """Instance id -> allocations freed, for the deleting/failed nodes the cloud no longer lists."""
    if snap.instances is None:
        return {}
    listed = {i.action_id for i in snap.instances}
    return {n.instance_id: _released(rt, n.instance_id)
            for n in rt.store.nodes(states=(NodeState.DELETING, NodeState.FAILED))
            if n.instance_id and n.action_id not in listed}


def _sync_nodes(rt: Runtime, snap: Snapshot,
                released: dict[str, bool]) -> tuple[dict[str, int], list[Node], list[Node],
                                                    list[tuple[Node, Instance]]]:
    store, now, actor = rt.store, snap.now, rt.actor
    vanished: list[Node] = []  # gone or lost: the schedulers forget them after the transaction
    steps: list[tuple[Node, Instance]] = []  # building instances that need one call to go on, made after the transaction
    changed = {"adopted": 0, "active": 0, "failed": 0, "lost": 0, "gone": 0, "noticed": 0, "advanced": 0}
    # live nodes, and failed ones whose instance may still exist (an ERROR server): the planner deletes those
    nodes = store.nodes(live_only=True) + [n for n in store.nodes(states=(NodeState.FAILED,)) if n.instance_id]
    adopted: list[Node] = []
    by_action = {n.action_id: n for n in nodes}
    hard: dict[str, Notice] = {}
    for nt in snap.notices:
        if nt.kind is NoticeKind.HARD:
            hard.setdefault(nt.instance_id, nt)
    if snap.instances is not None:
        seen = {i.action_id: i for i in snap.instances}
        for node in nodes:
            inst = seen.get(node.action_id)
            if inst is None:
                if node.state is NodeState.INTENDED:
                    continue  # act() resumes it
                if node.state is NodeState.DELETING or node.state is NodeState.FAILED:
                    if node.instance_id and not released.get(node.instance_id, False):
                        continue  # gone from the list, allocations not yet freed: check next pass
                    store.transition(node, NodeState.GONE, reason="instance deleted and its allocations freed",
                                     at=now, actor=actor)
                    changed["gone"] += 1
                elif node.notice_id and node.notice_deadline is not None:
                    store.transition(node, NodeState.GONE, reason=f"reclaimed after notice {node.notice_id}",
                                     at=now, actor=actor)
                    changed["gone"] += 1
                else:
                    store.transition(node, NodeState.LOST, reason="instance vanished without notice",
                                     at=now, actor=actor)
                    store.audit(actor=actor, action="node.lost", target=node.id, result="lost",
                                inputs={"pool": node.pool, "instance_id": node.instance_id}, at=now)
                    changed["lost"] += 1
                vanished.append(node)
                continue
            if node.state is NodeState.INTENDED:
                store.transition(node, NodeState.BUILDING, reason="instance found by its action tag",
                                 at=now, actor=actor, instance_id=inst.id, host=inst.host)
            elif node.state is NodeState.BUILDING and (inst.id, inst.host) != (node.instance_id, node.host):
                store.update_node(node, instance_id=inst.id, host=inst.host)  # e.g. an Ironic claim got its node
            if inst.status == "ACTIVE" and node.state is NodeState.BUILDING:
                store.transition(node, NodeState.ACTIVE, reason="instance active", at=now, actor=actor,
                                 instance_id=inst.id, host=inst.host, idle_since=now)
                if node.cordoned:  # cordoned for an advisory while it was building: advised now
                    store.transition(node, NodeState.ADVISED, reason="cordoned for an advisory while building",
                                     at=now, actor=actor)
                changed["active"] += 1
            elif inst.status == "ERROR" and node.state in (NodeState.BUILDING,):
                _build_failed(rt, node, inst, now)
                changed["failed"] += 1
            elif inst.step and node.state is NodeState.BUILDING:
                steps.append((node, inst))
            hn = hard.get(inst.id)
            if hn is not None and node.notice_id != hn.id:
                store.update_node(node, notice_id=hn.id, notice_deadline=hn.deadline)
                changed["noticed"] += 1
        adopted = _adopt(rt, [i for i in snap.instances if i.action_id not in by_action], now)
        changed["adopted"] = len(adopted)
    by_instance = {n.instance_id: n for n in nodes if n.instance_id}
    for nt in snap.notices:
        owner = by_instance.get(nt.instance_id)
        new = store.see_notice(notice_id=nt.id, node_id=owner.id if owner else None, instance_id=nt.instance_id,
                               kind=str(nt.kind), issued_at=nt.issued_at, deadline=nt.deadline, reason=nt.reason,
                               at=now, delivered_at=nt.delivered_at, pool=nt.pool or (owner.pool if owner else None))
        if new and owner is not None:
            notice_event(store, nt, owner, now)
    return changed, sorted((n for n in nodes + adopted if plannable(n)), key=lambda n: n.id), vanished, steps


def _adopt(rt: Runtime, strangers: list[Instance], now: float) -> list[Node]:
    """Record the tagged instances we have no node for (a fleet that predates the state database, or one
    restored from an old backup), all at once in the caller's transaction (``Store.adopt_nodes``): a pass
    killed before it commits leaves them unknown, and the next pass adopts them again."""
    store = rt.store
    known = store.known_ids([i.name for i in strangers]) if strangers else set()
    batch: list[tuple[Node, NodeState]] = []
    actions: set[str] = set()
    for inst in strangers:
        if inst.name in known or inst.action_id in actions:
            continue  # a node of that name exists (of any state), or the listing has that tag twice
        if inst.pool not in rt.region.pools:
            log.warning("tagged instance %s names unknown pool %s; left alone", inst.id, inst.pool)
            continue
        known.add(inst.name)
        actions.add(inst.action_id)
        node = Node(id=inst.name, pool=inst.pool, state=NodeState.INTENDED, action_id=inst.action_id,
                    created_at=inst.created_at or now, updated_at=now, instance_id=inst.id, host=inst.host,
                    reason="adopted: tagged instance unknown to the state store")
        batch.append((node, NodeState.BUILDING if inst.status != "ACTIVE" else NodeState.ACTIVE))
    store.adopt_nodes(batch, at=now, actor=rt.actor)
    return [node for node, _ in batch]


def _build_failed(rt: Runtime, node: Node, inst: Instance, now: float) -> None:
    """The cloud gave up building the node's instance. For want of room (NoValidHost, no free node) the
    pool is remembered as full, as when the create itself is refused, and the planner falls back."""
    store = rt.store
    why = inst.fault or "no reason given"
    store.transition(node, NodeState.FAILED, reason=f"instance in ERROR: {why}", at=now, actor=rt.actor)
    pool = rt.region.pools.get(node.pool)
    if inst.no_room and pool is not None:
        remember_full(rt, pool, why, now)
    store.audit(actor=rt.actor, action="node.build", target=node.id, result="failed",
                inputs={"pool": node.pool, "instance_id": inst.id, "fault": why, "no_room": inst.no_room,
                        "action_id": node.action_id}, at=now)


def remember_full(rt: Runtime, pool: PoolSpec, why: str, now: float) -> None:
    """Remember a pool as full for ``failure_ttl_seconds``, with the larger pools on the same hosts."""
    until = now + rt.region.policy.failure_ttl_seconds
    for name in also_full(pool, rt.region.pools):
        rt.store.remember_failure(name, until, why if name == pool.name else f"{why} (in pool {pool.name})", now)


def _advance(rt: Runtime, steps: list[tuple[Node, Instance]]) -> int:
    """Take the next step of each instance that waits for one (an Ironic deploy), one call each, a token each."""
    done = 0
    for node, inst in steps:
        if not rt.take_token(Priority.LAUNCH):
            break  # the next pass takes it
        try:
            rt.cloud.advance(inst)
            result, extra = "ok", {}
        except SpotctlError as e:
            result, extra = "failed", {"error": e.message}
            log.warning("could not %s %s: %s", inst.step, inst.id, e.message)
        done += result == "ok"
        with rt.store.tx():
            rt.store.audit(actor=rt.actor, action=f"node.{inst.step}", target=node.id, result=result,
                           inputs={"pool": node.pool, "instance_id": inst.id, "action_id": node.action_id, **extra},
                           at=rt.now())
    return done


def notice_event(store, nt: Notice, node: Node, at: float) -> None:
    """Announce a notice, advisory or calendar reclaim on one of our nodes (keyed by the node)."""
    store.cloud_event(f"io.spotctl.notice.{nt.kind.value}", node.id, {
        "notice": nt.id, "node": node.id, "pool": node.pool, "instance_id": nt.instance_id, "kind": nt.kind.value,
        "issued_at": nt.issued_at, "deadline": nt.deadline, "delivered_at": nt.delivered_at, "reason": nt.reason,
        "seen_at": at}, at)


def _released(rt: Runtime, instance_id: str) -> bool:
    try:
        return rt.cloud.released(instance_id)
    except SpotctlError:
        return False


def _forget(rt: Runtime, node: Node) -> None:
    for s in rt.schedulers:
        try:
            s.forget(node.id, node.reason)
        except SpotctlError as e:
            log.info("scheduler %s could not forget %s: %s", s.name, node.id, e.message)
