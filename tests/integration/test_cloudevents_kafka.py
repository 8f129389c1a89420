"""A consumer using the official CloudEvents SDK reads the events spotctl publishes on the real
test broker (scripts/testenv/kafka): id, source, type, subject, time and data as queued, from rows
the SDK built and from a row an older spotctl wrote by hand."""

from __future__ import annotations

import json
import uuid

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka_event, from_structured_event
from cloudevents.core.formats.json import JSONFormat

from spotctl.adapters.kafka import KafkaRelay
from spotctl.core.models import Node, NodeState
from spotctl.ops.relay import relay
from spotctl.state.store import Store

from .conftest import testenv as service_env
from .record_support import consume

pytestmark = pytest.mark.integration

AT = 1767571200.5

OLD_ROW = ('{"data":{"action_id":"a0","from":null,"instance_id":null,"node":"old-0","pool":"gp","reason":"test",'
           '"to":"intended"},"datacontenttype":"application/json","id":"0b8e4a52-93c1-4c0e-8f0a-5e2f5d7f3a01",'
           '"source":"spotctl/ce","specversion":"1.0","subject":"old-0","time":"2026-01-05T00:00:00.500000Z",'
           '"type":"io.spotctl.node.intended"}')


def test_an_sdk_consumer_reads_our_events_from_the_broker(tmp_path):
    bootstrap = service_env("kafka")["KAFKA_BOOTSTRAP"]
    topic = f"ce-{uuid.uuid4().hex[:8]}"
    store = Store.open(tmp_path / "ce.db", "ce")
    out = KafkaRelay(bootstrap_servers=bootstrap, topic=topic, client_id="t-ce", max_wait_seconds=5,
                     transactional_id=f"t-ce-{uuid.uuid4().hex[:6]}")
    try:
        with store.tx() as c:  # queued by an older spotctl and never delivered: it must still publish
            c.execute("INSERT INTO outbox (kind, key, payload, created_at) VALUES ('event', 'old-0', ?, ?)",
                      (OLD_ROW, AT))
        node = Node(id="n-1", pool="gp", state=NodeState.INTENDED, action_id="a1", created_at=AT, updated_at=AT)
        with store.tx():
            store.add_node(node, actor="t", reason="test")
        store.transition(node, NodeState.BUILDING, reason="launched", at=AT + 1, actor="t", instance_id="i-1")
        store.cloud_event("io.spotctl.drill.started", "drill-1", {"drill": "drill-1", "nodes": ["n-1"]}, AT + 2)
        rows = store.outbox_rows("event")
        report = relay(store, {"kafka": out}, now=lambda: AT + 3)
        assert report.kinds["event"].delivered == 4 and not report.failed
    finally:
        out.close()
        store.close()

    messages = consume(bootstrap, topic)
    assert len(messages) == len(rows) == 4
    for m, row in zip(messages, rows):
        headers = {k: v for k, v in (m.headers or [])}
        assert headers["content-type"].decode().startswith(JSONFormat.CONTENT_TYPE)
        msg = KafkaMessage(headers=headers, key=m.key, value=m.value)
        event = from_structured_event(msg)
        stored = json.loads(row["payload"])
        assert event.get_specversion() == "1.0"
        assert (event.get_id(), event.get_source(), event.get_type(), event.get_subject()) == (
            stored["id"], stored["source"], stored["type"], stored["subject"])
        assert event.get_data() == stored["data"] and event.get_datacontenttype() == "application/json"
        assert event.get_extension("partitionkey") == row["key"]  # the Kafka key: per-node order
        assert from_kafka_event(msg).get_id() == stored["id"]  # the mode is detected as structured

    old, added, building, drill = (from_structured_event(KafkaMessage({}, m.key, m.value)) for m in messages)
    assert old.get_id() == "0b8e4a52-93c1-4c0e-8f0a-5e2f5d7f3a01" and old.get_source() == "spotctl/ce"
    assert old.get_time() is not None and old.get_time().timestamp() == AT
    assert (added.get_type(), added.get_subject(), added.get_source()) == ("io.spotctl.node.intended", "n-1",
                                                                           "spotctl/ce")
    assert building.get_type() == "io.spotctl.node.building" and building.get_data() == {
        "node": "n-1", "pool": "gp", "from": "intended", "to": "building", "reason": "launched",
        "instance_id": "i-1", "action_id": "a1"}
    assert building.get_time() is not None and building.get_time().timestamp() == AT + 1
    assert (drill.get_type(), drill.get_subject(), drill.get_data()) == (
        "io.spotctl.drill.started", "drill-1", {"drill": "drill-1", "nodes": ["n-1"]})
