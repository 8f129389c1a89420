"""Opening the state database (issue 14, item 2): cheap checks on every open (header, page size, size
against the header's page count, version, schema), the full integrity check only on request
(:meth:`Store.full_check`) and after an unclean shutdown; a page damaged in the middle of the file is
found where it is read (exit 9 naming the file) and by the full check."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from spotctl.core.errors import ExitCode, StateError
from spotctl.core.models import Node, NodeState
from spotctl.state.store import Store

#: A process that opens the store, writes, and dies without closing it (its -wal stays, as after kill -9).
DIE = ("import os, sys; from spotctl.state.store import Store; s = Store.open(sys.argv[1], 'r'); "
       "s.set_value('k', 'v', 1.0); os._exit(0)")


def listing(d: Path) -> list[tuple[str, int]]:
    return sorted((p.name, p.stat().st_size) for p in d.iterdir())


def make_db(path: Path, records: int = 400) -> None:
    """A real, closed state database whose audit table spans many pages."""
    s = Store.open(path, "r")
    with s.tx():
        for i in range(records):
            s.audit(actor="t", action="node.launch", target=f"n{i}", result="ok", inputs={"pad": "x" * 200}, at=i)
        n = Node(id="n1", pool="p", state=NodeState.INTENDED, action_id="a1", created_at=1.0, updated_at=1.0)
        s.add_node(n, actor="t", reason="test")
    s.close()
    assert not Path(f"{path}-wal").exists()


def damage_a_middle_page(path: Path, table: str = "audit") -> int:
    """Overwrite one leaf page of ``table`` in the middle of the file (not the first one read); its number."""
    c = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    pages = [r[0] for r in c.execute("SELECT pageno FROM dbstat WHERE name=? AND pagetype='leaf' ORDER BY pageno",
                                     (table,))]
    size = c.execute("PRAGMA page_size").fetchone()[0]
    c.close()
    assert len(pages) > 4
    page = pages[len(pages) // 2]
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(b"\xff" * size)
    return page


def test_an_open_reads_no_page_in_full_and_says_so(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    s = Store.open(p, "r")
    assert not s.full_checked and s.full_check() == [] and s.full_check(quick=True) == []
    s.close()


def test_a_page_damaged_in_the_middle_is_found_where_it_is_read_and_by_the_full_check(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    damage_a_middle_page(p)
    s = Store.open(p, "r")  # cheap checks only: the damaged page is not read at open
    with pytest.raises(StateError) as e:
        s.audit_records()  # the first rows read fine; the damaged page stops the read, not a traceback
    assert e.value.exit_code == ExitCode.STATE and str(p) in e.value.message and "corrupt" in e.value.message
    problems = s.full_check()
    assert problems and all(isinstance(x, str) for x in problems)
    assert s.full_check(quick=True)
    s.close()


@pytest.mark.parametrize("cut", ["half-the-pages", "one-page-short", "mid-page"])
def test_a_file_cut_short_at_any_point_is_exit_9_at_open_and_left_untouched(tmp_path, cut):
    src = tmp_path / "src.db"
    make_db(src)
    good = src.read_bytes()
    page = int.from_bytes(good[16:18], "big")
    n = {"half-the-pages": (len(good) // page // 2) * page, "one-page-short": len(good) - page,
         "mid-page": len(good) - page // 2}[cut]
    d = tmp_path / "state"
    d.mkdir()
    p = d / "r.db"
    p.write_bytes(good[:n])
    before = listing(d)
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    assert e.value.exit_code == ExitCode.STATE and "is cut short" in e.value.message and str(p) in e.value.message
    assert "corrupt" in e.value.message
    assert p.read_bytes() == good[:n] and listing(d) == before  # nothing beside it, not even a lock file


def test_a_header_with_an_impossible_page_size_is_exit_9(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    raw = bytearray(p.read_bytes())
    raw[16:18] = (1000).to_bytes(2, "big")
    p.write_bytes(bytes(raw))
    with pytest.raises(StateError, match="page size 1000") as e:
        Store.open(p, "r")
    assert e.value.exit_code == ExitCode.STATE


def test_after_an_unclean_shutdown_the_next_open_checks_every_page_once(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    subprocess.run([sys.executable, "-c", DIE, str(p)], check=True)
    assert Path(f"{p}-wal").exists()
    s = Store.open(p, "r")
    assert s.full_checked and s.get_value("k") == "v"  # nothing lost: the log was read
    s.close()
    assert not Path(f"{p}-wal").exists()
    again = Store.open(p, "r")
    assert not again.full_checked  # closed cleanly since
    again.close()


def test_a_store_opened_while_another_process_has_it_open_does_not_check_in_full(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    code = ("import sys; from spotctl.state.store import Store; s = Store.open(sys.argv[1], 'r'); "
            "s.set_value('k', 'v', 1.0); print('ready', flush=True); sys.stdin.read(); s.close()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(p)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert Path(f"{p}-wal").exists()  # a live log: the holder's, not a leftover
        reader = Store.open(p, "r")
        assert not reader.full_checked and reader.get_value("k") == "v"
        reader.close()
        assert Path(f"{p}-wal").exists()  # the holder still has it open
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    assert not Path(f"{p}-wal").exists()
    # in one process too: a second store of the same database sees the first
    a = Store.open(p, "r")
    a.set_value("k", "w", 2.0)
    b = Store.open(p, "r")
    assert not b.full_checked
    b.close()
    a.close()


def test_a_damaged_file_left_by_an_unclean_shutdown_is_refused_at_every_open_and_left_as_it_was(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    subprocess.run([sys.executable, "-c", DIE, str(p)], check=True)
    damage_a_middle_page(p)
    before = {f: Path(f).read_bytes() for f in (str(p), f"{p}-wal")}
    for _ in range(2):
        with pytest.raises(StateError) as e:
            Store.open(p, "r")
        assert e.value.exit_code == ExitCode.STATE and str(p) in e.value.message
        assert "checked in full" in e.value.message and "restore a backup" in e.value.hint
        assert {f: Path(f).read_bytes() for f in before} == before  # the log stays: the next open checks again


def test_an_index_the_queries_name_dropped_by_hand_is_exit_9_at_open(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    c = sqlite3.connect(p)
    c.execute("DROP INDEX outbox_undelivered")
    c.commit()
    c.close()
    with pytest.raises(StateError, match="index 'outbox_undelivered' of table 'outbox' is missing") as e:
        Store.open(p, "r")
    assert e.value.exit_code == ExitCode.STATE


def test_a_directory_where_the_users_lock_belongs_is_exit_9(tmp_path):
    p = tmp_path / "r.db"
    make_db(p)
    lock = Path(f"{p}.users.lock")
    lock.unlink()
    lock.mkdir()
    with pytest.raises(StateError) as e:
        Store.open(p, "r")
    assert e.value.message == f"lock file {lock} of state database r.db is a directory"
