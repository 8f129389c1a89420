"""The outbox: lifecycle events (CloudEvents) and audit records queued in the same transaction as the
state change they describe, for the relays (``spotctl.ops.relay``) to deliver and mark.

Events are CloudEvents 1.0, built and validated by the official ``cloudevents`` SDK
(:func:`cloud_event`, imported lazily) and kept in **structured JSON mode**: a row's payload is the
JSON document the SDK's JSON format writes for the event, in canonical form (sorted keys, no spaces),
which ``spotctl.adapters.kafka`` sends as it is (``content-type: application/cloudevents+json``) and
any CloudEvents consumer reads (``cloudevents.core.bindings.kafka.from_structured_event``). Rows
written before the SDK was used have the same shape and publish unchanged.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spotctl.core.audit import canonical
from spotctl.core.lifecycle import event_type
from spotctl.core.models import Node, NodeState
from spotctl.state.connection import StoreBase

if TYPE_CHECKING:
    from cloudevents.core.v1.event import CloudEvent


def cloud_event(*, source: str, type_: str, subject: str, data: dict[str, Any], at: float) -> CloudEvent:
    """A new CloudEvents 1.0 event (a fresh ``id``; ``data`` as JSON), validated by the SDK."""
    from cloudevents.core.v1.event import CloudEvent

    return CloudEvent({"id": str(uuid.uuid4()), "source": source, "type": type_, "subject": subject,
                       "time": datetime.fromtimestamp(at, tz=UTC), "datacontenttype": "application/json"},
                      data)


def structured(event: CloudEvent) -> dict[str, Any]:
    """The event's structured-mode JSON document (its attributes and ``data``), as the SDK's JSON format
    writes it (``time`` in RFC 3339 with ``Z``); the outbox keeps it as :func:`spotctl.core.audit.canonical`
    JSON."""
    attributes = event.get_attributes()
    time: datetime = attributes["time"]
    return {**attributes, "time": time.isoformat().removesuffix("+00:00") + "Z", "data": event.get_data()}


class Outbox(StoreBase):
    """The outbox methods of :class:`spotctl.state.store.Store`."""

    def event(self, node: Node, src: NodeState | None, reason: str, at: float) -> None:
        """The lifecycle event of a node's transition (keyed by node id: per-node order on Kafka)."""
        self.cloud_event(event_type(node.state), node.id, {
            "node": node.id, "pool": node.pool, "from": src.value if src else None, "to": node.state.value,
            "reason": reason, "instance_id": node.instance_id, "action_id": node.action_id}, at)

    def cloud_event(self, type_: str, subject: str, data: dict, at: float, key: str | None = None) -> None:
        """Queue a CloudEvents 1.0 (structured JSON) event in the outbox, in the caller's transaction."""
        event = cloud_event(source=f"spotctl/{self.region}", type_=type_, subject=subject, data=data, at=at)
        self.outbox("event", key or subject, structured(event), at)

    def outbox(self, kind: str, key: str, payload: dict, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)",
                      (kind, key, canonical(payload), at))

    def outbox_rows(self, kind: str | None = None, pending_only: bool = False) -> list[dict]:
        sql = "SELECT * FROM outbox WHERE 1=1"
        args: list = []
        if kind:
            sql += " AND kind=?"
            args.append(kind)
        if pending_only:
            sql += " AND delivered_at IS NULL"
        return [dict(r) for r in self.conn.execute(sql + " ORDER BY id", args)]

    # -- for the relay ---------------------------------------------------------------

    def pending_batch(self, kind: str, limit: int, after_id: int = 0) -> list[tuple[int, str, str]]:
        """The oldest undelivered outbox rows of a kind, as (id, key, payload), in id order (no sort: index)."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT id, key, payload FROM outbox WHERE kind=? AND delivered_at IS NULL AND id > ? ORDER BY id LIMIT ?",
            (kind, after_id, int(limit)))]

    def mark_delivered(self, ids: list[int], at: float) -> None:
        """Mark outbox rows delivered (called only after the destination acknowledged them)."""
        with self.tx() as c:
            c.executemany("UPDATE outbox SET delivered_at=? WHERE id=? AND delivered_at IS NULL",
                          [(at, i) for i in ids])

    def outbox_pending(self, kind: str) -> tuple[int, float | None]:
        """(undelivered rows of a kind, creation time of the oldest)."""
        r = self.conn.execute("SELECT count(*), min(created_at) FROM outbox WHERE kind=? AND delivered_at IS NULL",
                              (kind,)).fetchone()
        return r[0], r[1]
