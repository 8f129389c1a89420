"""A world bound to a SQLite file: created on first open, saved after every change, reopened
identically; a corrupt file is an error naming the file."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest

from spotctl.core.errors import CapacityError, StateError, TemporaryError
from spotctl.sim import Knobs, SimWorld

from .conftest import START, NaiveOperator


def test_open_creates_the_file_at_now_rounded_to_the_minute(tmp_path, region):
    path = tmp_path / "sim.db"
    w = SimWorld.open(path, region, START + 95.5)
    assert path.exists()
    assert w.report()["start"] == START + 60 and w.now == START + 95.5
    again = SimWorld.open(path, region, START + 95.5)
    assert again.report() == w.report()


def test_state_survives_reopen(tmp_path, region):
    path = tmp_path / "sim.db"
    w = SimWorld.open(path, region, START)
    NaiveOperator(w).run(2.0, every=300.0)
    inst = w.cloud.create_instance(region.pools["gp-az2"], "kept", "act-kept")
    w.schedulers[0].cordon(next(u.node for u in w.schedulers[0].usage()), "test")
    w.inject_launch_failures("mem-az1", until=w.now + 3600)
    snapshot = (w.report(), w.cloud.instances(), w.contract.notices(), [s.pending(region.pools) for s in w.schedulers],
                [s.usage() for s in w.schedulers], w.cloud.hosts(region.pools),
                w.cloud.reservations(region.pools, w.now, w.now + 86400), w.cloud.quota())
    back = SimWorld.open(path, region, w.now)
    assert (back.report(), back.cloud.instances(), back.contract.notices(),
            [s.pending(region.pools) for s in back.schedulers], [s.usage() for s in back.schedulers],
            back.cloud.hosts(region.pools), back.cloud.reservations(region.pools, back.now, back.now + 86400),
            back.cloud.quota()) == snapshot
    assert back.cloud.find_instance("act-kept") == inst
    with pytest.raises(CapacityError, match="mem-az1"):
        back.cloud.create_instance(region.pools["mem-az1"], "x", "x")


def test_reopening_between_calls_changes_nothing(tmp_path, region):
    """A file-bound world reopened at every step behaves exactly like one kept in memory."""
    mem = SimWorld.new(region, START)
    path = tmp_path / "sim.db"
    SimWorld.open(path, region, START)
    op_mem = NaiveOperator(mem)
    op_disk = NaiveOperator(None)
    t = START
    for _ in range(24):  # two hours, a pass every 5 minutes, reopening the file every time
        t += 300
        mem.advance(t)
        op_mem.step()
        op_disk.w = SimWorld.open(path, region, t)
        op_disk.step()
    final = SimWorld.open(path, region, t)
    assert json.dumps(final.report(), sort_keys=True) == json.dumps(mem.report(), sort_keys=True)
    assert final.cloud.instances() == mem.cloud.instances()
    assert final.contract.notices() == mem.contract.notices()
    assert [s.usage() for s in final.schedulers] == [s.usage() for s in mem.schedulers]
    assert [s.pending(region.pools) for s in final.schedulers] == [s.pending(region.pools) for s in mem.schedulers]
    assert mem.report()["instances"]["launched"] > 0
    final.advance(t + 4 * 3600)
    mem.advance(t + 4 * 3600)
    assert final.report() == mem.report()


def test_mutating_calls_are_saved_immediately(tmp_path, region):
    path = tmp_path / "sim.db"
    w = SimWorld.open(path, region, START)
    inst = w.cloud.create_instance(region.pools["gp-az1"], "n1", "a1")
    assert SimWorld.open(path, region, START).cloud.find_instance("a1") == inst
    w.cloud.delete_instance(inst.id)
    assert SimWorld.open(path, region, START).cloud.find_instance("a1") is None


def test_corrupt_file_raises_state_error_naming_it(tmp_path, region):
    path = tmp_path / "sim.db"
    path.write_bytes(b"this is not a database, just some bytes " * 100)
    with pytest.raises(StateError) as e:
        SimWorld.open(path, region, START)
    assert str(path) in str(e.value)
    assert path.read_bytes().startswith(b"this is not")  # never silently recreated


def test_bad_json_and_foreign_tables_raise_state_error(tmp_path, region):
    path = tmp_path / "sim.db"
    SimWorld.open(path, region, START)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE sim_state SET state = '{not json'")
    with pytest.raises(StateError, match="sim.db"):
        SimWorld.open(path, region, START)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE sim_state SET state = '{\"now\": 1}'")
    with pytest.raises(StateError, match="sim.db"):
        SimWorld.open(path, region, START)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE something (x)")
    with pytest.raises(StateError, match="other.db"):
        SimWorld.open(other, region, START)


def test_an_empty_file_is_a_fresh_world(tmp_path, region):
    path = tmp_path / "sim.db"
    path.touch()
    w = SimWorld.open(path, region, START)
    assert SimWorld.open(path, region, START).report() == w.report()


def test_another_region_layout_is_refused(tmp_path, region):
    path = tmp_path / "sim.db"
    SimWorld.open(path, region, START)
    other = replace(region, seed=region.seed + 1)
    with pytest.raises(StateError, match="sim.db"):
        SimWorld.open(path, other, START)


def test_two_processes_never_overwrite_each_other(tmp_path, region):
    path = tmp_path / "sim.db"
    SimWorld.open(path, region, START)
    a = SimWorld.open(path, region, START + 60)
    b = SimWorld.open(path, region, START + 60)
    inst = a.cloud.create_instance(region.pools["gp-az1"], "from-a", "from-a")
    b.advance(START + 120)  # only advanced: yields to the newer file without complaint
    with pytest.raises(TemporaryError, match="another process"):
        b.cloud.create_instance(region.pools["gp-az1"], "from-b", "from-b")
    fresh = SimWorld.open(path, region, START + 120)
    assert fresh.cloud.find_instance("from-a") == inst
    assert fresh.cloud.find_instance("from-b") is None


def test_knobs_are_kept_with_the_world(tmp_path, region):
    path = tmp_path / "sim.db"
    SimWorld.open(path, region, START, knobs=Knobs(quota_instances=1))
    back = SimWorld.open(path, region, START + 60, knobs=Knobs(quota_instances=99))  # ignored: the file's win
    assert back.knobs.quota_instances == 1 and back.cloud.quota().instances == 1
