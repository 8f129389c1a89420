"""The region's pass lock (issue 11, item 6): a bounded wait for it, and who holds it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from spotctl.core.errors import StateError
from spotctl.state.store import Store


@pytest.fixture
def two(tmp_path):
    a, b = Store.open(tmp_path / "r.db", "r"), Store.open(tmp_path / "r.db", "r")
    yield a, b
    a.close()
    b.close()


def test_without_a_wait_a_busy_lock_is_refused_at_once(two):
    a, b = two
    assert a.try_lock(purpose="first")
    t0 = time.monotonic()
    assert not b.try_lock()
    assert not b.try_lock(0.0)
    assert time.monotonic() - t0 < 0.05


def test_a_wait_gives_up_at_its_deadline_and_reports_each_poll(two):
    a, b = two
    assert a.try_lock(purpose="a long pass")
    polls = []
    t0 = time.monotonic()
    assert not b.try_lock(0.35, on_wait=polls.append)
    took = time.monotonic() - t0
    assert 0.35 <= took < 0.6
    assert 3 <= len(polls) <= 5 and polls == sorted(polls)  # polled about every 0.1 s
    a.unlock()
    assert b.try_lock(0.35)  # free again: taken at once


def test_a_wait_takes_the_lock_as_soon_as_it_is_released(two):
    a, b = two
    assert a.try_lock()
    threading.Timer(0.3, a.unlock).start()
    t0 = time.monotonic()
    assert b.try_lock(5.0, purpose="second")
    assert 0.25 <= time.monotonic() - t0 < 1.0
    assert not a.try_lock()  # now b holds it
    assert b.lock_holder()["purpose"] == "second"


def test_the_holder_says_who_it_is(two):
    a, b = two
    assert a.try_lock(purpose="reconcile pass, by tester")
    h = b.lock_holder()
    assert h["pid"] == os.getpid() and h["purpose"] == "reconcile pass, by tester"
    assert h["host"] and abs(h["since"] - time.time()) < 5


def test_an_older_lock_file_with_a_pid_only_still_names_the_holder(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    try:
        (tmp_path / "r.db.lock").write_text("4242")
        assert s.lock_holder() == {"pid": 4242}
        (tmp_path / "r.db.lock").write_text("")  # the holder between truncate and write
        assert s.lock_holder() is None
    finally:
        s.close()


def test_an_interrupt_while_waiting_leaves_no_lock_behind(two):
    a, b = two
    assert a.try_lock()

    def interrupt(_elapsed):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        b.try_lock(5.0, on_wait=interrupt)
    a.unlock()
    assert b.try_lock() and b._lock_fd is not None


def test_a_lock_path_that_is_a_directory_is_a_state_error(tmp_path):
    s = Store.open(tmp_path / "r.db", "r")
    try:
        (tmp_path / "r.db.lock").mkdir()
        with pytest.raises(StateError, match="r.db.lock"):
            s.try_lock()
    finally:
        s.close()


def test_the_wait_is_bounded_even_when_the_clock_stands_still(two):
    from freezegun import freeze_time

    a, b = two
    assert a.try_lock()
    t0 = time.perf_counter()
    with freeze_time("2026-03-02 10:00:00"):  # time.monotonic() does not move: the polls are counted too
        assert not b.try_lock(0.3)
    assert time.perf_counter() - t0 < 2
