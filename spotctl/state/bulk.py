"""Rows for many writes at once: the outbox rows of many lifecycle events and the chained audit rows of
many records, built in Python for one ``executemany`` each (:meth:`spotctl.state.store.Store.adopt_nodes`).

They are the rows :meth:`Outbox.event <spotctl.state.outbox.Outbox.event>` and :meth:`AuditLog.audit
<spotctl.state.audit.AuditLog.audit>` write one at a time, byte for byte the same shape: an event's
payload is the structured-mode CloudEvent the ``cloudevents`` SDK makes (the SDK builds and validates
the first event of each type and source; the others of the batch differ from it only in ``id``,
``subject`` (checked non-empty), ``time`` (written as the SDK writes it) and ``data``), and an audit
record is hashed by :func:`spotctl.core.audit.audit_hash`, chained after the one before it.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from collections.abc import Callable
from typing import Any

from spotctl.core.audit import audit_hash, canonical
from spotctl.core.lifecycle import check_transition, event_type
from spotctl.core.models import Node, NodeState
from spotctl.state.outbox import cloud_event, structured

#: one row of the outbox: (kind, key, payload, created_at)
OutboxRow = tuple[str, str, str, float]


class EventRows:
    """Outbox rows of lifecycle events from one source (a region), built without one SDK object each."""

    def __init__(self, region: str):
        self.source = f"spotctl/{region}"
        self._templates: dict[str, dict[str, Any]] = {}
        self._times: dict[float, str] = {}

    def _time(self, at: float) -> str:
        text = self._times.get(at)
        if text is None:  # as structured() writes it: RFC 3339, "Z", microseconds only when there are any
            text = self._times[at] = datetime.fromtimestamp(at, tz=UTC).isoformat().removesuffix("+00:00") + "Z"
        return text

    def event(self, type_: str, subject: str, data: dict, at: float) -> OutboxRow:
        """The outbox row of one CloudEvent (keyed by its subject, as ``Outbox.cloud_event`` keys it)."""
        template = self._templates.get(type_)
        if template is None:  # the SDK builds and validates the first one of its type
            doc = self._templates[type_] = structured(cloud_event(
                source=self.source, type_=type_, subject=subject, data=data, at=at))
        else:
            if not isinstance(subject, str) or not subject:
                raise ValueError(f"a CloudEvent's subject must be a non-empty string, not {subject!r}")
            doc = {**template, "id": str(uuid.uuid4()), "subject": subject, "time": self._time(at), "data": data}
        return ("event", subject, canonical(doc), at)

    def transition(self, node: Node, src: NodeState | None, dst: NodeState, reason: str, at: float) -> OutboxRow:
        """The event of a node's transition ``src`` -> ``dst`` (the data ``Outbox.event`` gives it)."""
        return self.event(event_type(dst), node.id, {
            "node": node.id, "pool": node.pool, "from": src.value if src else None, "to": dst.value,
            "reason": reason, "instance_id": node.instance_id, "action_id": node.action_id}, at)


class AuditRows:
    """Chained audit records, each with its outbox row, after the chain's current head."""

    def __init__(self, region: str, head: str):
        self.region = region
        self.head = head  # the hash of the last record (the next one's prev_hash)

    def record(self, *, actor: str, action: str, target: str, result: str, inputs: dict,
               at: float) -> tuple[tuple, OutboxRow]:
        """(the audit table's row, the outbox row) of one record, as ``AuditLog.audit`` writes them."""
        text = canonical(inputs)
        if not _flat(inputs):  # the record keeps the inputs as JSON gives them back
            inputs = json.loads(text)
            text = canonical(inputs)
        rec: dict[str, Any] = {"id": str(uuid.uuid4()), "at": at, "actor": actor, "action": action,
                               "target": target, "result": result, "inputs": inputs}
        prev, h = self.head, audit_hash(rec, self.head)
        self.head = h
        row = (rec["id"], at, actor, action, target, result, text, prev, h)
        rec.update(prev_hash=prev, hash=h, region=self.region)
        return row, ("audit", rec["id"], canonical(rec), at)


def _flat(inputs: dict) -> bool:
    """Inputs JSON gives back unchanged: string keys, and strings, finite numbers, booleans or None."""
    return all(type(k) is str and (v is None or type(v) in (str, bool, int) or (type(v) is float and math.isfinite(v)))
               for k, v in inputs.items())


def adoption_rows(adopted: list[tuple[Node, NodeState]], *, at: float, actor: str, events: EventRows,
                  chain: AuditRows, row: Callable[[Node], tuple]) -> tuple[list, list, list, list]:
    """The rows of adopting these nodes (each ``intended``, then moved to its state): (nodes, transitions,
    audit, outbox), each in the order ``Store.add_node``, ``Store.transition`` and ``Store.audit`` called
    node by node would write them; each node is changed as the transition changes it."""
    nodes: list[tuple] = []
    moves: list[tuple] = []
    audit: list[tuple] = []
    outbox: list[OutboxRow] = []
    for node, to in adopted:
        check_transition(node.id, NodeState.INTENDED, to)
        born, first = node.created_at, node.reason
        moves.append((node.id, None, NodeState.INTENDED.value, born, first, actor))
        outbox.append(events.transition(node, None, NodeState.INTENDED, first, born))
        node.state, node.updated_at, node.reason = to, at, "adopted"
        nodes.append(row(node))
        moves.append((node.id, NodeState.INTENDED.value, to.value, at, "adopted", actor))
        outbox.append(events.transition(node, NodeState.INTENDED, to, "adopted", at))
        record, queued = chain.record(actor=actor, action="node.adopt", target=node.id, result="ok",
                                      inputs={"instance_id": node.instance_id, "pool": node.pool}, at=at)
        audit.append(record)
        outbox.append(queued)
    return nodes, moves, audit, outbox
