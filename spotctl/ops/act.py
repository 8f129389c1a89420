"""Act: carry out a plan's actions in order, under the token budget.

Rules (karpenter's "record before you act", kopf's outcomes):
- an action's intent (and the node record, for launches) is committed before
  the side effect; every created instance is tagged with its action id;
- a step returns an :class:`Outcome`, it does not raise (temporary errors are
  retried by the next pass);
- a pass killed anywhere is finished by the next one: ``resume`` looks
  unfinished intents up by their tags and completes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from spotctl.core.actions import Action, ActionKind
from spotctl.core.budget import Priority
from spotctl.core.errors import CapacityError, SpotctlError, TemporaryError, UsageError
from spotctl.core.hostaware import LaunchNodes, choice_for_node
from spotctl.core.models import HostChoice, Instance, Node, NodeState, OutcomeStatus

from .drain import drain_batch, each_scheduler, node_for, run_cordon, run_drain, run_protect, run_uncordon
from .outcome import Outcome, audit_action, finish_action, growing_chunks, record_intent
from .runtime import Runtime
from .sync import remember_full

__all__ = ["Outcome", "execute", "execute_drains", "node_name", "resume"]

log = logging.getLogger(__name__)


def node_name(pool: str, action_id: str) -> str:
    return f"spot-{pool}-{hashlib.sha1(action_id.encode()).hexdigest()[:8]}"


def execute(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """Carry out one action; its outcome (a failure is an outcome, recorded; it is not raised)."""
    runners = {ActionKind.LAUNCH: _launch, ActionKind.DRAIN: run_drain, ActionKind.CORDON: run_cordon,
               ActionKind.UNCORDON: run_uncordon, ActionKind.DELETE: _delete, ActionKind.PROTECT: run_protect}
    try:
        return runners[action.kind](rt, action, plan_id)
    except SpotctlError as e:
        log.warning("action %s (%s) failed: %s", action.id, action.kind, e.message)
        finish_action(rt, action.id, str(action.kind), "failed", e.message, rt.now(), pool=action.pool, node=action.node)
        return Outcome(action.id, str(action.kind), OutcomeStatus.FAILED, e.message, pool=action.pool,
                       node=action.node)


def execute_drains(rt: Runtime, actions: list[Action], plan_id: str | None) -> list[Outcome]:
    """Drain rounds for many nodes at once (:func:`drain_batch`); outcomes, never raises."""
    if len(actions) == 1:
        return [execute(rt, actions[0], plan_id)]
    try:
        return drain_batch(rt, actions, plan_id)
    except SpotctlError as e:  # e.g. a node vanished from the store: one by one, each with its outcome
        log.warning("batch of %d drains: %s; draining one by one", len(actions), e.message)
        return [execute(rt, a, plan_id) for a in actions]


# -- launch ------------------------------------------------------------------


#: The most nodes of a launch whose tokens and intents are committed together, before any of their creates: a
#: launch commits 1, then 2, 4, ... up to this many at a time (a pool that refuses at once costs one intent; a
#: launch of 400 nodes commits 27 times, not 400: a commit writes every page the nodes share again).
LAUNCH_CHUNK = 16


def _launch(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    store = rt.store
    if action.pool is None:
        raise UsageError(f"launch action {action.id} names no pool")
    pool = rt.region.pool(action.pool)
    out = Outcome(action.id, "launch", OutcomeStatus.OK, pool=action.pool, count=action.count or 0)
    record_intent(rt, action, plan_id)
    priority = action.priority
    todo: list[tuple[int, str]] = []  # (index, node action id) of the nodes not recorded yet
    for i in range(action.count or 0):
        sub = f"{action.id}.{i}"
        row = store.conn.execute("SELECT state, instance_id FROM nodes WHERE action_id=?", (sub,)).fetchone()
        if row is None:
            todo.append((i, sub))
        # an earlier (crashed) attempt of this same action made this node: done only if it has its instance
        # (resume() creates or adopts the instance of an intended node; a failed one is not done)
        elif row["instance_id"] is not None and row["state"] != NodeState.FAILED.value:
            out.done += 1
            out.nodes.append(node_name(pool.name, sub))
    # One write transaction per chunk of nodes (LAUNCH_CHUNK): their tokens and intents, with the records of the
    # instances the chunk before created — always committed before the chunk's create calls. A process killed
    # between a create and that commit leaves the node intended, with its tagged instance: resume() adopts it
    # (and creates those of its chunk that were not asked for yet).
    shares = LaunchNodes(action.inputs)  # each node's segment and host choice
    created: list[Created] = []
    unasked: list[Node] = []  # intended nodes whose create was not asked for: an earlier create of the launch failed
    stop = False
    for chunk in growing_chunks(todo, LAUNCH_CHUNK):
        if stop:
            break
        intended: list[tuple[int, Node]] = []
        with store.tx():
            for made in created:
                _record_created(rt, pool, *made)
            created = []
            granted = rt.take_token(priority, len(chunk))  # a token per node of the chunk, taken at once
            if granted < len(chunk):
                stop = True  # the budget ran out within this chunk: its first ``granted`` nodes go on
            for i, sub in chunk[:granted]:
                now = rt.now()
                node = Node(id=node_name(pool.name, sub), pool=pool.name, state=NodeState.INTENDED, action_id=sub,
                            created_at=now, updated_at=now, reason=action.reason, price=action.price or 0.0)
                store.add_node(node, actor=rt.actor, reason=action.reason)
                audit_action(rt, action, node.id, "intended", inputs=shares.inputs_of(i), sub_action=sub)
                intended.append((i, node))
        for j, (i, node) in enumerate(intended):
            ok, detail, made_now = _create_instance(rt, node, pool, shares.choice(i))
            if made_now is not None:
                created.append(made_now)
            if not ok:
                out.status = OutcomeStatus.FAILED if out.done == 0 else OutcomeStatus.PARTIAL
                out.detail = detail
                unasked, stop = [n for _, n in intended[j + 1:]], True
                break
            out.done += 1
            out.nodes.append(node.id)
        else:
            if stop:  # a token was refused after this chunk's nodes
                out.status = OutcomeStatus.PARTIAL
                out.detail = f"token budget exhausted after {out.done} of {action.count}"
    if out.status is OutcomeStatus.OK and out.done < (action.count or 0):
        out.status = OutcomeStatus.PARTIAL
        out.detail = f"{out.done} of {action.count} instance(s) exist; the rest are intended (the next pass resumes them)"
    with store.tx():
        for made in created:
            _record_created(rt, pool, *made)
        for node in unasked:
            _not_asked(rt, pool, node, out.detail)
        finish_action(rt, action.id, "launch", "done" if out.status is OutcomeStatus.OK else out.status,
                      out.detail or f"{out.done} of {action.count} launched", rt.now(), pool=action.pool)
    rt.progress(f"launch {action.pool}: {out.done}/{action.count} ({out.status})")
    return out


def _not_asked(rt: Runtime, pool, node: Node, why: str) -> None:
    """An intended node whose create was never asked for (an earlier node of its launch failed) fails, with its
    audit record (in the caller's transaction): nothing was created for it, so nothing can leak."""
    now = rt.now()
    error = f"not created: an earlier node of the launch failed ({why})"
    rt.store.transition(node, NodeState.FAILED, reason=error, at=now, actor=rt.actor)
    rt.store.audit(actor=rt.actor, action="node.launch", target=node.id, result="failed",
                   inputs={"pool": pool.name, "error": error, "action_id": node.action_id}, at=now)


#: an instance created (or found) for an intended node, not recorded yet: (node, instance, found, when)
Created = tuple[Node, Instance, bool, float]


def _create(rt: Runtime, node: Node, pool) -> tuple[bool, str]:
    """Create (or adopt) the instance of an intended node and record it. Never creates a duplicate. The host
    choice is the one its launch action recorded (node action ids are ``<action id>.<index>``)."""
    ok, detail, created = _create_instance(rt, node, pool, _recorded_choice(rt, node.action_id))
    if created is not None:
        with rt.store.tx():
            _record_created(rt, pool, *created)
    return ok, detail


def _record_created(rt: Runtime, pool, node: Node, inst: Instance, existing: bool, now: float) -> None:
    """The node is building on its instance: its transition and audit record (in the caller's transaction)."""
    rt.store.transition(node, NodeState.BUILDING, reason="adopted existing instance" if existing else "instance created",
                        at=now, actor=rt.actor, instance_id=inst.id, host=inst.host)
    rt.store.audit(actor=rt.actor, action="node.launch", target=node.id, result="ok",
                   inputs={"pool": pool.name, "instance_id": inst.id, "action_id": node.action_id,
                           "adopted": bool(existing)}, at=now)


def _recorded_choice(rt: Runtime, sub: str) -> HostChoice | None:
    """The host choice the launch action of node action ``sub`` (``<action id>.<index>``) recorded."""
    aid, _, idx = sub.rpartition(".")
    if not aid or not idx.isdigit():
        return None
    row = rt.store.conn.execute("SELECT inputs FROM actions WHERE id=?", (aid,)).fetchone()
    if row is None or not row["inputs"]:
        return None
    try:
        inputs = json.loads(row["inputs"])
    except ValueError:
        return None
    return choice_for_node(inputs, int(idx)) if isinstance(inputs, dict) else None


def _create_instance(rt: Runtime, node: Node, pool, choice: HostChoice | None = None) -> tuple[bool, str, Created | None]:
    """Create (or find) the instance of an intended node, never a duplicate; a refusal is recorded here, an
    instance is returned for the caller to record (:func:`_record_created`). ``choice``: the hosts it may
    land on (the plan's, :mod:`spotctl.core.hostaware`), given to the cloud when there is one."""
    store = rt.store
    try:
        existing = rt.cloud.find_instance(node.action_id)
    except SpotctlError as e:
        # unknown whether an earlier attempt made it: the node stays intended and a later pass looks again
        # (failing it here could orphan an instance that exists)
        return False, f"{pool.name}: cannot look up the instance of {node.id}: {e.message} (will retry next pass)", None
    try:
        inst = existing or (rt.cloud.create_instance(pool, node.id, node.action_id, choice) if choice is not None
                             else rt.cloud.create_instance(pool, node.id, node.action_id))
    except SpotctlError as e:
        # No room (remembered for the pool, the pass falls back), temporary (the planner re-plans next
        # pass), or anything else (config, auth): the node fails rather than being retried forever.
        now = rt.now()
        capacity, temporary = isinstance(e, CapacityError), isinstance(e, TemporaryError)
        why = "launch refused" if capacity else "temporary error" if temporary else "launch failed"
        with store.tx():
            store.transition(node, NodeState.FAILED, reason=f"{why}: {e.message}", at=now, actor=rt.actor)
            if capacity:
                remember_full(rt, pool, e.message, now)
            store.audit(actor=rt.actor, action="node.launch", target=node.id, result="failed",
                        inputs={"pool": pool.name, "error": e.message, "action_id": node.action_id}, at=now)
        return False, f"{pool.name}: {e.message}" + (" (will retry next pass)" if temporary else ""), None
    return True, "", (node, inst, existing is not None, rt.now())


def _from_row(a: dict, deadline: float | None) -> Action:
    """An unfinished action, as recorded, to drive again."""
    return Action(id=a["id"], kind=ActionKind(a["kind"]), priority=Priority[a["priority"].upper()], reason=a["reason"],
                  pool=a["pool"], node=a["node"], count=a["count"], deadline=deadline, inputs=a["inputs"])


def _audit_resumed(rt: Runtime, a: dict, target: str, result: str, **extra: Any) -> None:
    """The audit record of an action a later pass closed as it found it (no effect of its own): every
    recorded action leaves one (tests/integration/test_record_crash.py checks it across kill -9)."""
    rt.store.audit(actor=rt.actor, action=f"node.{a['kind']}", target=target, result=result,
                   inputs={**(a["inputs"] or {}), "reason": a["reason"], "action_id": a["id"], "resumed": True,
                           **extra}, at=rt.now())


def resume(rt: Runtime) -> list[Outcome]:
    """Finish what a killed pass (or watcher) left half done, by checking the world, never by
    assuming: an intended node's instance is looked up by its tag and adopted or created; a
    deleting node's instance is deleted again (deletion is idempotent; it takes a token); an
    unfinished drain, cordon or uncordon is driven again (each is idempotent) and records its
    own outcome and audit record; an unfinished delete is done once its node's instance delete
    was accepted."""
    outs: list[Outcome] = []
    deleted: set[str] = set()  # nodes whose instance delete was accepted now or earlier
    for node in rt.store.nodes(states=(NodeState.INTENDED, NodeState.DELETING)):
        if node.state is NodeState.INTENDED:
            pool = rt.region.pools.get(node.pool)
            if pool is None:
                continue
            ok, detail = _create(rt, node, pool)
            outs.append(Outcome(node.action_id, "launch", OutcomeStatus.OK if ok else OutcomeStatus.FAILED,
                                detail or "resumed an unfinished launch", pool=node.pool, node=node.id,
                                count=1, done=int(ok), nodes=[node.id] if ok else []))
        elif node.state is NodeState.DELETING and node.instance_id:
            if not rt.take_token(Priority.RECLAIM):
                outs.append(Outcome(node.action_id, "delete", OutcomeStatus.SKIPPED, "token budget exhausted", node=node.id))
                continue
            try:
                rt.cloud.delete_instance(node.instance_id)
                deleted.add(node.id)
            except SpotctlError as e:
                outs.append(Outcome(node.action_id, "delete", OutcomeStatus.FAILED, e.message, node=node.id))
    for a in rt.store.actions(status="intended", limit=None):
        kind, found = a["kind"], (rt.store.find_node(a["node"]) if a["node"] else None)
        if kind == "launch":
            # its nodes' action ids are "<id>.<i>": every string from "<id>." up to "<id>/"
            span = (a["id"] + ".", a["id"] + "/")
            left = rt.store.conn.execute("SELECT COUNT(*) FROM nodes WHERE action_id >= ? AND action_id < ? AND "
                                         "state=?", (*span, NodeState.INTENDED.value)).fetchone()[0]
            if left == 0:
                made = rt.store.conn.execute("SELECT COUNT(*) FROM nodes WHERE action_id >= ? AND action_id < ? AND "
                                             "instance_id IS NOT NULL", span).fetchone()[0]
                status = "done" if made == (a["count"] or 0) else "partial"
                detail = f"resumed: {made} of {a['count']} instance(s) exist"
                with rt.store.tx():  # the action's own record (a kill before its first node left it none)
                    _audit_resumed(rt, a, a["pool"] or "", status, instances=made, detail=detail)
                    finish_action(rt, a["id"], kind, status, detail, rt.now(), pool=a["pool"])
            continue
        if found is None:
            detail = f"resumed: node {a['node']!r} is not in the store"
            with rt.store.tx():
                _audit_resumed(rt, a, a["node"] or "", "failed", detail=detail)
                finish_action(rt, a["id"], kind, "failed", detail, rt.now(), pool=a["pool"], node=a["node"])
            continue
        if kind in ("drain", "cordon", "uncordon", "protect"):
            if not found.live:
                detail = f"resumed: node {found.id} is {found.state}"
                with rt.store.tx():
                    _audit_resumed(rt, a, found.id, "skipped", detail=detail)
                    finish_action(rt, a["id"], kind, "skipped", detail, rt.now(), pool=found.pool, node=found.id)
                continue
            outs.append(execute(rt, _from_row(a, found.notice_deadline), a["plan_id"]))
        elif kind == "delete":
            if found.state is NodeState.GONE or found.id in deleted or (found.state is NodeState.DELETING
                                                                       and not found.instance_id):
                with rt.store.tx():
                    audit_action(rt, _from_row(a, None), found.id, "ok", instance_id=found.instance_id, resumed=True)
                finish_action(rt, a["id"], kind, "done", f"resumed: instance delete accepted ({found.state})", rt.now(),
                              pool=found.pool, node=found.id)
            elif found.state is not NodeState.DELETING:
                outs.append(execute(rt, _from_row(a, found.notice_deadline), a["plan_id"]))
            # a DELETING node whose delete failed above stays intended for the next pass
        else:
            finish_action(rt, a["id"], str(kind), "failed", f"resumed: unknown action kind {kind!r}", rt.now(),
                          pool=a["pool"], node=a["node"])
    return outs


# -- delete ------------------------------------------------------------------


def _delete(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = node_for(rt, action)
    if node.state is NodeState.DELETING:  # its delete was recorded as asked; resume() asks again each pass
        return Outcome(action.id, "delete", OutcomeStatus.SKIPPED, "already deleting", pool=node.pool, node=node.id)
    if not rt.take_token(action.priority):
        return Outcome(action.id, "delete", OutcomeStatus.SKIPPED, "token budget exhausted", pool=node.pool, node=node.id)
    record_intent(rt, action, plan_id)
    now = rt.now()
    with rt.store.tx():
        if node.instance_id is None:
            rt.store.transition(node, NodeState.GONE, reason=f"{action.reason} (never created)", at=now, actor=rt.actor)
        else:
            rt.store.transition(node, NodeState.DELETING, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        audit_action(rt, action, node.id, "intended")
    if node.instance_id is None:
        with rt.store.tx():
            audit_action(rt, action, node.id, "ok", never_created=True)
        finish_action(rt, action.id, "delete", "done", "never created", rt.now(), pool=node.pool, node=node.id)
        return Outcome(action.id, "delete", OutcomeStatus.OK, "never created", pool=node.pool, node=node.id)
    rt.cloud.delete_instance(node.instance_id)  # raises: the action fails, the node stays deleting (resumed)
    fan = each_scheduler(rt, node, lambda s: s.forget(node.id, action.reason))
    fan.missing, fan.pending = [], []  # forgetting: a scheduler that does not know the node is already there
    result = fan.status
    with rt.store.tx():
        audit_action(rt, action, node.id, result, instance_id=node.instance_id, instance_delete="accepted",
               **fan.evidence())
    finish_action(rt, action.id, "delete", "done" if fan.ok else result, fan.problems() or "instance delete accepted",
                  rt.now(), pool=node.pool, node=node.id)
    rt.progress(f"delete {node.id}: {result}")
    return Outcome(action.id, "delete", result, fan.problems(), pool=node.pool, node=node.id, data=fan.evidence())
