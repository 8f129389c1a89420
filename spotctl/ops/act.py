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

from spotctl.core.actions import Action
from spotctl.core.budget import Priority
from spotctl.core.errors import CapacityError, NotFoundError, SpotctlError, TemporaryError
from spotctl.core.lifecycle import bound_schedulers
from spotctl.core.models import DrainProgress, Node, NodeState, OutcomeStatus

from .observe import remember_full
from .runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    action: str
    kind: str
    status: OutcomeStatus
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
        if action.kind == "protect":
            return _protect(rt, action, plan_id)
    except SpotctlError as e:
        log.warning("action %s (%s) failed: %s", action.id, action.kind, e.message)
        rt.store.finish_action(action.id, "failed", e.message, rt.now())
        return Outcome(action.id, action.kind, OutcomeStatus.FAILED, e.message, pool=action.pool, node=action.node)
    raise ValueError(f"unknown action kind {action.kind}")


def execute_drains(rt: Runtime, actions: list[Action], plan_id: str | None) -> list[Outcome]:
    """Drain rounds for many nodes at once (:func:`drain_batch`); outcomes, never raises."""
    if len(actions) == 1:
        return [execute(rt, actions[0], plan_id)]
    try:
        return drain_batch(rt, actions, plan_id)
    except SpotctlError as e:  # e.g. a node vanished from the store: one by one, each with its outcome
        log.warning("batch of %d drains: %s; draining one by one", len(actions), e.message)
        return [execute(rt, a, plan_id) for a in actions]


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
    out = Outcome(action.id, "launch", OutcomeStatus.OK, pool=action.pool, count=action.count or 0)
    _intent(rt, action, plan_id)
    priority = action.priority
    for i in range(action.count or 0):
        sub = f"{action.id}.{i}"
        row = store.conn.execute("SELECT state, instance_id FROM nodes WHERE action_id=?", (sub,)).fetchone()
        if row is not None:
            # an earlier (crashed) attempt of this same action made this node: done only if it has its instance
            # (resume() creates or adopts the instance of an intended node; a failed one is not done)
            if row["instance_id"] is not None and row["state"] != NodeState.FAILED.value:
                out.done += 1
                out.nodes.append(node_name(pool.name, sub))
            continue
        if not rt.take_token(priority):
            out.status = OutcomeStatus.PARTIAL
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
            out.status = OutcomeStatus.FAILED if out.done == 0 else OutcomeStatus.PARTIAL
            out.detail = detail
            break
    if out.status is OutcomeStatus.OK and out.done < (action.count or 0):
        out.status = OutcomeStatus.PARTIAL
        out.detail = f"{out.done} of {action.count} instance(s) exist; the rest are intended (the next pass resumes them)"
    store.finish_action(action.id, "done" if out.status is OutcomeStatus.OK else out.status, out.detail or "ok", rt.now())
    rt.progress(f"launch {action.pool}: {out.done}/{action.count} ({out.status})")
    return out


def _create(rt: Runtime, node: Node, pool) -> tuple[bool, str]:
    """Create (or adopt) the instance of an intended node. Never creates a duplicate."""
    store = rt.store
    try:
        existing = rt.cloud.find_instance(node.action_id)
    except SpotctlError as e:
        # unknown whether an earlier attempt made it: the node stays intended and a later pass looks again
        # (failing it here could orphan an instance that exists)
        return False, f"{pool.name}: cannot look up the instance of {node.id}: {e.message} (will retry next pass)"
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
                remember_full(rt, pool, e.message, now)
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


def _from_row(a: dict, deadline: float | None) -> Action:
    """An unfinished action, as recorded, to drive again."""
    return Action(id=a["id"], kind=a["kind"], priority=Priority[a["priority"].upper()], reason=a["reason"],
                  pool=a["pool"], node=a["node"], count=a["count"], deadline=deadline, inputs=a["inputs"])


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
        kind, node = a["kind"], (rt.store.find_node(a["node"]) if a["node"] else None)
        if kind == "launch":
            # its nodes' action ids are "<id>.<i>": every string from "<id>." up to "<id>/"
            span = (a["id"] + ".", a["id"] + "/")
            left = rt.store.conn.execute("SELECT COUNT(*) FROM nodes WHERE action_id >= ? AND action_id < ? AND "
                                         "state=?", (*span, NodeState.INTENDED.value)).fetchone()[0]
            if left == 0:
                made = rt.store.conn.execute("SELECT COUNT(*) FROM nodes WHERE action_id >= ? AND action_id < ? AND "
                                             "instance_id IS NOT NULL", span).fetchone()[0]
                status = "done" if made == (a["count"] or 0) else "partial"
                rt.store.finish_action(a["id"], status, f"resumed: {made} of {a['count']} instance(s) exist", rt.now())
            continue
        if node is None:
            rt.store.finish_action(a["id"], "failed", f"resumed: node {a['node']!r} is not in the store", rt.now())
            continue
        if kind in ("drain", "cordon", "uncordon", "protect"):
            if not node.live:
                rt.store.finish_action(a["id"], "skipped", f"resumed: node {node.id} is {node.state}", rt.now())
                continue
            outs.append(execute(rt, _from_row(a, node.notice_deadline), a["plan_id"]))
        elif kind == "delete":
            if node.state is NodeState.GONE or node.id in deleted or (node.state is NodeState.DELETING
                                                                      and not node.instance_id):
                with rt.store.tx():
                    _audit(rt, _from_row(a, None), node.id, "ok", instance_id=node.instance_id, resumed=True)
                rt.store.finish_action(a["id"], "done", f"resumed: instance delete accepted ({node.state})", rt.now())
            elif node.state is not NodeState.DELETING:
                outs.append(execute(rt, _from_row(a, node.notice_deadline), a["plan_id"]))
            # a DELETING node whose delete failed above stays intended for the next pass
        else:
            rt.store.finish_action(a["id"], "failed", f"resumed: unknown action kind {kind!r}", rt.now())
    return outs


# -- drain / cordon / uncordon ----------------------------------------------


@dataclass
class Fanout:
    """What every scheduler said to one call about one node."""

    results: dict[str, object] = field(default_factory=dict)   # scheduler -> the call's return value
    accepted: dict[str, float] = field(default_factory=dict)   # scheduler -> seconds until it accepted
    errors: dict[str, str] = field(default_factory=dict)       # scheduler -> why it failed
    unknown: list[str] = field(default_factory=list)           # schedulers that do not know the node
    missing: list[str] = field(default_factory=list)           # ... of those, bound ones that should know it
    pending: list[str] = field(default_factory=list)           # ... bound ones it has not joined yet (booting)
    accepted_at: dict[str, float] = field(default_factory=dict)  # scheduler -> when it accepted (rt clock)
    cordoned_at: dict[str, float] = field(default_factory=dict)  # scheduler -> when it stopped new work

    @property
    def ok(self) -> bool:
        return not self.errors and not self.missing and not self.pending

    @property
    def status(self) -> OutcomeStatus:
        """ok (every bound scheduler took it) | partial (one failed, or does not know a node it should)
        | pending (the node has not joined a bound scheduler yet: a later pass applies it again)."""
        if self.errors or self.missing:
            return OutcomeStatus.PARTIAL
        return OutcomeStatus.PENDING if self.pending else OutcomeStatus.OK

    def problems(self) -> str:
        out = [f"{k}: {v}" for k, v in sorted(self.errors.items())]
        out += [f"{k}: does not know the node (check the node name it uses)" for k in self.missing]
        out += [f"{k}: the node has not registered yet (still booting); the next pass applies it again"
                for k in self.pending]
        return "; ".join(out)

    def evidence(self) -> dict:
        d: dict = {"accepted_seconds": self.accepted, "accepted_at": self.accepted_at,
                   "cordoned_at": self.cordoned_at or self.accepted_at}
        if self.errors:
            d["scheduler_errors"] = self.errors
        if self.unknown:
            d["unknown_to"] = self.unknown
        if self.missing:
            d["missing_in"] = self.missing
        if self.pending:
            d["pending_in"] = self.pending
        return d


def _each_scheduler(rt: Runtime, node: Node, fn) -> Fanout:
    """Call fn(scheduler) on every scheduler at once — one notice drives them in parallel — and say
    which accepted (and how fast), which failed, and which do not know the node. A scheduler the
    node's pool is bound to (:func:`~spotctl.core.lifecycle.bound_schedulers`) that does not know it
    makes the call partial: a misnamed node must not pass for a drained one."""
    fan = Fanout()
    t0 = time.monotonic()

    def call(s):
        try:
            fan.results[s.name] = fn(s)
            fan.accepted[s.name] = round(time.monotonic() - t0, 4)
            fan.accepted_at[s.name] = round(rt.now(), 4)
        except NotFoundError:
            fan.unknown.append(s.name)
        except SpotctlError as e:
            fan.errors[s.name] = e.message

    if len(rt.schedulers) > 1 and rt.concurrent_observe:
        with ThreadPoolExecutor(max_workers=len(rt.schedulers)) as ex:
            list(ex.map(call, rt.schedulers))
    else:
        for s in rt.schedulers:
            call(s)
    pool = rt.region.pools.get(node.pool)
    bound = bound_schedulers(pool) if pool is not None else frozenset()
    fan.unknown.sort()
    # a node that is still being built may not have joined its schedulers yet: that is pending, not a
    # misnamed node; once it is active, a bound scheduler that does not know it is a finding
    booting = node.state in (NodeState.INTENDED, NodeState.BUILDING)
    expected = [name for name in fan.unknown if name in bound]
    fan.pending, fan.missing = (expected, []) if booting else ([], expected)
    # a scheduler the pool is bound to but this entry point has no adapter for was never asked: not "ok"
    fan.missing += sorted(bound - {s.name for s in rt.schedulers})
    return fan


def _node_for(rt: Runtime, action: Action) -> Node:
    return rt.store.node(action.node)


def _drain(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """One drain round (a state machine across passes: see SchedulerPort.drain). The first round
    moves the node to draining; later rounds (``inputs.continue``) evict what is left; a round the
    planner forces (a hard notice's deadline is near) deletes what still cannot move. "ok" means
    every scheduler the node's pool is bound to took the round; ``empty`` says whether the node is."""
    return drain_batch(rt, [action], plan_id)[0]


#: Nodes whose drain rounds run at once in a batch (each node's schedulers in parallel too).
DRAIN_WORKERS = 16


def drain_batch(rt: Runtime, actions: list[Action], plan_id: str | None) -> list[Outcome]:
    """Drain rounds for many nodes at once — a reclaim storm cordons every node in every scheduler
    within seconds, not one node after another. Three phases, so that no network call runs inside a
    write transaction: record every intent; call the schedulers for all nodes concurrently (network
    only); record every outcome and audit record."""
    nodes = [_node_for(rt, a) for a in actions]
    for a in actions:
        _intent(rt, a, plan_id)

    def call(pair: tuple[Action, Node]) -> Fanout:
        a, node = pair
        force = bool(a.inputs.get("force"))
        fan = _each_scheduler(rt, node, lambda s: s.drain(node.id, a.reason, a.deadline, force=force))
        return fan

    def cordon(pair: tuple[Action, Node]) -> Fanout:
        a, node = pair
        return _each_scheduler(rt, node, lambda s: s.cordon(node.id, a.reason))

    pairs = list(zip(actions, nodes))
    if len(pairs) > 1 and rt.concurrent_observe:
        with ThreadPoolExecutor(max_workers=min(DRAIN_WORKERS, len(pairs))) as ex:
            # a storm: stop new work on every node first (one call per scheduler and node), then
            # the evictions; the cordon times are what "cordoned within 2 s" is measured on
            cordons = list(ex.map(cordon, pairs))
            fans = list(ex.map(call, pairs))
        for c, fan in zip(cordons, fans):
            fan.cordoned_at = dict(c.accepted_at)
    else:
        fans = [call(p) for p in pairs]
    return [_drain_record(rt, a, node, fan) for (a, node), fan in zip(pairs, fans)]


def _drain_record(rt: Runtime, action: Action, node: Node, fan: "Fanout") -> Outcome:
    first = node.state is not NodeState.DRAINING
    progress = {k: v for k, v in fan.results.items() if isinstance(v, DrainProgress)}
    empty = fan.ok and all(p.empty for p in progress.values())
    forced = {k: list(p.forced) for k, p in progress.items() if p.forced}
    now = rt.now()
    evidence = {**fan.evidence(), "drain": {k: p.to_dict() for k, p in sorted(progress.items())}, "empty": empty,
                "deadline_in_seconds": None if action.deadline is None else round(action.deadline - now, 3)}
    result = fan.status
    with rt.store.tx():
        if first:
            rt.store.transition(node, NodeState.DRAINING, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        if fan.ok:  # handled once every bound scheduler took a round (a failed first round is driven again)
            notice = node.notice_id or action.inputs.get("notice")
            if notice:
                rt.store.notice_handled(notice, now)
        # every first round is audited; a later round when it changed something worth a record
        if first or forced or empty or not fan.ok:
            _audit(rt, action, node.id, result, round="first" if first else "continue", forced=forced, **evidence)
    left = sum(p.remaining for p in progress.values())
    detail = fan.problems() or (f"{'empty' if empty else f'{left} workload(s) left'}"
                                + (f"; {sum(len(v) for v in forced.values())} deleted at the deadline" if forced else ""))
    rt.store.finish_action(action.id, "done" if fan.ok else result, detail, now)
    rt.progress(f"drain {node.id}: {result} ({detail})")
    return Outcome(action.id, "drain", result, fan.problems(), pool=node.pool, node=node.id, data=evidence)


def _cordon(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    _intent(rt, action, plan_id)
    fan = _each_scheduler(rt, node, lambda s: s.cordon(node.id, action.reason))
    now = rt.now()
    result = fan.status
    with rt.store.tx():
        if node.state is NodeState.ACTIVE and fan.ok:  # else the next pass cordons again
            rt.store.transition(node, NodeState.ADVISED, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        elif node.state is NodeState.BUILDING and fan.ok:
            rt.store.update_node(node, cordoned=True)  # advised once active (sync); not cordoned again meanwhile
        _audit(rt, action, node.id, result, **fan.evidence())
    rt.store.finish_action(action.id, "done" if fan.ok else result, fan.problems() or "ok", now)
    return Outcome(action.id, "cordon", result, fan.problems(), pool=node.pool, node=node.id, data=fan.evidence())


def _uncordon(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    _intent(rt, action, plan_id)
    fan = _each_scheduler(rt, node, lambda s: s.resume(node.id))
    now = rt.now()
    result = fan.status
    with rt.store.tx():
        if node.state is NodeState.ADVISED and fan.ok:  # else the next pass uncordons again
            rt.store.transition(node, NodeState.ACTIVE, reason=action.reason, at=now, actor=rt.actor, cordoned=False)
        elif node.state is NodeState.BUILDING and fan.ok:
            rt.store.update_node(node, cordoned=False)
        _audit(rt, action, node.id, result, **fan.evidence())
    rt.store.finish_action(action.id, "done" if fan.ok else result, fan.problems() or "ok", now)
    return Outcome(action.id, "uncordon", result, fan.problems(), pool=node.pool, node=node.id, data=fan.evidence())


def _protect(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """Tell every scheduler of the node by when its work must end (SchedulerPort.protect). The node
    records what was told only once every bound scheduler took it; else the next pass tells it again."""
    node = _node_for(rt, action)
    until, closed = action.inputs.get("until"), bool(action.inputs.get("closed"))
    _intent(rt, action, plan_id)
    fan = _each_scheduler(rt, node, lambda s: s.protect(node.id, until, closed))
    now = rt.now()
    result = fan.status
    with rt.store.tx():
        if fan.ok:
            rt.store.update_node(node, protected_until=until, protect_closed=closed and until is not None)
        _audit(rt, action, node.id, result, until=until, closed=closed, **fan.evidence())
    rt.store.finish_action(action.id, "done" if fan.ok else result, fan.problems() or "ok", now)
    return Outcome(action.id, "protect", result, fan.problems(), pool=node.pool, node=node.id, data=fan.evidence())


# -- delete ------------------------------------------------------------------


def _delete(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    node = _node_for(rt, action)
    if node.state is NodeState.DELETING:  # its delete was recorded as asked; resume() asks again each pass
        return Outcome(action.id, "delete", OutcomeStatus.SKIPPED, "already deleting", pool=node.pool, node=node.id)
    if not rt.take_token(action.priority):
        return Outcome(action.id, "delete", OutcomeStatus.SKIPPED, "token budget exhausted", pool=node.pool, node=node.id)
    _intent(rt, action, plan_id)
    now = rt.now()
    with rt.store.tx():
        if node.instance_id is None:
            rt.store.transition(node, NodeState.GONE, reason=f"{action.reason} (never created)", at=now, actor=rt.actor)
        else:
            rt.store.transition(node, NodeState.DELETING, reason=action.reason, at=now, actor=rt.actor, cordoned=True)
        _audit(rt, action, node.id, "intended")
    if node.instance_id is None:
        with rt.store.tx():
            _audit(rt, action, node.id, "ok", never_created=True)
        rt.store.finish_action(action.id, "done", "never created", rt.now())
        return Outcome(action.id, "delete", OutcomeStatus.OK, "never created", pool=node.pool, node=node.id)
    rt.cloud.delete_instance(node.instance_id)  # raises: the action fails, the node stays deleting (resumed)
    fan = _each_scheduler(rt, node, lambda s: s.forget(node.id, action.reason))
    fan.missing, fan.pending = [], []  # forgetting: a scheduler that does not know the node is already there
    result = fan.status
    with rt.store.tx():
        _audit(rt, action, node.id, result, instance_id=node.instance_id, instance_delete="accepted",
               **fan.evidence())
    rt.store.finish_action(action.id, "done" if fan.ok else result, fan.problems() or "instance delete accepted",
                           rt.now())
    rt.progress(f"delete {node.id}: {result}")
    return Outcome(action.id, "delete", result, fan.problems(), pool=node.pool, node=node.id, data=fan.evidence())
