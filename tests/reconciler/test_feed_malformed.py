"""Malformed provider feed bodies are refused or ignored with a count and a log line:
they never crash a pass and never lose state."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spotctl.adapters.contract_http import ContractFeed
from spotctl.ops.reconcile import run_pass

NOW = "2026-01-05T09:00:00Z"


class Provider(BaseHTTPRequestHandler):
    """A provider whose feed sends what it likes (bodies set by each test)."""

    bodies: dict = {}

    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0]
        body = self.bodies.get(path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *a):
        pass


@pytest.fixture
def provider():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def card(prices):
    return {"version": "rc-1", "currency": "EUR", "valid_from": NOW, "valid_until": "2026-01-05T09:05:00Z",
            "pools": [{"pool": p, "price": v, "unit": "node-hour"} for p, v in prices.items()]}


def test_malformed_bodies_never_crash_a_pass_or_lose_state(make_rt, provider, caplog):
    rt, world = make_rt()
    first = run_pass(rt)  # a healthy pass on the simulator's own feed: nodes and records exist
    assert first.status == "ok"
    before = rt.store.counts()
    node = rt.store.nodes(live_only=True)[0]
    feed = ContractFeed(provider, timeout=2)
    rt.contract = feed
    Provider.bodies = {
        "/v1/rate-card": card({"gp-az1": -1.0}),  # a negative price: the whole card is refused
        "/v1/notices/active": {"notices": [
            {"id": "n1", "instance_id": node.instance_id},                                 # missing fields
            {"id": "n2", "instance_id": "i-unknown", "kind": "hard", "issued_at": NOW,
             "deadline": "2026-01-05T09:02:30Z"},                                          # not one of ours
            {"id": "n3", "instance_id": node.instance_id, "kind": "sideways", "issued_at": NOW},  # unknown kind
            {"id": "n4", "instance_id": node.instance_id, "kind": "advisory", "issued_at": NOW},
            {"id": "n4", "instance_id": node.instance_id, "kind": "advisory", "issued_at": NOW},  # duplicate
            {"id": "n5", "instance_id": node.instance_id, "kind": "hard", "issued_at": NOW},      # hard, no deadline
        ]},
    }
    r = run_pass(rt)
    assert r.status == "partial" and "price must be a number >= 0" in r.degraded["rate_card"]
    assert feed.rejected == 4  # n1, n3, n5 malformed; the second n4 a duplicate
    assert any("ignoring" in m for m in caplog.messages)
    after = rt.store.counts()
    assert after["nodes"] == before["nodes"] and after["audit"] >= before["audit"]
    assert rt.store.verify_audit()[0]
    assert r.plan is not None and r.plan.inputs["rate_card_version"] is None  # no launches without prices
    # garbage instead of JSON: the source is unavailable, the pass still completes
    Provider.bodies = {"/v1/rate-card": "{not json", "/v1/notices/active": "<html>oops</html>"}
    r = run_pass(rt)
    assert r.status == "partial" and {"rate_card", "notices"} <= set(r.degraded)
    assert rt.store.counts()["nodes"] == before["nodes"]
