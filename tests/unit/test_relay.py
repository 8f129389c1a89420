"""The outbox relay (spotctl.ops.relay) against the real reference audit receiver over HTTP.

Kafka is covered in tests/integration/test_record*.py (it needs the test broker); here only how a
delivery mode the relay recorded (e.g. Kafka without transactions) reaches `spotctl status`.
Here the audit log service is the real receiver on a loopback port, sometimes
behind a fault-injecting proxy (500s, timeouts, answers lost after storing).
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spotctl.adapters.audit_http import AuditClient
from spotctl.core.errors import AuthError, TemporaryError, UnavailableError
from spotctl.ops.relay import last_modes, mode_key, relay
from spotctl.state.store import Store
from tests.conftest import AUDIT_TOKEN

TOKEN = AUDIT_TOKEN


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "state.db", "r1")
    yield s
    s.close()


def fill(store: Store, n: int, t0: float = 1000.0) -> list[dict]:
    recs = []
    for i in range(n):
        with store.tx():
            recs.append(store.audit(actor="tester", action="node.launch", target=f"node-{i % 3}", result="ok",
                                    inputs={"i": i, "pool": "gp"}, at=t0 + i))
    return recs


def stored(server) -> list[dict]:
    return server.ledger.page("r1", 0, 10000)


class FaultProxy:
    """A loopback HTTP proxy to the receiver that misbehaves on a script of requests.

    Each entry of ``script`` handles one request: "500" answers 500 without forwarding,
    "slow" waits longer than the client's timeout, "lost" forwards (the receiver stores the
    batch) and then answers 502, "ok" forwards. After the script, every request is forwarded.
    """

    def __init__(self, upstream: str, script: list[str], slow_seconds: float = 1.5):
        self.script = list(script)
        self.seen: list[str] = []
        host, port = upstream.replace("http://", "").split(":")
        proxy = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self, body):
                c = http.client.HTTPConnection(host, int(port), timeout=10)
                c.request(self.command, self.path, body=body, headers=dict(self.headers))
                r = c.getresponse()
                return r.status, r.read()

            def _answer(self, status, data):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0)) or None
                step = proxy.script.pop(0) if proxy.script else "ok"
                proxy.seen.append(step)
                if step == "500":
                    return self._answer(500, b'{"error":{"code":"internal","message":"injected"}}')
                if step == "slow":
                    time.sleep(slow_seconds)
                    try:
                        return self._answer(503, b'{"error":{"code":"late","message":"too late"}}')
                    except OSError:
                        return None
                status, data = self._forward(body)
                if step == "lost":
                    return self._answer(502, b"<html>bad gateway</html>")
                return self._answer(status, data)

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_audit_rows_reach_the_service_in_chain_order_and_are_marked_delivered(store, receiver):
    recs = fill(store, 25)
    client = AuditClient(receiver.url, TOKEN, batch_size=7)
    report = relay(store, {"audit": client}, now=time.time)
    assert report.kinds["audit"].delivered == 25 and report.kinds["audit"].pending == 0
    assert not report.failed
    got = stored(receiver)
    assert [r["id"] for r in got] == [r["id"] for r in recs]
    # the service's copy links up: each record's prev_hash is the previous record's hash
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(got, got[1:]))
    assert store.outbox_pending("audit") == (0, None)
    # events have no destination here: they stay queued, and that is not an error
    assert report.kinds["event"].configured is False and report.kinds["event"].error is None


def test_a_redelivered_batch_is_acknowledged_as_duplicate_and_stored_once(store, receiver):
    fill(store, 5)
    client = AuditClient(receiver.url, TOKEN)
    rows = [(k, p) for _, k, p in store.pending_batch("audit", 100)]
    assert client.deliver(rows) == 5
    # a crash after the service answered but before the outbox mark: the next pass sends them again
    assert relay(store, {"audit": client}, now=time.time).kinds["audit"].delivered == 5
    assert len(stored(receiver)) == 5


@pytest.mark.parametrize("script", [["500", "500", "500"], ["slow", "500"], ["lost", "lost"], ["lost", "slow", "500"]])
def test_service_errors_and_timeouts_cost_one_attempt_and_later_relays_deliver_all_once(store, receiver, script):
    """No retry loop, no sleep (rule 2): each fault ends that relay's attempt, the rows stay queued, and the
    next relay (the next pass) goes on from there; nothing is lost, nothing stored twice ("lost": the service
    stored the batch but the answer never came, so the batch is sent again and acknowledged as duplicate)."""
    recs = fill(store, 12)
    proxy = FaultProxy(receiver.url, script)
    try:
        client = AuditClient(proxy.url, TOKEN, timeout_seconds=0.5, batch_size=5)
        relays = []
        while len(relays) < 20:
            relays.append(relay(store, {"audit": client}, now=time.time).kinds["audit"])
            if relays[-1].pending == 0:
                break
    finally:
        proxy.close()
    failed = [r for r in relays if r.error]
    assert len(failed) == len(script), [r.error for r in relays]  # one failed relay per fault, no more
    assert relays[-1].error is None and relays[-1].pending == 0
    assert proxy.seen[:len(script)] == script
    assert [r["id"] for r in stored(receiver)] == [r["id"] for r in recs]


def test_a_service_that_stays_down_costs_one_attempt_and_rows_stay_queued(store, receiver):
    fill(store, 4)
    proxy = FaultProxy(receiver.url, ["500"] * 1000)
    try:
        client = AuditClient(proxy.url, TOKEN, timeout_seconds=0.3)
        report = relay(store, {"audit": client}, now=time.time)
    finally:
        proxy.close()
    assert client.attempts == 1  # the pass did not wait for the service to come back
    assert "HTTP 500" in report.failed["audit"]
    assert report.kinds["audit"].pending == 4 and report.kinds["audit"].delivered == 0
    assert stored(receiver) == []
    # the service is back: the same rows go, once
    assert relay(store, {"audit": AuditClient(receiver.url, TOKEN)}, now=time.time).kinds["audit"].delivered == 4
    assert len(stored(receiver)) == 4


def test_a_refused_record_stops_the_queue_at_that_record(store, receiver):
    recs = fill(store, 6)
    # tamper with one queued payload: the service recomputes the hash and refuses it
    row = store.conn.execute("SELECT id, payload FROM outbox WHERE kind='audit' AND key=?", (recs[3]["id"],)).fetchone()
    payload = json.loads(row["payload"])
    payload["result"] = "failed"
    store.conn.execute("UPDATE outbox SET payload=? WHERE id=?", (json.dumps(payload), row["id"]))
    report = relay(store, {"audit": AuditClient(receiver.url, TOKEN)}, now=time.time)
    assert report.kinds["audit"].delivered == 3 and report.kinds["audit"].pending == 3
    assert recs[3]["id"] in report.failed["audit"] and "hash" in report.failed["audit"]
    assert [r["id"] for r in stored(receiver)] == [r["id"] for r in recs[:3]]


def test_a_wrong_token_is_an_auth_error_not_retried(store, receiver):
    fill(store, 1)
    client = AuditClient(receiver.url, "wrong")
    with pytest.raises(AuthError):
        client.deliver([(k, p) for _, k, p in store.pending_batch("audit", 10)])
    assert client.attempts == 1
    report = relay(store, {"audit": client}, now=time.time)
    assert "401" in report.failed["audit"] and report.kinds["audit"].pending == 1


def test_a_configured_destination_without_an_outlet_is_reported(store):
    fill(store, 2)
    report = relay(store, {}, now=time.time, configured={"kafka", "audit"})
    assert set(report.failed) == {"kafka", "audit"}
    assert report.kinds["audit"].pending == 2


def test_receiver_is_append_only_and_checks_the_hash(receiver, store):
    recs = fill(store, 2)
    client = AuditClient(receiver.url, TOKEN)
    assert client.deliver([(r["id"], json.dumps(r)) for r in recs]) == 2
    other = dict(recs[1], result="failed")
    assert client.deliver([(other["id"], json.dumps(other))]) == 0
    assert "invalid" in client.last_error and "hash" in client.last_error
    # same key, different (self-consistent) record: a conflict, never an overwrite
    forged = dict(recs[1], result="failed")
    from spotctl.core.audit import audit_hash

    forged["hash"] = audit_hash(forged, forged["prev_hash"])
    assert client.deliver([(forged["id"], json.dumps(forged))]) == 0 and "conflict" in client.last_error
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        receiver.ledger.conn.execute("UPDATE records SET body='{}'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        receiver.ledger.conn.execute("DELETE FROM records")
    assert client.record(recs[0]["id"])["hash"] == recs[0]["hash"]


def test_service_pages_records_by_region(receiver, store):
    fill(store, 7)
    relay(store, {"audit": AuditClient(receiver.url, TOKEN)}, now=time.time)
    got = list(AuditClient(receiver.url, TOKEN).records("r1", page=3))
    assert len(got) == 7 and len({r["id"] for r in got}) == 7
    assert list(AuditClient(receiver.url, TOKEN).records("elsewhere")) == []


def test_unreachable_service_is_unavailable_and_the_rows_stay_queued(store):
    # a refused connection is UnavailableError by the one HTTP rule (spotctl.adapters._http); this client
    # alone called it a TemporaryError (same exit code 8, code "temporary" instead of "unavailable")
    fill(store, 1)
    client = AuditClient("http://127.0.0.1:9", TOKEN, timeout_seconds=0.2)
    with pytest.raises(UnavailableError, match="cannot connect") as e:
        client.deliver([(k, p) for _, k, p in store.pending_batch("audit", 10)])
    assert not isinstance(e.value, TemporaryError) and "stay queued" in (e.value.hint or "")
    assert store.pending_batch("audit", 10) and "cannot connect" in client.last_error


def test_a_recorded_degraded_kafka_mode_shows_in_status_and_is_not_reasserted_by_a_pass_that_did_not_connect(
        tmp_path):
    """The relay records the mode it saw (kv ``relay.kafka.mode``); `spotctl status` shows the last one.
    A later pass whose Kafka outlet never connected keeps that record but does not count it as this
    pass's degradation (no evidence from this pass)."""
    from typer.testing import CliRunner

    from spotctl.adapters.kafka import KafkaRelay
    from spotctl.cli.main import app

    runner = CliRunner()
    first = json.loads(runner.invoke(app, ["-o", "json", "status"], catch_exceptions=False).stdout)["data"]
    assert first["relay"] == {} and not any(k.startswith("relay.") for k in first["degraded"])

    db = tmp_path / "xdg-state" / "spotctl" / "demo.db"
    why = "the broker does not offer transactions (no EndTxn API): using an idempotent producer"
    s = Store.open(db, "demo")
    s.set_value(mode_key("kafka"), json.dumps({"mode": "idempotent", "degraded": why, "seen_at": 1000.0}), 1000.0)
    s.close()

    r = runner.invoke(app, ["-o", "json", "status"], catch_exceptions=False)
    data = json.loads(r.stdout)["data"]
    assert data["relay"]["kafka"] == {"mode": "idempotent", "degraded": why, "seen_at": 1000.0}
    assert data["degraded"]["relay.kafka.mode"] == why
    table = runner.invoke(app, ["-o", "table", "status"], catch_exceptions=False).stdout
    assert "relay to kafka: idempotent producer" in table and "degraded relay.kafka.mode" in table

    # a pass whose broker is unreachable: the last record stands, but is not this pass's evidence
    from spotctl.core.models import Node, NodeState

    s = Store.open(db, "demo")
    try:
        with s.tx():  # a lifecycle event to deliver
            s.add_node(Node(id="n1", pool="gp", state=NodeState.INTENDED, action_id="a1", created_at=1001.0,
                            updated_at=1001.0), actor="t", reason="test")
        out = KafkaRelay(bootstrap_servers=f"127.0.0.1:{free_port()}", topic="t", client_id="t", max_wait_seconds=1)
        report = relay(s, {"kafka": out}, now=time.time)
        out.close()
        assert out.mode is None
        ev = report.kinds["event"]
        assert "unavailable" in report.failed["kafka"] and ev.pending >= 1
        assert ev.mode == "idempotent" and ev.degraded == why and ev.mode_seen_at == 1000.0
        assert report.degraded == {}
        assert last_modes(s)["kafka"]["seen_at"] == 1000.0
    finally:
        s.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
