"""Lifecycle events are CloudEvents built by the official SDK, and an SDK consumer reads what we send.

The outbox keeps each event as its structured-mode JSON document (``spotctl.state.outbox``); the
Kafka adapter sends it unchanged with the structured content type. Rows written before the SDK was
used (the hand-made dict) read the same way. The round trip through the real broker is
tests/integration/test_cloudevents_kafka.py.
"""

from __future__ import annotations

import json

from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka_event, from_structured_event
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from spotctl.adapters.kafka import CONTENT_TYPE
from spotctl.core.models import Node, NodeState
from spotctl.ops.relay import relay
from spotctl.state.outbox import cloud_event, structured
from spotctl.state.store import Store

AT = 1767225600.25  # 2026-01-01T00:00:00.250000Z

#: an outbox row as spotctl wrote it before the SDK built events (kept byte for byte: old state databases have them)
OLD_ROW = ('{"data":{"action_id":"a1","from":null,"instance_id":null,"node":"n1","pool":"gp","reason":"test",'
           '"to":"intended"},"datacontenttype":"application/json","id":"6f1c2f0e-2d4b-4b8e-9a51-0d7c3c1e9b10",'
           '"source":"spotctl/r","specversion":"1.0","subject":"n1","time":"2026-01-01T00:00:00.250000Z",'
           '"type":"io.spotctl.node.intended"}')


class Captured:
    """An outlet that keeps what it is handed, as the Kafka adapter would send it."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []

    def deliver(self, rows: list[tuple[str, str]]) -> int:
        self.rows += rows
        return len(rows)

    def close(self) -> None:
        pass


def _read(key: str, payload: str) -> CloudEvent:
    """What an SDK consumer of our topic does with one record."""
    event = from_structured_event(KafkaMessage(headers={"content-type": CONTENT_TYPE}, key=key.encode(),
                                               value=payload.encode()))
    assert isinstance(event, CloudEvent)
    return event


def test_the_stored_event_is_the_document_the_sdk_writes_in_canonical_form():
    event = cloud_event(source="spotctl/r", type_="io.spotctl.node.active", subject="n1", data={"node": "n1"}, at=AT)
    doc = structured(event)
    assert doc == json.loads(JSONFormat().write(event))
    assert doc["specversion"] == "1.0" and doc["time"] == "2026-01-01T00:00:00.250000Z"
    assert doc["datacontenttype"] == "application/json" and doc["data"] == {"node": "n1"}


def test_an_sdk_consumer_reads_the_events_we_queue_and_an_old_row_alike(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    try:
        with s.tx():
            s.add_node(Node(id="n2", pool="gp", state=NodeState.INTENDED, action_id="a2", created_at=AT,
                            updated_at=AT), actor="t", reason="test")
        s.cloud_event("io.spotctl.drill.started", "d1", {"drill": "d1", "nodes": ["n2"]}, AT + 1)
        with s.tx() as c:  # an event queued by an older spotctl, not yet delivered
            c.execute("INSERT INTO outbox (kind, key, payload, created_at) VALUES ('event', 'n1', ?, ?)",
                      (OLD_ROW, AT))
        rows = s.outbox_rows("event")
        out = Captured()
        report = relay(s, {"kafka": out}, now=lambda: AT + 2)
        assert report.kinds["event"].delivered == 3 and report.kinds["event"].pending == 0
    finally:
        s.close()
    assert out.rows == [(r["key"], r["payload"]) for r in rows]  # sent as stored: an old row publishes unchanged

    node, drill, old = (_read(k, p) for k, p in out.rows)
    assert node.get_source() == "spotctl/r" and node.get_type() == "io.spotctl.node.intended"
    assert node.get_subject() == "n2" and node.get_id() == json.loads(rows[0]["payload"])["id"]
    assert node.get_data() == {"node": "n2", "pool": "gp", "from": None, "to": "intended", "reason": "test",
                               "instance_id": None, "action_id": "a2"}
    assert node.get_time() is not None and node.get_time().timestamp() == AT
    assert (drill.get_type(), drill.get_subject(), drill.get_data()) == (
        "io.spotctl.drill.started", "d1", {"drill": "d1", "nodes": ["n2"]})
    assert old.get_id() == "6f1c2f0e-2d4b-4b8e-9a51-0d7c3c1e9b10" and old.get_subject() == "n1"
    assert old.get_type() == "io.spotctl.node.intended" and old.get_data()["to"] == "intended"
    # the content type says structured mode: a consumer that detects the mode picks it
    assert CONTENT_TYPE.decode().startswith(JSONFormat.CONTENT_TYPE)
    assert from_kafka_event(KafkaMessage({"content-type": CONTENT_TYPE}, None, out.rows[2][1].encode())).get_id() \
        == old.get_id()
