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
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from spotctl.core.budget import Priority
from spotctl.core.errors import CapacityError, NotFoundError, SpotctlError, TemporaryError
from spotctl.core.models import Node, NodeState
from spotctl.core.planner import Action

from .runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    action: str
    kind: str
    status: str  # ok | failed | skipped | partial
    detail: str = ""
    pool: str | None = None
    node: str | None = None
    count: int = 0
    done: int = 0
    nodes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # e.g. per-scheduler drain acceptance times

    def to_dict(self) -> dict:
        d = {"action": self.action, "kind": self.kind, "status": self.status, "detail": self.detail}
        if self.data:
            d.update(self.data)
        if self.pool:
            d["pool"] = self.pool
        if self.node:
            d["node"] = self.node
        if self.kind == "launch":
            d["count"] = self.count
            d["launched"] = self.done
            d["nodes"] = self.nodes
        return d


def node_name(pool: str, action_id: str) -> str:
    return f"spot-{pool}-{hashlib.sha1(action_id.encode()).hexdigest()[:8]}"


def execute(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    try:
        if action.kind == "launch":
            return _launch(rt, action, plan_id)
        if action.kind == "drain":
            return _drain(rt, action, plan_id)
        if action.kind == "cordon":
            return _cordon(rt, action, plan_id)
        if action.kind == "uncordon":
            return _uncordon(rt, action, plan_id)
        if action.kind == "delete":
            return _delete(rt, action, plan_id)
    except SpotctlError as e:
        log.warning("action %s (%s) failed: %s", action.id, action.kind, e.message)
        rt.store.finish_action(action.id, "failed", e.message, rt.now())
        return Outcome(action.id, action.kind, "failed", e.message, pool=action.pool, node=action.node)
    raise ValueError(f"unknown action kind {action.kind}")


def _intent(rt: Runtime, action: Action, plan_id: str | None, **kw) -> bool:
    return rt.store.record_intent(action_id=action.id, plan_id=plan_id, kind=action.kind, priority=action.priority,
                                  reason=action.reason, actor=rt.actor, at=rt.now(), inputs=action.inputs,
                                  pool=action.pool, node=action.node, count=action.count, **kw)


def _audit(rt: Runtime, action: Action, target: str, result: str, **extra) -> None:
    rt.store.audit(actor=rt.actor, action=f"node.{action.kind}", target=target, result=result,
                   inputs={**action.inputs, "reason": action.reason, "action_id": action.id, **extra}, at=rt.now())


# -- launch ------------------------------------------------------------------


def _launch(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    store = rt.store
    pool = rt.region.pool(action.pool)
    out = Outcome(action.id, "launch", "ok", pool=action.pool, count=action.count or 0)
    _intent(rt, action, plan_id)
    priority = action.priority
    for i in range(action.count or 0):
        sub = f"{action.id}.{i}"
        if store.conn.execute("SELECT 1 FROM nodes WHERE action_id=?", (sub,)).fetchone():
            out.done += 1  # already done by an earlier (crashed) attempt of this same action
            continue
        if not rt.take_token(priority):
            out.status = "partial"
            out.detail = f"token budget exhausted after {out.done} of {action.count}"
            break
        now = rt.now()
        node = Node(id=node_name(pool.name, sub), pool=pool.name, state=NodeState.INTENDED, action_id=sub,
                    created_at=now, updated_at=now, reason=action.reason, price=action.price or 0.0)
        with store.tx():
            store.add_node(node, actor=rt.actor, reason=action.reason)
            _audit(rt, action, node.id, "intended", sub_action=sub)
        ok, detail = _create(rt, node, pool)
        if ok:
            out.done += 1
            out.nodes.append(node.id)
        else:
            out.status = "failed" if out.done == 0 else "partial"
            out.detail = detail
            break
    store.finish_action(action.id, "done" if out.status == "ok" else out.status, out.detail or "ok", rt.now())
    rt.progress(f"launch {action.pool}: {out.done}/{action.count} ({out.status})")
    return out


def _create(rt: Runtime, node: Node, pool) -> tuple[bool, str]:
    """Create (or adopt) the instance of an intended node. Never creates a duplicate."""
    store = rt.store
    existing = rt.cloud.find_instance(node.action_id)
    try:
        inst = existing or rt.cloud.create_instance(pool, node.id, node.action_id)
    except SpotctlError as e:
        # No room (remembered for the pool, the pass falls back), temporary (the planner re-plans next
        # pass), or anything else (config, auth): the node fails rather than being retried forever.
        now = rt.now()
        capacity, temporary = isinstance(e, CapacityError), isinstance(e, TemporaryError)
        why = "launch refused" if capacity else "temporary error" if temporary else "launch failed"
        with store.tx():
            store.transition(node, NodeState.FAILED, reason=f"{why}: {e.message}", at=now, actor=rt.actor)
            if capacity:
                store.remember_failure(pool.name, now + rt.region.policy.failure_ttl_seconds, e.message, now)
            store.audit(actor=rt.actor, action="node.launch", target=node.id, result="failed",
                        inputs={"pool": pool.name, "error": e.message, "action_id": node.action_id}, at=now)
        return False, f"{pool.name}: {e.message}" + (" (will retry next pass)" if temporary else "")
    now = rt.now()
    with store.tx():
        store.transition(node, NodeState.BUILDING, reason="adopted existing instance" if existing else "instance created",
                         at=now, actor=rt.actor, instance_id=inst.id, host=inst.host)
        store.audit(actor=rt.actor, action="node.launch", target=node.id, result="ok",
                    inputs={"pool": pool.name, "instance_id": inst.id, "action_id": node.action_id,
                            "adopted": bool(existing)}, at=now)
    return True, ""


def resume(rt: Runtime) -> list[Outcome]:
    """Finish what a killed pass left half done."""
    outs = []
    for node in rt.store.nodes(states=(NodeState.INTENDED, NodeState.DELETING)):
        if node.state is NodeState.INTENDED:
            pool = rt.region.pools.get(node.pool)
            if pool is None:
                continue
            ok, detail = _create(rt, node, pool)
            outs.append(Outcome(node.action_id, "launch", "ok" if ok else "failed",
                                detail or "resumed an unfinished launch", pool=node.pool, node=node.id,
                                count=1, done=int(ok), nodes=[node.id] if ok else []))
        elif node.state is NodeState.DELETING and node.instance_id:
            try:
                rt.cloud.delete_instance(node.instance_id)
            except SpotctlError as e:
                outs.append(Outcome(node.action_id, "delete", "failed", e.message, node=node.id))
    for a in rt.store.actions(status="intended"):
        if a["kind"] != "launch":
            rt.store.finish_action(a["id"], "done", "completed by a later pass", rt.now())
    return outs


# -- drain / cordon / uncordon ----------------------------------------------


def _each_scheduler(rt: Runtime, fn, accepted: dict[str, float] | None = None) -> dict[str, str]:
    """Call fn(scheduler) on every scheduler at once; return errors by scheduler.

    ``accepted`` (if given) receives, per scheduler, the seconds from the call
    to the scheduler accepting it — one notice drives every scheduler in parallel.
    """
    errors: dict[str, str] = {}
    t0 = time.monotonic()

    def call(s):
        try:
            fn(s)
            if accepted is not None:
                accepted[s.name] = round(time.monotonic() - t0, 4)
        except NotFoundError:
            pass  # the scheduler does not know this node (yet): nothing to do there
        except SpotctlError as e:
            errors[s.name] = e.message

    if len(rt.schedulers) > 1 and rt.concurrent_observe:
        with ThreadPoolExecutor(max_workers=len(rt.schedulers)) as ex:
            list(ex.map(call, rt.schedulers))
    else:
        for s in rt.schedulers:
            call(s)
    return errors


def _node_for(rt: Runtime, action: Action) -> Node:
    return rt.store.node(action.node)


def _drain(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    _intent(rt, action, plan_id)
    if node.state is NodeState.DRAINING:
        rt.store.finish_action(action.id, "done", "already draining", rt.now())
        return Outcome(action.id, "drain", "ok", "already draining", pool=node.pool, node=node.id)
    accepted: dict[str, float] = {}
    errors = _each_scheduler(rt, lambda s: s.drain(node.id, action.reason, action.deadline), accepted)
    now = rt.now()
    with rt.store.tx():
        rt.store.transition(node, NodeState.DRAINING, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        if node.notice_id:
            rt.store.notice_handled(node.notice_id, now)
        elif action.inputs.get("notice"):
            rt.store.notice_handled(action.inputs["notice"], now)
        _audit(rt, action, node.id, "ok" if not errors else "partial", scheduler_errors=errors,
               drain_accepted_seconds=accepted,
               deadline_in_seconds=None if action.deadline is None else round(action.deadline - now, 3))
    status = "ok" if not errors else "partial"
    rt.store.finish_action(action.id, "done" if not errors else "partial", "; ".join(f"{k}: {v}" for k, v in errors.items()) or "ok", now)
    rt.progress(f"drain {node.id}: {status}")
    return Outcome(action.id, "drain", status, "; ".join(errors.values()), pool=node.pool, node=node.id,
                   data={"accepted_seconds": accepted})


def _cordon(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    _intent(rt, action, plan_id)
    errors = _each_scheduler(rt, lambda s: s.cordon(node.id, action.reason))
    now = rt.now()
    with rt.store.tx():
        if node.state is NodeState.ACTIVE:
            rt.store.transition(node, NodeState.ADVISED, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        _audit(rt, action, node.id, "ok" if not errors else "partial", scheduler_errors=errors)
    rt.store.finish_action(action.id, "done", "ok", now)
    return Outcome(action.id, "cordon", "ok" if not errors else "partial", "; ".join(errors.values()),
                   pool=node.pool, node=node.id)


def _uncordon(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    _intent(rt, action, plan_id)
    errors = _each_scheduler(rt, lambda s: s.resume(node.id))
    now = rt.now()
    with rt.store.tx():
        if node.state is NodeState.ADVISED:
            rt.store.transition(node, NodeState.ACTIVE, reason=action.reason, at=now, actor=rt.actor, cordoned=False)
        _audit(rt, action, node.id, "ok" if not errors else "partial", scheduler_errors=errors)
    rt.store.finish_action(action.id, "done", "ok", now)
    return Outcome(action.id, "uncordon", "ok" if not errors else "partial", "; ".join(errors.values()),
                   pool=node.pool, node=node.id)


# -- delete ------------------------------------------------------------------


def _delete(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    if node.state is NodeState.DELETING:
        return Outcome(action.id, "delete", "ok", "already deleting", pool=node.pool, node=node.id)
    if not rt.take_token(action.priority):
        return Outcome(action.id, "delete", "skipped", "token budget exhausted", pool=node.pool, node=node.id)
    _intent(rt, action, plan_id)
    now = rt.now()
    with rt.store.tx():
        if node.instance_id is None:
            rt.store.transition(node, NodeState.GONE, reason=f"{action.reason} (never created)", at=now, actor=rt.actor)
        else:
            rt.store.transition(node, NodeState.DELETING, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        _audit(rt, action, node.id, "intended")
    if node.instance_id is not None:
        rt.cloud.delete_instance(node.instance_id)
        _each_scheduler(rt, lambda s: s.forget(node.id, action.reason))
        with rt.store.tx():
            _audit(rt, action, node.id, "ok", instance_id=node.instance_id)
    rt.store.finish_action(action.id, "done", "ok", rt.now())
    rt.progress(f"delete {node.id}: ok")
    return Outcome(action.id, "delete", "ok", pool=node.pool, node=node.id)
