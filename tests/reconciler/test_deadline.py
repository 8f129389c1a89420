"""A pass's observe deadline (issue 11, item 7): a slow source is degraded for the pass, not waited for.

The provider feed here is a real HTTP server on 127.0.0.1 that holds every answer for ``DELAY`` seconds
(a slow external service); the rest of the region is the simulator. Timings are coarse bounds only.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spotctl.adapters.contract_http import ContractFeed
from spotctl.core import deadline
from spotctl.core.errors import TemporaryError
from spotctl.core.ports import FixedClock
from spotctl.ops import contract
from spotctl.ops.observe import observe
from spotctl.ops.plan import show_plan
from spotctl.ops.reconcile import run_pass
from spotctl.ops.runtime import Runtime
from spotctl.sim.world import SimWorld
from spotctl.state.store import Store

from .conftest import START

DEADLINE = 2.0
DELAY = 10.0
FEED_TIMEOUT = 10.0  # the contract client's default per-request timeout
BOUND = 4.5  # a pass against the slow feed returns within about the deadline (coarse)


class SlowProvider(BaseHTTPRequestHandler):
    """A provider feed that answers every request after ``delay`` seconds (or when released)."""

    delay = DELAY
    release = threading.Event()
    asked: list[str] = []

    def do_GET(self):  # noqa: N802
        self.asked.append(self.path.split("?")[0])
        self.release.wait(self.delay)
        raw = json.dumps({"error": {"message": "too late anyway"}}).encode()
        try:
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        except OSError:
            pass  # the client gave up long ago

    def log_message(self, *a):
        pass


@pytest.fixture
def slow_feed():
    SlowProvider.release = threading.Event()
    SlowProvider.asked = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), SlowProvider)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    SlowProvider.release.set()  # let held answers go, so the server stops at once
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def refused_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connection refused, the feed is down
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def deadline_region(region):
    return dataclasses.replace(region, policy=dataclasses.replace(region.policy, observe_deadline_seconds=DEADLINE))


@pytest.fixture
def runtime(tmp_path, deadline_region):
    """A simulated region (seeded, fixed clock) whose first pass ran on the simulator's own feed."""
    made = []

    def make(name: str):
        world = SimWorld.new(deadline_region, START, 7)
        store = Store.open(tmp_path / f"{name}.db", deadline_region.name)
        made.append(store)
        rt = Runtime(region=deadline_region, store=store, cloud=world.cloud, contract=world.contract,
                     schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="tester",
                     concurrent_observe=False)
        first = run_pass(rt)
        assert first.status == "ok", first.to_dict()
        rt.clock.advance(600)  # the nodes launched by the first pass are active now
        world.advance(rt.clock.now())
        return rt, world

    yield make
    for s in made:
        s.close()


def test_a_slow_feed_is_degraded_at_the_deadline_and_nothing_else_is_lost(runtime, slow_feed, refused_url):
    # the same region twice: once with the feed down (connection refused), once with the feed slow
    down_rt, _ = runtime("down")
    down_rt.contract = ContractFeed(refused_url, timeout=FEED_TIMEOUT)
    down = run_pass(down_rt)
    assert down.status == "partial" and {"rate_card", "notices"} <= set(down.degraded)

    rt, _ = runtime("slow")
    rt.contract = ContractFeed(slow_feed, timeout=FEED_TIMEOUT)
    t0 = time.monotonic()
    r = run_pass(rt)
    took = time.monotonic() - t0
    assert took < BOUND, f"the pass took {took:.1f} s against a {DEADLINE:g} s observe deadline"
    assert r.status == "partial"
    for source in ("rate_card", "notices"):
        assert "observe deadline" in r.degraded[source], r.degraded
    assert not {"cloud", "scheduler:kubernetes", "scheduler:slurm"} & set(r.degraded), r.degraded
    assert set(r.to_dict()["degraded"]) == set(r.degraded)  # the pass's output names them
    # nothing else lost: the nodes were synced from the cloud, and the pass did what it does with the feed down
    assert r.synced["active"] > 0 and r.synced == down.synced
    assert [(a.kind, a.pool, a.node) for a in r.plan.actions] == [(a.kind, a.pool, a.node)
                                                                   for a in down.plan.actions]
    assert [(o.kind, o.status) for o in r.outcomes] == [(o.kind, o.status) for o in down.outcomes]
    gp = contract.evaluate(rt, observe(rt))["pools"]["gp-az1"]
    assert gp["state"] == "degraded" and "observe deadline" in gp["terms"]["rate_card"]["evidence"]["error"]
    assert rt.store.verify_audit()[0]
    assert rt.store.last_pass()["status"] == "partial"


def test_plan_and_contract_check_stop_waiting_at_the_deadline(runtime, slow_feed):
    rt, _ = runtime("plan")
    rt.contract = ContractFeed(slow_feed, timeout=FEED_TIMEOUT)
    t0 = time.monotonic()
    plan, degraded, auth_failed = show_plan(rt)
    assert time.monotonic() - t0 < BOUND
    assert {"rate_card", "notices"} <= set(degraded) and not auth_failed
    assert all("observe deadline" in degraded[s] for s in ("rate_card", "notices"))

    t0 = time.monotonic()
    report = contract.check(rt)
    assert time.monotonic() - t0 < BOUND
    assert not report["met"]  # exit 7 from `spotctl contract check`
    assert {"rate_card", "notices"} <= set(report["degraded"])
    terms = report["pools"]["gp-az1"]["terms"]
    assert "observe deadline" in terms["notice"]["evidence"]["error"]
    assert "observe deadline" in terms["rate_card"]["evidence"]["error"]
    assert terms["reclaim_api"]["state"] == "missing"
    assert "observe deadline" in terms["reclaim_api"]["evidence"]["error"]


def test_the_deadline_is_shared_by_the_sources_and_bounds_their_requests(runtime, slow_feed):
    """Every source is asked at once (the pass does not take deadline x sources), and the feed's own
    requests are cut at the time left: their threads do not linger for the configured 10 s."""
    rt, _ = runtime("shared")
    feed = ContractFeed(slow_feed, timeout=FEED_TIMEOUT)
    rt.contract = feed
    t0 = time.monotonic()
    snap = observe(rt)
    assert time.monotonic() - t0 < BOUND
    assert {"rate_card", "notices"} <= set(snap.degraded)
    assert {"/v1/rate-card", "/v1/notices/active", "/v1/status"} <= set(SlowProvider.asked)
    # a request made under a deadline is cut at the time left, not at the configured 10 s; outside one
    # (the watcher's long-polls, a pass's actions) the configured timeout stands
    assert deadline.bounded(FEED_TIMEOUT) == FEED_TIMEOUT
    with deadline.until(time.monotonic() + 0.3):
        t1 = time.monotonic()
        with pytest.raises(TemporaryError) as e:
            feed.rate_card()
        assert time.monotonic() - t1 < 2.0
    assert "no answer from" in e.value.message


def test_a_late_result_is_discarded(tmp_path, deadline_region):
    """A source that answers after the deadline changes nothing: observe() applies what the sources
    return, and it never reads a late one."""
    world = SimWorld.new(deadline_region, START, 7)
    gate = threading.Event()

    class StuckScheduler:  # a scheduler API that hangs (a fake of the external system, not of our code)
        name = "slurm"

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def pending(self, pools):
            gate.wait(30)
            return self.inner.pending(pools)

    k8s, slurm = world.schedulers
    store = Store.open(tmp_path / "late.db", deadline_region.name)
    try:
        rt = Runtime(region=deadline_region, store=store, cloud=world.cloud, contract=world.contract,
                     schedulers=[k8s, StuckScheduler(slurm)], clock=FixedClock(world.now), actor="tester",
                     concurrent_observe=True)
        t0 = time.monotonic()
        snap = observe(rt)
        assert time.monotonic() - t0 < BOUND
        assert "observe deadline" in snap.degraded["scheduler:slurm"]
        assert set(snap.degraded) == {"scheduler:slurm"}
        units = list(snap.units)
        assert units and all(u.scheduler.value == "kubernetes" for u in units)
        gate.set()  # the stuck call now returns: its result goes nowhere
        time.sleep(0.2)
        assert snap.units == units and set(snap.degraded) == {"scheduler:slurm"}
    finally:
        gate.set()
        store.close()


def test_in_process_sources_have_no_deadline(tmp_path, deadline_region):
    """The simulator's own ports run inline, in order, with no deadline (``simulate`` stays
    deterministic): even a deadline of nothing degrades no source."""
    region = dataclasses.replace(deadline_region, policy=dataclasses.replace(deadline_region.policy,
                                                                             observe_deadline_seconds=1e-9))
    world = SimWorld.new(region, START, 7)
    store = Store.open(tmp_path / "inline.db", region.name)
    try:
        rt = Runtime(region=region, store=store, cloud=world.cloud, contract=world.contract,
                     schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="tester",
                     concurrent_observe=False)
        snap = observe(rt)
        assert snap.degraded == {} and snap.hosts and snap.rate_card is not None
    finally:
        store.close()
