"""The provider contract API: served by `spotctl sim serve`, consumed by ContractFeed, checked by schemathesis.

The server runs as a user would run it (a subprocess on a free port, stopped with
SIGTERM); every client call goes over real HTTP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from spotctl.adapters.contract_http import ContractFeed
from spotctl.core.errors import AuthError, NotFoundError, RefusedError, UnavailableError
from spotctl.core.timefmt import parse_ts
from spotctl.core.models import NoticeKind

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEC = ROOT / "docs" / "contract" / "openapi.yaml"
TOKEN = "test-token-5b0c8a51"
SEED = 99  # not the demo region's seed: prices that only the served world has


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
    env.update(XDG_CONFIG_HOME=str(home / "config"), XDG_STATE_HOME=str(home / "state"),
               SPOTCTL_SYSTEM_CONFIG=str(home / "none.toml"), NO_COLOR="1")
    return env


class Server:
    def __init__(self, home: Path, *args: str):
        self.proc = subprocess.Popen([str(BIN / "spotctl"), "sim", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home))
        self.lines: list[str] = []
        deadline = time.monotonic() + 30
        self.url = None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.proc.kill()
            raise AssertionError(f"spotctl sim serve did not announce its URL: {''.join(self.lines)}"
                                 f"{self.proc.stderr.read()}")

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=15)
        return self.proc.returncode, out, "".join(self.lines) + err


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("sim"), "--token", TOKEN, "--seed", str(SEED), "--instances", "12",
                 "--max-wait", "10")
    yield srv
    code, out, err = srv.stop()
    assert code == 0, err  # SIGTERM is a clean stop
    assert json.loads(out)["data"]["stopped"] == "terminated"


def test_the_stop_is_reported_as_it_happened(tmp_path):
    """SIGTERM says terminated (the module fixture), Ctrl-C says interrupted: both clean stops (exit 0)."""
    srv = Server(tmp_path, "--seed", str(SEED), "--instances", "2")
    code, out, err = srv.stop(signal.SIGINT)
    assert code == 0, err
    assert json.loads(out)["data"]["stopped"] == "interrupted"


@pytest.fixture
def feed(server):
    return ContractFeed(server.url, token=TOKEN, timeout=5)


def _world(server) -> dict:
    r = requests.get(server.url + "/sim/v1/world", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    r.raise_for_status()
    return r.json()


_taken: set[str] = set()


def _victims(server, n: int) -> list[str]:
    """Live instances no other test has reclaimed yet."""
    live = [i["id"] for i in _world(server)["instances"] if i["id"] not in _taken]
    assert len(live) >= n, "the served world ran out of instances"
    _taken.update(live[:n])
    return live[:n]


def _drain(feed, cursor=None) -> tuple[list, str]:
    seen = []
    while True:
        notices, cursor = feed.poll(cursor, 0)
        seen.extend(notices)
        if not notices:
            return seen, cursor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- rate card -------------------------------------------------------------------------------


def test_rate_card_with_etag_and_304(server, feed):
    statuses = []
    session = requests.Session()
    session.hooks["response"].append(lambda r, *a, **k: statuses.append(r.status_code))
    feed = ContractFeed(server.url, token=TOKEN, session=session)
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    card = feed.rate_card()
    assert card.version.startswith("rc-") and card.currency == "EUR"
    assert set(card.prices) == set(_world(server)["pools"]) and all(p > 0 for p in card.prices.values())
    assert card.valid_until - card.valid_from == 300
    assert feed.etag == f'"{card.version}"'
    again = feed.rate_card()
    if again.version == card.version:  # not across a 5-minute boundary
        assert statuses == [200, 304]
        assert again == card
    raw = requests.get(server.url + "/v1/rate-card", timeout=5,
                       headers={"Authorization": f"Bearer {TOKEN}", "If-None-Match": feed.etag})
    assert raw.status_code in (200, 304) and raw.headers["ETag"]
    if raw.headers["ETag"] == feed.etag:
        assert raw.status_code == 304 and raw.content == b""


# --- notices: long-poll and cursor -----------------------------------------------------------


def test_long_poll_returns_a_new_notice_without_waiting_the_full_wait(server, feed):
    _, cursor = _drain(feed)
    (victim,) = _victims(server, 1)
    timer = threading.Timer(0.7, lambda: ContractFeed(server.url, token=TOKEN).reclaim([victim], 120))
    timer.start()
    t0 = time.monotonic()
    notices, nxt = feed.poll(cursor, wait=8)
    elapsed = time.monotonic() - t0
    timer.join()
    assert 0.5 <= elapsed < 4.0, f"long-poll took {elapsed:.2f} s"
    assert [(n.instance_id, n.kind) for n in notices] == [(victim, NoticeKind.HARD)]
    assert nxt != cursor
    # nothing new: a short long-poll comes back empty after its wait, cursor unchanged
    t0 = time.monotonic()
    assert feed.poll(nxt, wait=0.5) == ([], nxt)
    assert 0.4 <= time.monotonic() - t0 < 3.0


def test_cursor_resumes_without_loss_or_duplicates(server, feed):
    before, cursor = _drain(feed)
    victims = _victims(server, 3)
    feed.reclaim(victims[:2], 150, drill_id="drill-cursor")
    first, cursor2 = feed.poll(cursor, 0)
    feed.reclaim(victims[2:], 150, drill_id="drill-cursor")
    second, cursor3 = feed.poll(cursor2, 0)
    assert [n.instance_id for n in first] == victims[:2]
    assert [n.instance_id for n in second] == victims[2:]
    assert feed.poll(cursor3, 0) == ([], cursor3)
    # the whole log, read again from the start: every notice once, in the same order
    everything, end = _drain(feed)
    ids = [n.id for n in everything]
    assert len(ids) == len(set(ids))
    assert ids[-3:] == [n.id for n in first + second] and end == cursor3
    assert [n.id for n in before] == ids[:len(before)]
    # a cursor the server does not know (e.g. from before a restart) replays from the start, nothing lost
    replay, _ = feed.poll("1.999999", 0)
    assert [n.id for n in replay][:len(ids)] == ids[:len(replay)]


# --- reclaims ------------------------------------------------------------------------------------


def test_reclaim_gives_a_hard_notice_with_at_least_120_s_and_receipts(server, feed):
    victims = _victims(server, 2)
    rec = feed.reclaim(victims + ["no-such-instance"], 120, drill_id="drill-1")
    assert rec.id.startswith("rcl-") and [r.instance_id for r in rec.instances] == victims + ["no-such-instance"]
    assert all(r.ok and r.notice_id for r in rec.instances[:2]) and not rec.instances[2].ok
    got = feed.get_reclaim(rec.id)
    assert got["drill_id"] == "drill-1" and got["state"] in ("in_progress", "done")
    by_iid = {r["instance_id"]: r for r in got["instances"]}
    assert by_iid["no-such-instance"]["state"] == "failed" and by_iid["no-such-instance"]["error"]
    active = {n.id: n for n in feed.notices()}
    for iid in victims:
        r = by_iid[iid]
        assert r["state"] == "noticed"
        issued, deadline, delivered = (parse_ts(r[k]) for k in ("notice_issued_at", "deadline", "delivered_at"))
        assert deadline - issued >= 120
        assert 0 <= delivered - issued <= 1.0  # the contract: delivered to the node in <= 1 s
        n = active[r["notice_id"]]
        assert n.kind is NoticeKind.HARD and n.instance_id == iid
        assert n.deadline - n.issued_at >= 120 and n.delivered_at == delivered
    with pytest.raises(NotFoundError):
        feed.get_reclaim("rcl-999999")
    with pytest.raises(RefusedError):  # the contract's minimum lead is 120 s
        feed.reclaim(_victims(server, 1), 119)
    status = {t["term"]: t for t in feed.status()["terms"]}
    assert set(status) == {"hard_notice", "advisory", "rate_card", "reservations", "reclaim_api"}
    assert status["hard_notice"]["state"] == "met"
    assert status["hard_notice"]["evidence"]["min_lead_seconds"] >= 120


def test_reclaim_with_advisory_lead_advises_first(server, feed):
    _, cursor = _drain(feed)
    (victim,) = _victims(server, 1)
    rec = feed.reclaim([victim], 120, advisory_lead_seconds=600)
    (r,) = rec.instances
    assert r.ok and r.advisory_id and r.notice_id is None
    assert feed.get_reclaim(rec.id)["instances"][0]["state"] == "advised"
    notices, _ = feed.poll(cursor, 0)
    assert [(n.instance_id, n.kind) for n in notices] == [(victim, NoticeKind.ADVISORY)]
    assert notices[0].id in {n.id for n in feed.notices()}


def test_receipts_follow_deletion_and_freed_capacity():
    """The same server code on a clock we move: notice -> deleted at the deadline -> capacity freed."""
    from spotctl.core.ports import FixedClock
    from spotctl.services.contract_api import ContractAPI, populate
    from spotctl.sim import SimWorld, demo_region

    clock = FixedClock(1_767_261_600.0)
    world = SimWorld.new(demo_region(), clock.now() - 60, 3)
    world.advance(clock.now())
    (victim,) = populate(world, 1)
    clock.advance(300)  # booted
    api = ContractAPI(world, clock=clock)
    rec = api.reclaim({"instance_ids": [victim], "notice_seconds": 130, "advisory_lead_seconds": 60})
    assert rec["instances"][0]["state"] == "advised"
    clock.advance(61)
    api.sync()
    r = api.get_reclaim(rec["id"])["instances"][0]
    assert r["state"] == "noticed" and parse_ts(r["deadline"]) - parse_ts(r["notice_issued_at"]) == 130
    clock.advance(131)
    api.sync()
    clock.advance(200)
    api.sync()
    got = api.get_reclaim(rec["id"])
    r = got["instances"][0]
    assert got["state"] == "completed" and r["state"] == "freed"
    assert parse_ts(r["deleted_at"]) <= parse_ts(r["deadline"]) < parse_ts(r["capacity_freed_at"])
    kinds = [e["kind"] for e in api.poll(None, 0, 100)["notices"] if e["instance_id"] == victim]
    assert kinds == ["advisory", "hard"]
    assert not [n for n in api.active()["notices"] if n["instance_id"] == victim]


# --- errors ------------------------------------------------------------------------------------


def test_wrong_token_is_an_auth_error(server):
    with pytest.raises(AuthError):
        ContractFeed(server.url, token="wrong").rate_card()
    with pytest.raises(AuthError):
        ContractFeed(server.url).poll(None, 0)


def test_server_down_is_unavailable():
    feed = ContractFeed(f"http://127.0.0.1:{_free_port()}", timeout=2)
    t0 = time.monotonic()
    with pytest.raises(UnavailableError) as e:
        feed.rate_card()
    assert "refused" in e.value.message and time.monotonic() - t0 < 2


# --- the spec, enforced ----------------------------------------------------------------------------


@pytest.mark.slow
def test_schemathesis_against_the_served_api(tmp_path):
    srv = Server(tmp_path, "--token", TOKEN, "--max-wait", "0.2")
    try:
        proc = subprocess.run(
            [str(BIN / "st"), "run", str(SPEC), "--url", srv.url, "-H", f"Authorization: Bearer {TOKEN}",
             "--checks", "all", "--max-examples", "15", "--workers", "1", "--no-color", "--max-failures", "5"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**_env(tmp_path), "NO_COLOR": "1"})
    finally:
        code, _, err = srv.stop()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "6 selected / 6 total" in proc.stdout and "No issues found" in proc.stdout
    assert code == 0, err


# --- the CLI ----------------------------------------------------------------------------------------


def test_plan_prices_come_from_the_served_rate_card(server, feed, tmp_path):
    (tmp_path / "contract.token").write_text(TOKEN + "\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[regions.demo]\nbackend = "sim"\n\n[regions.demo.contract]\nurl = "{server.url}"\n'
                   f'token_file = "{tmp_path / "contract.token"}"\ntimeout_seconds = 5\n')
    before = feed.rate_card()
    proc = subprocess.run([str(BIN / "spotctl"), "--config", str(cfg), "plan", "-o", "json"],
                          capture_output=True, text=True, timeout=60, env=_env(tmp_path))
    after = feed.rate_card()
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["data"]
    version = data["inputs"]["rate_card_version"]
    assert version in (before.version, after.version)
    served = before.prices if version == before.version else after.prices
    assert {p["name"]: p["price"] for p in data["pools"]} == served
    assert TOKEN not in proc.stderr
