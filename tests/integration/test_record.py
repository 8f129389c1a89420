"""The record against the real test broker (scripts/testenv/kafka) and the reference audit receiver.

- lifecycle events arrive on Kafka in order per key (node id) and parse as CloudEvents 1.0;
- broker down: the outbox grows and `spot-reconciler` exits 7; broker back: it drains, in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from spotctl.adapters.audit_http import AuditClient
from spotctl.adapters.kafka import KafkaRelay
from spotctl.core.config import load_config
from spotctl.core.ports import FixedClock
from spotctl.ops.reconcile import run_pass
from spotctl.ops.runtime import Runtime
from spotctl.sim.world import SimWorld
from spotctl.state.store import Store

from .conftest import testenv as service_env
from .record_support import BIN, Receiver, consume, dedupe, free_port, per_key, region_toml

pytestmark = pytest.mark.integration

START = 1767571200.0 + 9 * 3600


@pytest.fixture(scope="module")
def bootstrap() -> str:
    return service_env("kafka")["KAFKA_BOOTSTRAP"]


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.stop()


def _config(tmp_path, name: str, **kw):
    path = tmp_path / "config.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n' + region_toml(name, **kw))
    return path


def test_events_arrive_in_order_per_key_and_parse_as_cloudevents(tmp_path, bootstrap, receiver):
    name = f"rec{uuid.uuid4().hex[:8]}"
    cfg = _config(tmp_path, name, bootstrap=bootstrap, audit_url=receiver.url, token_file=receiver.token_file,
                  kafka_batch=7)
    region = load_config(env={"SPOTCTL_CONFIG": str(cfg)}).region(name)
    world = SimWorld.new(region, START, 3)
    store = Store.open(tmp_path / "state.db", name)
    rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract,
                 schedulers=list(world.schedulers), clock=FixedClock(START), actor="tester", concurrent_observe=False)
    rt.outlets = {"kafka": KafkaRelay.from_config(region), "audit": AuditClient.from_config(region)}
    try:
        for _ in range(40):  # 40 passes, 30 s apart: launches, boots, idle reclaims, drains, deletions
            rt.clock.advance(30)
            world.advance(rt.clock.now())
            r = run_pass(rt)
            assert r.status == "ok", r.degraded
            assert r.relay["event"]["error"] is None and r.relay["event"]["pending"] == 0
        outbox = store.outbox_rows("event")
        assert all(row["delivered_at"] is not None for row in outbox)
    finally:
        for o in rt.outlets.values():
            o.close()
        store.close()
    assert len(outbox) >= 30

    messages = consume(bootstrap, f"spot.lifecycle.{name}")
    events, dups = dedupe(messages)
    assert dups == 0  # no crash here: the idempotent, transactional producer wrote each event once
    for ev in events:
        assert ev["specversion"] == "1.0"
        assert {"id", "source", "type", "subject", "time"} <= set(ev)
        assert ev["source"] == f"spotctl/{name}" and ev["type"].startswith("io.spotctl.node.")
        assert ev["datacontenttype"] == "application/json" and ev["data"]["node"] == ev["subject"]
        assert ev["_key"] == ev["subject"]  # keyed by node id
        assert ev["_headers"]["content-type"].startswith(b"application/cloudevents+json")
    expected: dict[str, list[str]] = {}
    for row in outbox:
        expected.setdefault(row["key"], []).append(json.loads(row["payload"])["id"])
    assert per_key(events) == expected  # every event, once, in order per node
    # each node's transitions read as a legal lifecycle, in order
    for node, ids in per_key(events).items():
        evs = [e for e in events if e["subject"] == node]
        assert evs[0]["data"]["from"] is None
        assert all(b["data"]["from"] == a["data"]["to"] for a, b in zip(evs, evs[1:]))
    assert len(receiver.records(name)) == len(Store.open(tmp_path / "state.db", name).audit_records())


def _reconcile(cfg, name) -> tuple[int, dict]:
    env = {**os.environ, "SPOTCTL_CONFIG": str(cfg)}
    p = subprocess.run([str(BIN / "spot-reconciler"), "-r", name], capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}


def test_broker_down_outbox_grows_and_pass_exits_7_then_drains_in_order(tmp_path, bootstrap, receiver):
    name = f"down{uuid.uuid4().hex[:8]}"
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: the broker is down
    cfg = _config(tmp_path, name, bootstrap=dead, audit_url=receiver.url, token_file=receiver.token_file,
                  kafka_wait=1.5)
    db = tmp_path / "state" / f"{name}.db"
    pending = []
    for _ in range(3):
        code, summary = _reconcile(cfg, name)
        assert code == 7, summary
        assert "relay.kafka" in summary["degraded"]
        s = Store.open(db, name)
        pending.append(s.outbox_pending("event")[0])
        assert s.outbox_pending("audit")[0] == 0  # the audit service is up: its rows went
        s.close()
    assert pending[0] > 0 and pending == sorted(pending)  # the outbox only grows while the broker is away

    cfg.write_text(cfg.read_text().replace(dead, bootstrap))  # the broker is back
    code, summary = _reconcile(cfg, name)
    assert code == 0, summary
    s = Store.open(db, name)
    try:
        assert s.outbox_pending("event")[0] == 0
        rows = s.outbox_rows("event")
    finally:
        s.close()
    events, _ = dedupe(consume(bootstrap, f"spot.lifecycle.{name}"))
    assert [e["id"] for e in events] == [json.loads(r["payload"])["id"] for r in rows]  # drained in outbox order
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "-r", name, "audit", "verify"],
                       capture_output=True, text=True, env={**os.environ, "SPOTCTL_CONFIG": str(cfg)})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["service"]["ok"]


def test_a_region_without_kafka_or_audit_keeps_rows_queued_and_is_not_degraded(tmp_path):
    """The demo region has neither table: rows wait, the pass is ok (status says how many wait)."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "reconcile"], capture_output=True, text=True, env=env,
                       timeout=120)
    d = json.loads(p.stdout)["data"]
    assert p.returncode == 0 and d["status"] == "ok"
    assert d["relay"]["event"]["configured"] is False and d["relay"]["event"]["pending"] > 0
    assert d["relay"]["audit"]["error"] is None and d["relay"]["audit"]["pending"] > 0


def test_an_unreachable_broker_costs_a_bounded_wait_and_rows_stay_queued(tmp_path):
    import time

    from spotctl.ops.relay import relay

    store = Store.open(tmp_path / "s.db", "r")
    try:
        from spotctl.core.models import Node, NodeState

        with store.tx():
            store.add_node(Node(id="n1", pool="gp", state=NodeState.INTENDED, action_id="a1", created_at=1.0,
                                updated_at=1.0), actor="t", reason="test")
        out = KafkaRelay(bootstrap_servers=f"127.0.0.1:{free_port()}", topic="t", client_id="t", max_wait_seconds=1.5)
        t0 = time.monotonic()
        report = relay(store, {"kafka": out}, now=time.time)
        took = time.monotonic() - t0
        out.close()
        assert took < 4.0, took
        assert "unavailable" in report.failed["kafka"] and report.kinds["event"].pending == 1
    finally:
        store.close()
