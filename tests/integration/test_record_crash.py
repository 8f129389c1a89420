"""Crash injection: SIGKILL `spot-reconciler` (pass + relay) at >= 100 random points.

Each round is a fresh region (backend "sim", with [kafka] on the test broker and
[audit] on the reference receiver, small relay batches so that a kill often
lands between a send and its outbox mark). Passes are started and killed after
a random delay; some finish. After each round, passes run to completion. Then:

- the local audit chain verifies, locally and against the service;
- every local audit record is stored exactly once at the service, in chain order;
- every committed lifecycle event is on Kafka (read_committed), none lost; after
  the consumer-side dedupe by CloudEvents id, each node's events are in order,
  and 0 duplicates are left;
- the raw duplicates a read_committed consumer sees (before that dedupe) stay
  within the at-least-once bound below, and each is a byte-identical copy;
- the relay ran transactional (the bound depends on it);
- every action the reconciler recorded has its audit record.

The at-least-once bound. The relay sends one batch of at most ``batch_size``
events at a time (``KAFKA_BATCH`` here), each in its own transaction, and marks
it delivered in SQLite right after the commit (``spotctl.ops.relay``). A kill
before the commit leaves an open transaction that the next relay fences and the
broker aborts: invisible to read_committed, no duplicate. A kill between the
commit and the mark leaves one committed batch unmarked, which the next pass
sends again: at most ``KAFKA_BATCH`` duplicates per kill. A pass that ends
partial (exit 7) may have seen a commit acknowledgement time out after the
broker committed: the same, at most one batch. So per region

    raw duplicates <= KAFKA_BATCH * (kills + passes that exited 7)

and 0 after the dedupe by CloudEvents id. (The window between commit and mark
is a few SQLite statements, so most runs see 0 raw duplicates; the bound is
what is allowed, not what is typical.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid

import pytest

from spotctl.ops.relay import last_modes
from spotctl.state.store import Store

from .conftest import testenv as service_env
from .record_support import BIN, Receiver, consume, dedupe_checked, per_key, region_toml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 6
KILLS_PER_ROUND = 18  # 108 kills in all
KAFKA_BATCH = 3  # events per relay batch (one transaction each): small, so that kills land between batches
AUDIT_BATCH = 4
SEED = int(os.environ.get("SPOTCTL_CRASH_SEED", "0")) or random.SystemRandom().randrange(1, 10**6)


def test_sigkill_at_random_points_loses_and_doubles_nothing(tmp_path):
    bootstrap = service_env("kafka")["KAFKA_BOOTSTRAP"]
    rng = random.Random(SEED)
    receiver = Receiver(tmp_path)
    names = [f"crash{i}x{uuid.uuid4().hex[:6]}" for i in range(ROUNDS)]
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n' + "".join(
        region_toml(n, bootstrap=bootstrap, audit_url=receiver.url, token_file=receiver.token_file,
                    kafka_batch=KAFKA_BATCH, audit_batch=AUDIT_BATCH, seed=3 + i) for i, n in enumerate(names)))
    env = {**os.environ, "SPOTCTL_CONFIG": str(cfg)}
    kills = completed = 0
    risky = {n: 0 for n in names}  # per region: kills + passes that exited 7 (each may re-send one batch)
    full = 0.8  # running estimate of a whole pass, process start to exit
    t_start = time.monotonic()
    try:
        for name in names:
            round_kills = 0
            while round_kills < KILLS_PER_ROUND:
                # mostly after the interpreter is up (imports take ~0.3 s); 1 in 5 passes may finish
                delay = 120.0 if rng.random() < 0.2 else rng.uniform(0.15, 1.2 * full)
                t0 = time.monotonic()
                p = subprocess.Popen([str(BIN / "spot-reconciler"), "-r", name], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    p.wait(delay)
                    completed += 1
                    full = 0.7 * full + 0.3 * (time.monotonic() - t0)
                    assert p.returncode in (0, 7), f"pass exited {p.returncode} (seed {SEED})"
                    risky[name] += p.returncode == 7
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                    kills += 1
                    round_kills += 1
                    risky[name] += 1
            _finish(name, env, tmp_path)
        elapsed = time.monotonic() - t_start
        print(f"\ncrash harness: seed {SEED}, {kills} SIGKILLs, {completed} passes completed between them, "
              f"{elapsed:.0f}s")
        assert kills >= 100
        totals = {"audit": 0, "events": 0, "duplicates_on_kafka": 0, "duplicates_allowed": 0, "aborted_hidden": 0,
                  "actions": 0}
        for name in names:
            _check(name, env, tmp_path, bootstrap, receiver, totals, risky[name])
        print(f"crash harness: checked {totals}")
        # the harness did enough to mean something: records and events to lose or double. How many the regions
        # make varies with the seed and the time of day (the simulator's arrivals swing +-50 % over the UTC day,
        # lowest at 02:00): 72-86 audit records at night, over 100 by day, never near nothing
        assert totals["audit"] >= 50 and totals["events"] >= 50, totals
    finally:
        receiver.stop()


def _finish(name: str, env: dict, tmp_path) -> None:
    """Let passes run to the end until the outbox is empty."""
    for _ in range(6):
        p = subprocess.run([str(BIN / "spot-reconciler"), "-r", name], env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        s = Store.open(tmp_path / "state" / f"{name}.db", name)
        try:
            if s.outbox_pending("event")[0] == 0 and s.outbox_pending("audit")[0] == 0:
                return
        finally:
            s.close()
    raise AssertionError(f"{name}: the outbox did not drain")


def _check(name: str, env: dict, tmp_path, bootstrap: str, receiver: Receiver, totals: dict, risky: int) -> None:
    s = Store.open(tmp_path / "state" / f"{name}.db", name)
    try:
        mode = last_modes(s).get("kafka")
        ok, bad, n = s.verify_audit()
        assert ok, f"{name}: local chain broken at {bad}"
        local = s.audit_records()
        events = [json.loads(r["payload"]) for r in s.outbox_rows("event")]
        actions = s.actions(limit=100000)
    finally:
        s.close()

    # the audit service: exactly one copy of every record, in chain order
    remote = receiver.records(name)
    assert [r["id"] for r in remote] == [r["id"] for r in local], f"{name}: service differs from the local chain"
    assert [r["hash"] for r in remote] == [r["hash"] for r in local]
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", "-r", name, "audit", "verify"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["data"]["service"]["checked"] == len(local)

    # Kafka: the relay was transactional (the duplicate bound below assumes it)
    assert mode is not None and mode["mode"] == "transactional" and mode["degraded"] is None, f"{name}: {mode}"
    # every committed event, none lost; in order per node and 0 duplicates left after the dedupe by id
    # (dedupe_checked: every duplicate is a byte-identical copy, so dropping it by id loses nothing)
    committed = consume(bootstrap, f"spot.lifecycle.{name}")
    got, dups = dedupe_checked(committed)
    expected: dict[str, list[str]] = {}
    for ev in events:
        expected.setdefault(ev["subject"], []).append(ev["id"])
    assert per_key(got) == expected, f"{name}: events lost or out of order"
    assert len(got) == len(events)
    # at least once, within the bound of the module docstring (raw, before the dedupe)
    allowed = KAFKA_BATCH * risky
    assert dups <= allowed, f"{name}: {dups} duplicate events on Kafka, more than {allowed} (seed {SEED})"

    # every recorded action left its audit record
    audited = {r["inputs"].get("action_id") for r in local}
    missing = [a["id"] for a in actions if a["status"] != "intended" and a["id"] not in audited
               and not any(str(x or "").startswith(a["id"] + ".") for x in audited)]
    assert not missing, f"{name}: actions without an audit record: {missing[:5]}"

    totals["audit"] += len(local)
    totals["events"] += len(events)
    totals["duplicates_on_kafka"] += dups
    totals["duplicates_allowed"] += allowed
    # evidence, not asserted (it depends on where the kills landed): records of batches whose
    # transaction a kill left open, in the log but hidden from read_committed
    totals["aborted_hidden"] += len(consume(bootstrap, f"spot.lifecycle.{name}", isolation="read_uncommitted")) \
        - len(committed)
    totals["actions"] += len(actions)
