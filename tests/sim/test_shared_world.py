"""A world shared by several processes under the region lock (issue 11, item 6): read-only snapshots
outside the lock, load-after-lock and save-at-every-change under it, nothing lost between holders."""

from __future__ import annotations

import sqlite3

import pytest

from spotctl.core.errors import StateError
from spotctl.sim import SimWorld
from spotctl.sim import store as sim_store

from .conftest import START


def test_a_snapshot_never_writes_the_file(tmp_path, region):
    path = tmp_path / "sim.db"
    w = SimWorld.shared(path, region, START)
    w.advance(START + 600)
    assert not path.exists()  # a fresh world lives in memory until a lock holder saves it
    SimWorld.open(path, region, START)
    rev = sim_store.revision(path)
    r = SimWorld.shared(path, region, START + 60)
    r.advance(START + 3600)
    assert sim_store.revision(path) == rev


def test_a_change_outside_the_lock_is_refused(tmp_path, region):
    w = SimWorld.shared(tmp_path / "sim.db", region, START)
    with pytest.raises(RuntimeError, match="region lock"):
        w.cloud.create_instance(region.pools["gp-az1"], "n", "a1")
    w.acquire(START)  # the refused change is not kept: the world is loaded afresh
    assert w.cloud.find_instance("a1") is None


def test_acquire_loads_what_the_last_holder_saved_and_nothing_is_lost(tmp_path, region):
    path = tmp_path / "sim.db"
    a = SimWorld.shared(path, region, START)  # both loaded before either holds the lock
    b = SimWorld.shared(path, region, START)
    cloud_a, cloud_b = a.cloud, b.cloud  # the ports handed out stay valid across reloads
    a.acquire(START + 10)
    ia = cloud_a.create_instance(region.pools["gp-az1"], "from-a", "from-a")
    a.release()
    b.acquire(START + 20)
    assert cloud_b.find_instance("from-a") == ia  # b sees a's change: loaded after the lock
    ib = cloud_b.create_instance(region.pools["gp-az1"], "from-b", "from-b")
    b.release()
    a.acquire(START + 30)
    assert cloud_a.find_instance("from-b") == ib and cloud_a.find_instance("from-a") == ia
    a.release()
    final = SimWorld.open(path, region, START + 40)
    assert final.cloud.find_instance("from-a") == ia and final.cloud.find_instance("from-b") == ib
    assert final.report()["instances"]["launched"] == 2


def test_a_holder_that_reloads_behaves_like_one_world_in_memory(tmp_path, region):
    path = tmp_path / "sim.db"
    mem = SimWorld.new(region, START)
    SimWorld.open(path, region, START)
    holders = [SimWorld.shared(path, region, START) for _ in range(2)]
    t = START
    for i in range(12):
        t += 300
        w = holders[i % 2]
        w.acquire(t)
        mem.advance(t)
        for x in (w, mem):
            x.cloud.create_instance(region.pools["gp-az2"], f"n{i}", f"act-{i}")
        w.release()
    final = SimWorld.open(path, region, t)
    assert final.cloud.instances() == mem.cloud.instances()
    assert [s.usage() for s in final.schedulers] == [s.usage() for s in mem.schedulers]


def test_the_first_holder_creates_the_file(tmp_path, region):
    path = tmp_path / "sim.db"
    w = SimWorld.shared(path, region, START + 95)
    w.acquire(START + 100)
    assert sim_store.revision(path) == 1
    w.release()
    assert SimWorld.open(path, region, START + 100).report()["start"] == START + 60


def test_a_file_corrupted_under_a_snapshot_is_an_error_at_acquire_never_recreated(tmp_path, region):
    path = tmp_path / "sim.db"
    SimWorld.open(path, region, START)
    w = SimWorld.shared(path, region, START)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE sim_state SET state = '{not json', rev = rev + 1")
    with pytest.raises(StateError, match="sim.db"):
        w.acquire(START + 60)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT state FROM sim_state").fetchone()[0] == "{not json"
