"""What carrying out an action leaves behind: its :class:`Outcome` (returned, never raised), its intent
row committed before the side effect, and its audit record. Shared by ``act`` and ``drain``."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spotctl.core.actions import Action
from spotctl.core.models import OutcomeStatus

from .runtime import Runtime

log = logging.getLogger(__name__)

T = TypeVar("T")


def growing_chunks(items: Sequence[T], most: int) -> Iterator[Sequence[T]]:
    """``items`` in chunks of 1, 2, 4, ... up to ``most``: what a run of steps commits together. A run that
    stops early (a refusal, a kill) has committed little more than it did; a long one commits a few dozen
    times, not once per item (a commit writes again every page its rows share)."""
    size, k = 1, 0
    while k < len(items):
        yield items[k:k + size]
        k, size = k + size, min(2 * size, most)


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

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.action, "kind": self.kind, "status": self.status, "detail": self.detail}
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


def record_intent(rt: Runtime, action: Action, plan_id: str | None, **kw) -> bool:
    return rt.store.record_intent(action_id=action.id, plan_id=plan_id, kind=action.kind, priority=action.priority,
                                  reason=action.reason, actor=rt.actor, at=rt.now(), inputs=action.inputs,
                                  pool=action.pool, node=action.node, count=action.count, **kw)


def audit_action(rt: Runtime, action: Action, target: str, result: str, *, inputs: dict | None = None,
                 **extra) -> None:
    """The audit record of what ``action`` did to ``target``: the action's inputs (``inputs``: the part of them
    that concerns the target, when the caller has it), its reason and id, and ``extra``."""
    rt.store.audit(actor=rt.actor, action=f"node.{action.kind}", target=target, result=result,
                   inputs={**(action.inputs if inputs is None else inputs), "reason": action.reason,
                           "action_id": action.id, **extra}, at=rt.now())


def finish_action(rt: Runtime, action_id: str, kind: str, status: str, detail: str, at: float, *,
                  pool: str | None = None, node: str | None = None) -> None:
    """Record an action's outcome (its row's status and result) and, once that is committed, say it in one
    INFO log line carrying the action id, kind, pool or node and result (the one line per action that
    journald and the run's log file keep)."""
    rt.store.finish_action(action_id, status, detail, at)
    where = f" {pool}" if pool else ""
    where += f" {node}" if node else ""
    extra = {"region": rt.region.name, "action_id": action_id, "kind": kind, "pool": pool, "node": node,
             "result": status}
    rt.store.after_commit(lambda: log.info("action %s %s%s: %s%s", action_id, kind, where, status,
                                           f" ({detail})" if detail and detail != status else "", extra=extra))
