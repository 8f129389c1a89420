"""Drain, cordon, uncordon and protect a node on every scheduler it is bound to.

A drain is a state machine across passes (``core.plan_housekeeping.drain_round`` decides each round);
one round here asks each scheduler once, records what each said (:class:`Fanout`) and returns."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from spotctl.core.actions import Action
from spotctl.core.errors import NotFoundError, SpotctlError, UsageError
from spotctl.core.lifecycle import bound_schedulers
from spotctl.core.models import DrainProgress, Node, NodeState, OutcomeStatus

from .outcome import Outcome, audit_action, finish_action, growing_chunks, record_intent
from .runtime import Runtime

log = logging.getLogger(__name__)


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


def each_scheduler(rt: Runtime, node: Node, fn) -> Fanout:
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


def node_for(rt: Runtime, action: Action) -> Node:
    if action.node is None:
        raise UsageError(f"{action.kind} action {action.id} names no node")
    return rt.store.node(action.node)


def run_drain(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """One drain round (a state machine across passes: see SchedulerPort.drain). The first round
    moves the node to draining; later rounds (``inputs.continue``) evict what is left; a round the
    planner forces (a hard notice's deadline is near) deletes what still cannot move. "ok" means
    every scheduler the node's pool is bound to took the round; ``empty`` says whether the node is."""
    return drain_batch(rt, [action], plan_id)[0]


#: Nodes whose drain rounds run at once in a batch (each node's schedulers in parallel too).
DRAIN_WORKERS = 16


#: The most drains whose intents, and later whose outcomes, are committed together (:func:`growing_chunks`: 1, 2,
#: 4, ... up to this many): a storm of 1,000 drains commits about 2 x 20 times, not 2 x 1,000. A node's outcome
#: (its transition, audit record and action status) is always committed whole; a kill loses at most the chunk
#: under way, which the next pass drives again (a recorded intent: resume; none: the plan).
DRAIN_CHUNK = 64


def drain_batch(rt: Runtime, actions: list[Action], plan_id: str | None) -> list[Outcome]:
    """Drain rounds for many nodes at once — a reclaim storm cordons every node in every scheduler
    within seconds, not one node after another. Three phases, so that no network call runs inside a
    write transaction: record every intent; call the schedulers for all nodes concurrently (network
    only); record every outcome and audit record (each phase's commits in chunks: DRAIN_CHUNK)."""
    nodes = [node_for(rt, a) for a in actions]
    for chunk in growing_chunks(actions, DRAIN_CHUNK):
        with rt.store.tx():
            for a in chunk:
                record_intent(rt, a, plan_id)

    def call(pair: tuple[Action, Node]) -> Fanout:
        a, node = pair
        force = bool(a.inputs.get("force"))
        fan = each_scheduler(rt, node, lambda s: s.drain(node.id, a.reason, a.deadline, force=force))
        return fan

    def cordon(pair: tuple[Action, Node]) -> Fanout:
        a, node = pair
        return each_scheduler(rt, node, lambda s: s.cordon(node.id, a.reason))

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
    out: list[Outcome] = []
    for done in growing_chunks(list(zip(pairs, fans)), DRAIN_CHUNK):
        with rt.store.tx():
            out.extend(_drain_record(rt, a, node, fan) for (a, node), fan in done)
    return out


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
        # every round is audited: each is a recorded action (a later pass's, or the watcher's), and no recorded
        # action is left without its audit record (test_record_crash checks it across kill -9)
        audit_action(rt, action, node.id, result, round="first" if first else "continue", forced=forced, **evidence)
        left = sum(p.remaining for p in progress.values())
        detail = fan.problems() or (f"{'empty' if empty else f'{left} workload(s) left'}"
                                    + (f"; {sum(len(v) for v in forced.values())} deleted at the deadline"
                                       if forced else ""))
        # the action's status in the outcome's transaction (its chunk's, drain_batch): never a recorded round
        # whose action still says running
        finish_action(rt, action.id, "drain", "done" if fan.ok else result, detail, now, pool=node.pool, node=node.id)
    line = f"drain {node.id}: {result} ({detail})"
    rt.store.after_commit(lambda: rt.progress(line))  # (a chunk's outcomes commit together: said once they have)
    return Outcome(action.id, "drain", result, fan.problems(), pool=node.pool, node=node.id, data=evidence)


def run_cordon(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """Stop new placements on the node in every scheduler it is bound to (an advisory's first stage)."""
    return _set_cordon(rt, action, plan_id, True)


def run_uncordon(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """Let every scheduler place work on the node again (the advisory cleared)."""
    return _set_cordon(rt, action, plan_id, False)


def _set_cordon(rt: Runtime, action: Action, plan_id: str | None, cordon: bool) -> Outcome:
    """The node's state moves (ACTIVE -> ADVISED, or back) only once every bound scheduler said yes; else
    the next pass asks again. A building node only remembers it (it is advised once active, by sync)."""
    node = node_for(rt, action)
    record_intent(rt, action, plan_id)
    fan = each_scheduler(rt, node, (lambda s: s.cordon(node.id, action.reason)) if cordon else
                         (lambda s: s.resume(node.id)))
    now = rt.now()
    result = fan.status
    src, dst = (NodeState.ACTIVE, NodeState.ADVISED) if cordon else (NodeState.ADVISED, NodeState.ACTIVE)
    with rt.store.tx():
        if node.state is src and fan.ok:
            rt.store.transition(node, dst, reason=action.reason, at=now, actor=rt.actor, cordoned=cordon)
        elif node.state is NodeState.BUILDING and fan.ok:
            rt.store.update_node(node, cordoned=cordon)
        audit_action(rt, action, node.id, result, **fan.evidence())
        finish_action(rt, action.id, str(action.kind), "done" if fan.ok else result, fan.problems() or "ok", now,
                      pool=node.pool, node=node.id)
    return Outcome(action.id, str(action.kind), result, fan.problems(), pool=node.pool, node=node.id,
                   data=fan.evidence())


def run_protect(rt: Runtime, action: Action, plan_id: str | None) -> Outcome:
    """Tell every scheduler of the node by when its work must end (SchedulerPort.protect). The node
    records what was told only once every bound scheduler took it; else the next pass tells it again."""
    node = node_for(rt, action)
    until, closed = action.inputs.get("until"), bool(action.inputs.get("closed"))
    record_intent(rt, action, plan_id)
    fan = each_scheduler(rt, node, lambda s: s.protect(node.id, until, closed))
    now = rt.now()
    result = fan.status
    with rt.store.tx():
        if fan.ok:
            rt.store.update_node(node, protected_until=until, protect_closed=closed and until is not None)
        audit_action(rt, action, node.id, result, until=until, closed=closed, **fan.evidence())
    finish_action(rt, action.id, "protect", "done" if fan.ok else result, fan.problems() or "ok", now,
                  pool=node.pool, node=node.id)
    return Outcome(action.id, "protect", result, fan.problems(), pool=node.pool, node=node.id, data=fan.evidence())
