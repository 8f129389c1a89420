"""The record against the real test broker (scripts/testenv/kafka) and the reference audit receiver.

- lifecycle events arrive on Kafka in order per key (node id) and parse as CloudEvents 1.0;
- the relay's producer is transactional against the test broker, and a batch whose transaction
  was aborted (or left open by a dead relay and fenced) stays invisible to read_committed consumers;
- a broker without transactions: events still go (idempotent producer), but the pass is partial and
  the degraded mode shows in `spot-reconciler`'s summary and metrics and in `spotctl status`;
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
from spotctl.core.errors import TemporaryError
from spotctl.core.ports import FixedClock
from spotctl.ops.reconcile import run_pass
from spotctl.ops.runtime import Runtime
from spotctl.sim.world import SimWorld
from spotctl.state.store import Store

from .conftest import testenv as service_env
from .record_support import (BIN, NoTransactionsBroker, Receiver, consume, dedupe, dedupe_checked, free_port, per_key,
                             region_toml)

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
            assert r.relay["event"]["mode"] == "transactional" and r.relay["event"]["degraded"] is None
        outbox = store.outbox_rows("event")
        assert all(row["delivered_at"] is not None for row in outbox)
    finally:
        for o in rt.outlets.values():
            o.close()
        store.close()
    assert len(outbox) >= 30

    messages = consume(bootstrap, f"spot.lifecycle.{name}")
    events, dups = dedupe_checked(messages)
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


def _reconcile(cfg, name, *args: str, stderr: list | None = None) -> tuple[int, dict]:
    env = {**os.environ, "SPOTCTL_CONFIG": str(cfg)}
    p = subprocess.run([str(BIN / "spot-reconciler"), "-r", name, *args], capture_output=True, text=True, env=env,
                       timeout=120)
    if stderr is not None:
        stderr.append(p.stderr)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}


def _events(n: int, tag: str) -> list[tuple[str, str]]:
    return [(f"node-{i % 2}", json.dumps({"id": f"{tag}-{i}", "subject": f"node-{i % 2}"})) for i in range(n)]


def _ids(messages) -> list[str]:
    return [json.loads(m.value)["id"] for m in messages]


def test_the_relay_producer_is_transactional_against_the_test_broker(bootstrap):
    out = KafkaRelay(bootstrap_servers=bootstrap, topic=f"txn-{uuid.uuid4().hex[:8]}", client_id="t-txn",
                     max_wait_seconds=5)
    try:
        assert out.mode is None  # not known before the first connection
        assert out.deliver(_events(3, "a")) == 3
        assert out.mode == "transactional" and out.transactional is True
        assert out.degraded is None
    finally:
        out.close()


def test_an_aborted_batch_stays_invisible_to_read_committed_consumers(bootstrap):
    """Committed batches are visible; aborted ones are in the log (read_uncommitted sees them) but hidden."""
    from kafka.errors import ProducerFencedError

    topic = f"abort-{uuid.uuid4().hex[:8]}"
    tid = f"t-abort-{uuid.uuid4().hex[:6]}"
    out = KafkaRelay(bootstrap_servers=bootstrap, topic=topic, client_id="t-abort", transactional_id=tid,
                     max_wait_seconds=5)
    zombie = None
    try:
        assert out.deliver(_events(3, "committed1")) == 3

        # 1. the adapter's own abort path (what publish() does on any failure), after the batch reached the log
        p = out._connect()
        assert out.transactional
        p.begin_transaction()
        futures = [p.send(topic, key=k.encode(), value=v.encode()) for k, v in _events(3, "aborted")]
        p.flush(timeout=5)
        assert all(f.succeeded() for f in futures)  # the broker has the records, in an open transaction
        out._reset(abort=True)

        # 2. a batch that fails half-way through publish(): a record larger than the producer may send
        with pytest.raises(TemporaryError):
            out.deliver(_events(2, "failed") + [("node-0", json.dumps({"id": "failed-big", "pad": "x" * 2_000_000}))])

        # 3. a relay killed mid-batch: its transaction stays open until the next relay (same
        #    transactional.id) starts; that one fences the dead one, and the broker aborts its batch
        zombie = KafkaRelay(bootstrap_servers=bootstrap, topic=topic, client_id="t-abort", transactional_id=tid,
                            max_wait_seconds=5)
        zp = zombie._connect()
        zp.begin_transaction()
        zf = [zp.send(topic, key=k.encode(), value=v.encode()) for k, v in _events(3, "dead")]
        zp.flush(timeout=5)
        assert all(f.succeeded() for f in zf)
        nxt = KafkaRelay(bootstrap_servers=bootstrap, topic=topic, client_id="t-abort", transactional_id=tid,
                         max_wait_seconds=5)
        try:
            assert nxt.deliver(_events(3, "committed2")) == 3 and nxt.transactional
        finally:
            nxt.close()
        with pytest.raises(ProducerFencedError):  # the dead relay, had it woken up, could not commit
            zp.commit_transaction()
    finally:
        out.close()
        if zombie is not None:
            zombie._reset(abort=False)

    committed = _ids(consume(bootstrap, topic))
    everything = _ids(consume(bootstrap, topic, isolation="read_uncommitted"))
    assert committed == [f"committed1-{i}" for i in range(3)] + [f"committed2-{i}" for i in range(3)]
    # not vacuous: the aborted and the fenced batches are in the log, only hidden from read_committed
    assert {f"aborted-{i}" for i in range(3)} | {f"dead-{i}" for i in range(3)} <= set(everything)


def test_a_batch_re_sent_after_a_crash_before_its_mark_is_one_batch_of_identical_duplicates(tmp_path, bootstrap):
    """The at-least-once bound, made to happen: a batch committed on Kafka but not marked in the outbox
    (the relay died in between) goes again with the next pass: at most batch_size raw duplicates per
    crash, byte-identical, and 0 after the consumer's dedupe by id."""
    from spotctl.core.models import Node, NodeState
    from spotctl.ops.relay import relay

    topic = f"resend-{uuid.uuid4().hex[:8]}"
    store = Store.open(tmp_path / "s.db", "r")
    out = KafkaRelay(bootstrap_servers=bootstrap, topic=topic, client_id="t-resend", max_wait_seconds=5,
                     batch_size=3, transactional_id=f"t-resend-{uuid.uuid4().hex[:6]}")
    try:
        for i in range(7):
            with store.tx():
                store.add_node(Node(id=f"n{i % 2}-{i}", pool="gp", state=NodeState.INTENDED, action_id=f"a{i}",
                                    created_at=1.0 + i, updated_at=1.0 + i), actor="t", reason="test")
        rows = store.outbox_rows("event")
        first = store.pending_batch("event", out.batch_size)
        assert out.deliver([(k, p) for _, k, p in first]) == 3  # committed ... and the relay dies here
        report = relay(store, {"kafka": out}, now=lambda: 2000.0)
        assert report.kinds["event"].delivered == len(rows) and report.kinds["event"].pending == 0
    finally:
        out.close()
        store.close()
    messages = consume(bootstrap, topic)
    events, dups = dedupe_checked(messages)
    assert len(messages) == len(rows) + 3 and dups == 3 <= out.batch_size * 1  # one crash: one batch again
    assert [e["id"] for e in events] == [json.loads(r["payload"])["id"] for r in rows]


def test_a_broker_without_idempotence_either_gets_an_acks_all_producer_and_says_so(bootstrap):
    proxy = NoTransactionsBroker(bootstrap, hide=frozenset({22, 24, 25, 26, 28}))  # InitProducerId too
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    out = KafkaRelay(bootstrap_servers=proxy.bootstrap, topic=topic, client_id="t-plain", max_wait_seconds=5)
    try:
        assert out.deliver(_events(3, "p")) == 3
        assert out.mode == "acks-all" and not out.transactional
        assert "does not offer transactions" in out.degraded and "acks-all producer" in out.degraded
    finally:
        out.close()
        proxy.close()
    assert _ids(consume(bootstrap, topic)) == [f"p-{i}" for i in range(3)]


def _metrics(path) -> dict[str, float]:
    """sample -> value, each sample written ``name{label="value",...}`` with its labels in the order given
    here (the file parsed by prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    order = ("region", "destination", "mode")
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            labels = ",".join(f'{k}="{s.labels[k]}"' for k in sorted(s.labels, key=lambda k: (order + (k,)).index(k)))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _queue_event(db, name) -> None:
    """A lifecycle event of no node in the outbox: a later pass surely has something to send (a pass
    with nothing to send does not connect, and reports the mode seen last)."""
    s = Store.open(db, name)
    try:
        s.cloud_event("io.spotctl.test.marker", "marker", {"why": "make the relay connect"}, START)
    finally:
        s.close()


def _status(cfg, name) -> dict:
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "-r", name, "status"], capture_output=True, text=True,
                       env={**os.environ, "SPOTCTL_CONFIG": str(cfg)}, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["data"]


def test_a_broker_without_transactions_is_a_visible_degraded_state(tmp_path, bootstrap, receiver):
    """The relay still delivers (idempotent producer) but says so: pass partial (exit 7), a warning on
    stderr, `spotctl_relay_transactional 0` / `spotctl_relay_degraded 1`, and `spotctl status` degraded.
    The broker is the real test broker behind a wire proxy that hides its transaction APIs."""
    name = f"notxn{uuid.uuid4().hex[:8]}"
    proxy = NoTransactionsBroker(bootstrap)
    metrics = tmp_path / "spotctl.prom"
    db = tmp_path / "state" / f"{name}.db"
    try:
        cfg = _config(tmp_path, name, bootstrap=proxy.bootstrap, audit_url=receiver.url,
                      token_file=receiver.token_file)
        err: list[str] = []
        code, summary = _reconcile(cfg, name, "--metrics-file", str(metrics), stderr=err)
        assert code == 7, (summary, err)
        assert summary["degraded"] == ["relay.kafka.mode"], summary
        assert "does not offer transactions" in err[0] and "idempotent producer" in err[0]
        m = _metrics(metrics)
        assert m[f'spotctl_relay_transactional{{region="{name}",destination="kafka",mode="idempotent"}}'] == 0
        assert m[f'spotctl_relay_degraded{{region="{name}",destination="kafka"}}'] == 1
        assert m[f'spotctl_last_pass_ok{{region="{name}"}}'] == 0
        st = _status(cfg, name)
        assert st["relay"]["kafka"]["mode"] == "idempotent"
        assert "does not offer transactions" in st["degraded"]["relay.kafka.mode"]
        # degraded, not down: every event went, once
        rows = _delivered_events(db, name)
        events, dups = dedupe_checked(consume(bootstrap, f"spot.lifecycle.{name}"))
        assert dups == 0 and [e["id"] for e in events] == [json.loads(r["payload"])["id"] for r in rows]

        # the operator accepts an idempotent producer: no longer degraded (the metric still says 0)
        _queue_event(db, name)  # something to send, so that the relay connects in this pass
        cfg.write_text(cfg.read_text().replace("batch_size = 500\n", "batch_size = 500\ntransactions = false\n", 1))
        code, summary = _reconcile(cfg, name, "--metrics-file", str(metrics))
        assert code == 0 and summary["degraded"] == [], summary
        m = _metrics(metrics)
        assert m[f'spotctl_relay_transactional{{region="{name}",destination="kafka",mode="idempotent"}}'] == 0
        assert m[f'spotctl_relay_degraded{{region="{name}",destination="kafka"}}'] == 0
        assert "relay.kafka.mode" not in _status(cfg, name)["degraded"]
    finally:
        proxy.close()

    # a broker with transactions again: transactional, not degraded
    cfg.write_text(cfg.read_text().replace(proxy.bootstrap, bootstrap).replace("transactions = false\n", ""))
    _queue_event(db, name)
    code, summary = _reconcile(cfg, name, "--metrics-file", str(metrics))
    assert code == 0, summary
    m = _metrics(metrics)
    assert m[f'spotctl_relay_transactional{{region="{name}",destination="kafka",mode="transactional"}}'] == 1
    assert m[f'spotctl_relay_degraded{{region="{name}",destination="kafka"}}'] == 0
    st = _status(cfg, name)
    assert st["relay"]["kafka"]["mode"] == "transactional" and "relay.kafka.mode" not in st["degraded"]


def _delivered_events(db, name) -> list:
    """The region's outbox event rows, once none is left pending."""
    s = Store.open(db, name)
    try:
        assert s.outbox_pending("event")[0] == 0
        return s.outbox_rows("event")
    finally:
        s.close()


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
    rows = _delivered_events(db, name)
    events, _ = dedupe(consume(bootstrap, f"spot.lifecycle.{name}"))
    assert [e["id"] for e in events] == [json.loads(r["payload"])["id"] for r in rows]  # drained in outbox order
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "-r", name, "audit", "verify"],
                       capture_output=True, text=True, env={**os.environ, "SPOTCTL_CONFIG": str(cfg)})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["service"]["ok"]


def test_a_region_without_kafka_or_audit_queues_nothing_and_is_not_degraded(tmp_path):
    """The demo region has neither table: nothing is queued for relays that do not exist (the outbox does not
    grow with history), the pass is ok, and the ledger still holds every audit record."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "reconcile"], capture_output=True, text=True, env=env,
                       timeout=120)
    d = json.loads(p.stdout)["data"]
    assert p.returncode == 0 and d["status"] == "ok"
    assert d["relay"]["event"]["configured"] is False and d["relay"]["event"]["pending"] == 0
    assert d["relay"]["audit"]["error"] is None and d["relay"]["audit"]["pending"] == 0
    s = Store.open(tmp_path / "spotctl" / "demo.db", "demo")
    try:
        assert s.counts()["outbox"] == 0 and s.verify_audit()[0] and s.verify_audit()[2] > 0
    finally:
        s.close()


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
