"""Operator actions (``spotctl launch`` and ``spotctl drain``).

They go through the same budget, intents, audit records and outbox as the
reconciler's own actions, under the same region lock.
"""

from __future__ import annotations

import hashlib

from spotctl.core.actions import Action, ActionKind
from spotctl.core.budget import Priority
from spotctl.core.capacity import headroom
from spotctl.core.errors import RefusedError, SpotctlError, UsageError
from spotctl.core.lifecycle import drainable, drainable_states

from .act import Outcome, execute
from .runtime import Runtime

MAX_OPERATOR_LAUNCH = 500


def _action_id(rt: Runtime, *parts) -> str:
    h = hashlib.sha1("|".join([rt.actor, repr(rt.now()), *map(str, parts)]).encode()).hexdigest()[:12]
    return f"op-{h}"


def launch(rt: Runtime, pool_name: str, count: int, *, dry_run: bool = False,
           wait: float = 0.0) -> tuple[Outcome | None, dict]:
    """Launch ``count`` nodes in a pool now. Under the region lock (waiting up to ``wait`` s for it), the
    headroom, limit and budget checks and the launch itself see the region as it is then."""
    pool = rt.region.pool(pool_name)  # NotFoundError for an unknown pool
    if count < 1:
        raise UsageError(f"--count must be at least 1, got {count}")
    if count > MAX_OPERATOR_LAUNCH:
        raise UsageError(f"--count {count} is more than one operator launch may ask for ({MAX_OPERATOR_LAUNCH})")
    if dry_run:
        action, facts = _launch_action(rt, pool, count)
        return None, {**facts, "action": action.to_dict()}
    with rt.locked(wait, f"launch {count} in {pool.name}, by {rt.actor}"):
        action, facts = _launch_action(rt, pool, count)
        out = execute(rt, action, None)
    return out, facts


def _launch_action(rt: Runtime, pool, count: int) -> tuple[Action, dict]:
    """The checks of an operator launch (RefusedError when one fails) and the action that does it."""
    now = rt.now()
    hosts = rt.cloud.hosts({pool.name: pool})
    hr = headroom(pool, hosts, now)
    live = [n for n in rt.store.nodes(live_only=True) if n.pool == pool.name]
    limit_left = max(0, pool.max_nodes - len(live))
    facts = {"pool": pool.name, "count": count, "headroom": hr.free, "pool_limit_left": limit_left,
             "tokens_available": rt.bucket().available(Priority.OPERATOR, now)}
    if count > limit_left:
        raise RefusedError(f"pool {pool.name} has room for {limit_left} more nodes under its limit of "
                           f"{pool.max_nodes}; asked for {count}", details=facts)
    if count > hr.free:
        raise RefusedError(f"pool {pool.name} has headroom for {hr.free} nodes now; asked for {count}",
                           hint="`spotctl status` shows headroom per pool", details=facts)
    if count > facts["tokens_available"]:
        raise RefusedError(f"the region's token budget allows {facts['tokens_available']} operator calls now; "
                           f"asked for {count}", hint="wait for the bucket to refill or ask for fewer", details=facts)
    try:
        rate = rt.contract.rate_card()
    except SpotctlError:  # no price known: the launch is still an operator's call, recorded without one
        rate = None
    price = rate.prices.get(pool.name) if rate else None
    action = Action(id=_action_id(rt, "launch", pool.name, count), kind=ActionKind.LAUNCH, priority=Priority.OPERATOR,
                    reason=f"operator launch requested by {rt.actor}", pool=pool.name, count=count, price=price,
                    inputs={"rate_card_version": rate.version if rate else None, "headroom": hr.free,
                            "budget_tokens": facts["tokens_available"]})
    return action, facts


def drain(rt: Runtime, node_id: str, reason: str, *, dry_run: bool = False,
          wait: float = 0.0) -> tuple[Outcome | None, dict]:
    """Drain a node in every scheduler now, under the region lock (waiting up to ``wait`` s for it)."""
    if not reason.strip():
        raise UsageError("--reason must say why the node is drained (it goes into the audit record)")
    action, facts = _drain_action(rt, node_id, reason)  # an unknown node or a wrong state: said before any wait
    if dry_run:
        return None, {**facts, "action": action.to_dict()}
    with rt.locked(wait, f"drain {node_id[:80]}, by {rt.actor}"):
        action, facts = _drain_action(rt, node_id, reason)  # the node as it is once the lock is ours
        out = execute(rt, action, None)
    return out, facts


def _drain_action(rt: Runtime, node_id: str, reason: str) -> tuple[Action, dict]:
    node = rt.store.node(node_id)  # NotFoundError for an unknown node
    if not drainable(node.state):
        raise RefusedError(f"node {node.id} is {node.state}; only {drainable_states()} nodes can be drained")
    action = Action(id=_action_id(rt, "drain", node.id), kind=ActionKind.DRAIN, priority=Priority.OPERATOR,
                    reason=f"operator ({rt.actor}): {reason.strip()}", pool=node.pool, node=node.id,
                    inputs={"requested_by": rt.actor})
    facts = {"node": node.id, "pool": node.pool, "state": str(node.state)}
    return action, facts
