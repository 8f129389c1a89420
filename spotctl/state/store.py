"""The state store: one SQLite database per region (WAL, versioned migrations).

What it holds: our nodes and every transition; actions with their idempotency
key, recorded *before* each side effect; the token bucket; plan history with
the inputs that produced each plan; pool failure memory; notices seen; and the
**outbox** — lifecycle events (CloudEvents) and audit records written in the
same transaction as the state change they describe, for the relays to deliver.

:class:`Store` is the one object callers use. It is composed of the package's parts, each a
module of ``spotctl.state``: ``dbfile`` (the file as an input: its checks, and every SQLite failure
as a StateError naming it), ``schema`` (migrations, creating a database whole, the checks at open),
``connection`` (the connection and :meth:`Store.tx`, with the file identity check inside the
transaction), ``lock`` (the pass and relay locks), ``outbox`` (events built with the ``cloudevents``
SDK, relay batches), ``audit`` (the chained ledger; the chain: :mod:`spotctl.core.audit`) and
``memory`` (budget, pool failures, notices, values, plan history). This module opens and closes the
store and holds the node, transition, action and pass rows.

No ``sqlite-utils`` (it was a dependency for ``Database.query`` alone, one line of ``sqlite3``
here): what else it is good at does not fit this store. Its write helpers open a transaction of
their own on every call (a deferred ``BEGIN``, or a savepoint inside ours), where every write here
is one ``BEGIN IMMEDIATE`` that checks the file's identity before it commits; its upserts cannot
say ``used_total = budget.used_total + ?``; ``transform`` rebuilds a whole table where the
migrations only add columns; and ``Database(conn)`` changes the connection it is given (``PRAGMA
recursive_triggers``, plugin hooks) and took ~0.1 s to import in every command that opens a store.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Self

from spotctl.core.audit import canonical
from spotctl.core.budget import Priority
from spotctl.core.errors import NotFoundError, StateError
from spotctl.core.lifecycle import check_transition
from spotctl.core.models import Node, NodeState
from spotctl.core.timefmt import iso as _iso
from spotctl.state.audit import AuditLog
from spotctl.state.connection import Connection, inserted
from spotctl.state.dbfile import (
    bad_value,
    check_existing,
    check_lock_paths,
    identity,
    loads,
    open_error,
    sqlite_error,
    version_stamp,
)
from spotctl.state.lock import RegionLock
from spotctl.state.memory import Memory
from spotctl.state.outbox import KINDS
from spotctl.state.presence import Presence, arrive
from spotctl.state.prune import LIVE, Prune
from spotctl.state.schema import (
    NODE_STATES,
    SCHEMA_VERSION,
    check_after_crash,
    check_schema,
    full_check,
    migrate,
    precheck,
)
from spotctl.state.schema import create as create_db

__all__ = ["SCHEMA_VERSION", "Store", "iso", "sqlite_error"]

log = logging.getLogger(__name__)

_NODE_COLS = ("id", "pool", "state", "action_id", "instance_id", "host", "created_at", "updated_at", "reason",
              "cordoned", "idle_since", "notice_deadline", "notice_id", "price", "protected_until", "protect_closed")
#: the write-ahead log's size (bytes) that a checkpointed log is cut back to (``PRAGMA journal_size_limit``)
WAL_SIZE_LIMIT = 64 << 20
#: a node row's columns in _NODE_COLS order, which _node reads by position
_NODE_SELECT = f"SELECT {','.join(_NODE_COLS)} FROM nodes"


def iso(t: float) -> str:
    """Epoch seconds as RFC 3339 UTC text, microseconds only when there are any (an audit record's or
    a CloudEvent's time): :func:`spotctl.core.timefmt.iso` with ``"auto"``, never None."""
    text = _iso(t, "auto")
    if text is None:
        raise ValueError(f"not a point in time: {t!r}")
    return text


class Store(AuditLog, RegionLock, Memory, Prune):
    """A region's state database. Use :meth:`open`; close with :meth:`close`."""

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, region: str, *, create: bool = True,
             outbox_kinds: Collection[str] | None = None) -> Store:
        """Open a region's state database. Only a missing file means a new region: it is created whole
        (migrated in a temporary file, then linked into place), so no other process ever sees it half made;
        an existing file that is empty, cut short or not SQLite is corruption and is left untouched.

        The checks at open cost the same whatever the size of the file (header, size, version, schema,
        enumerated values); every page is read only after an unclean shutdown (:mod:`spotctl.state.presence`)
        and by :meth:`full_check`. ``outbox_kinds``: the outbox kinds this region queues (those it has a
        relay for; default: every kind, :data:`spotctl.state.outbox.KINDS`)."""
        path = Path(path)
        created = False
        if not os.path.lexists(path):
            if not create:
                raise NotFoundError(f"no state database at {path}",
                                    hint="run `spotctl reconcile` (or any command) once to create it")
            created = create_db(path)
        else:
            check_existing(path)
        check_lock_paths(path)
        presence = arrive(path)  # before our own connection: its log is not a leftover
        try:
            return cls._open(path, region, created, presence, outbox_kinds)
        except BaseException:
            presence.release()
            raise

    @classmethod
    def _open(cls, path: Path, region: str, created: bool, presence: Presence,
              outbox_kinds: Collection[str] | None) -> Store:
        full = not created and presence.unclean
        if full:  # the last user did not close it: every page is read once, before anything is written
            check_after_crash(path)
        if not created and not os.path.lexists(f"{path}-wal"):
            seen = version_stamp(path)
            try:
                precheck(path)
            except StateError:
                # another process may have opened and checkpointed it meanwhile (the immutable read takes no
                # lock): only a file that stayed as it was is refused here; else check again, under the locks
                if version_stamp(path) == seen and not os.path.lexists(f"{path}-wal"):
                    raise
        try:
            conn = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False,
                                   factory=Connection)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=10000")
        except sqlite3.DatabaseError as e:
            with contextlib.suppress(UnboundLocalError, sqlite3.Error):
                conn.close()
            raise open_error(path, e) from None
        store = cls(path, region, conn)
        store.created = created
        store.full_checked = full
        try:
            # read-only checks first (version and schema; precheck did them without a log): nothing is written
            # to a file that turns out to be foreign or damaged, not even the switch to WAL
            migrate(conn, path)
            check_schema(conn, path)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # a pass checkpoints once at its end (checkpoints_deferred): its log may grow well past SQLite's
            # usual 4 MB first; once checkpointed, the next write cuts the file back to this size
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            conn.execute("PRAGMA foreign_keys=ON")
            store.queue_kinds(KINDS if outbox_kinds is None else outbox_kinds)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise open_error(path, e) from None
        except BaseException:
            conn.close()
            raise
        conn.state_path = path  # from here on, SQLite failures name the file (StateError)
        store._wal_identity = identity(Path(f"{path}-wal"))
        store._presence = presence
        return store

    def full_check(self, *, quick: bool = False) -> list[str]:
        """Read every page of the database (``PRAGMA integrity_check``; ``quick``: ``quick_check``), and check
        the outbox's pending counters against the rows: the problems found (empty: ok). O(size of the file):
        for ``spotctl state check`` and ``spotctl doctor``, not for every open."""
        return full_check(self.conn, quick=quick) or self.outbox_counter_problems()

    def close(self) -> None:
        try:
            self.unlock()
            moved = self._identity is not None and identity(self.path) != self._identity
            self.conn.close()
            if moved:
                self._set_aside_orphans()
        finally:
            if self._presence is not None:  # after the connection: its clean close has removed the log by now
                self._presence.release()

    def _set_aside_orphans(self) -> None:
        """The database was deleted or replaced while open: SQLite then leaves its write-ahead log at
        ``<db>-wal`` (it checkpoints only into an unmoved file), where the next open would replay it into
        whatever file is at the path now — a new region, or a restored backup. Move our own log (the same
        file we opened) and its index aside, never deleting anything."""
        wal, shm = Path(f"{self.path}-wal"), Path(f"{self.path}-shm")
        if self._wal_identity is None or identity(wal) != self._wal_identity:
            return  # not the log we used: it belongs to whatever is at the path now
        stamp = f".orphaned-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for f in (wal, shm):
            with contextlib.suppress(OSError):
                os.rename(f, f"{f}{stamp}")
        log.info("state database %s was deleted or replaced while open: its write-ahead log was moved to %s "
                 "(it holds the last changes made to the old file)", self.path, f"{wal}{stamp}")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- nodes ---------------------------------------------------------------

    def nodes(self, *, live_only: bool = False, states: tuple[NodeState, ...] | None = None) -> list[Node]:
        sql = _NODE_SELECT
        args: tuple = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args = tuple(s.value for s in states)
        elif live_only:  # IN the live states: a range of the state index each, never a scan of the ended rows
            sql += f" WHERE state IN ({','.join('?' * len(LIVE))})"
            args = LIVE
        return [_node(r, self.path) for r in self.conn.execute(sql + " ORDER BY id", args)]

    def live_node_summary(self) -> list[tuple[str, str, int, float]]:
        """(pool, state, live nodes, sum of their prices) per pool and live state: one scan of the live states'
        ranges of the state index, no row turned into a Node (the metrics at 100k nodes)."""
        from spotctl.state.prune import LIVE

        out = []
        for pool, state, n, price in self.conn.execute(
                f"SELECT pool, state, count(*), total(price) FROM nodes WHERE state IN ({','.join('?' * len(LIVE))}) "
                "GROUP BY pool, state ORDER BY pool, state", LIVE):
            if not isinstance(n, int) or not isinstance(price, float) or not math.isfinite(price):
                raise bad_value(self.path, "nodes", f"{pool}/{state}", "price", price)
            out.append((str(pool), str(state), n, price))
        return out

    def node(self, node_id: str) -> Node:
        r = self.conn.execute(f"{_NODE_SELECT} WHERE id=?", (node_id,)).fetchone()
        if r is None:
            raise NotFoundError(f"unknown node {node_id!r} in region {self.region!r}",
                                hint="`spotctl status` lists the region's nodes")
        return _node(r, self.path)

    def node_by_instance(self, instance_id: str) -> Node | None:
        r = self.conn.execute(f"{_NODE_SELECT} WHERE instance_id=? ORDER BY created_at DESC LIMIT 1",
                              (instance_id,)).fetchone()
        return None if r is None else _node(r, self.path)

    def find_node(self, node_id: str) -> Node | None:
        r = self.conn.execute(f"{_NODE_SELECT} WHERE id=?", (node_id,)).fetchone()
        return None if r is None else _node(r, self.path)

    def add_node(self, node: Node, *, actor: str, reason: str) -> None:
        """Record a new node (state ``intended``) with its event, in the caller's transaction."""
        with self.tx() as c:
            c.execute(f"INSERT INTO nodes ({','.join(_NODE_COLS)}) VALUES ({','.join('?' * len(_NODE_COLS))})",
                      _node_row(node))
            c.execute("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
                      (node.id, None, node.state.value, node.created_at, reason, actor))
            self.event(node, None, reason, node.created_at)

    def known_ids(self, node_ids: list[str]) -> set[str]:
        """Which of these node ids the store has a row for (of any state)."""
        found: set[str] = set()
        for i in range(0, len(node_ids), 500):
            chunk = node_ids[i:i + 500]
            found.update(r[0] for r in self.conn.execute(
                f"SELECT id FROM nodes WHERE id IN ({','.join('?' * len(chunk))})", chunk))
        return found

    def adopt_nodes(self, adopted: list[tuple[Node, NodeState]], *, at: float, actor: str) -> None:
        """Record tagged instances we had no record of, in the caller's transaction: each node as
        :meth:`add_node` records it (``intended``, at its creation), then its transition to the given
        state (reason ``adopted``) and a ``node.adopt`` audit record — the same rows, in the same order
        within each table, as those calls one node at a time, written with one ``executemany`` per table
        and chunk (:func:`spotctl.state.bulk.adoption_rows`). Each node is changed as :meth:`transition`
        changes it."""
        from spotctl.state.bulk import AuditRows, adoption_rows

        events = self._events()
        with self.tx() as c:
            chain = AuditRows(self.region, self.chain_head())
            for i in range(0, len(adopted), 2000):  # chunks: rows of a few thousand nodes in memory at a time
                nodes, moves, audit, outbox = adoption_rows(adopted[i:i + 2000], at=at, actor=actor, events=events,
                                                            chain=chain, row=_node_row)
                c.executemany(f"INSERT INTO nodes ({','.join(_NODE_COLS)}) VALUES "
                              f"({','.join('?' * len(_NODE_COLS))})", nodes)
                c.executemany("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) "
                              "VALUES (?,?,?,?,?,?)", moves)
                c.executemany("INSERT INTO audit (id, at, actor, action, target, result, inputs, prev_hash, hash) "
                              "VALUES (?,?,?,?,?,?,?,?,?)", audit)
                c.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)", outbox)
                self._head = chain.head

    def update_node(self, node: Node, **changes) -> Node:
        for k, v in changes.items():
            setattr(node, k, v)
        with self.tx() as c:
            sets = ",".join(f"{k}=?" for k in _NODE_COLS[1:])
            row = _node_row(node)
            c.execute(f"UPDATE nodes SET {sets} WHERE id=?", row[1:] + (node.id,))
        return node

    def transition(self, node: Node, to: NodeState, *, reason: str, at: float, actor: str, **changes) -> Node:
        """Move a node to a new state: the row, its transition and its event in one transaction."""
        src = node.state
        check_transition(node.id, src, to)
        with self.tx() as c:
            node.state = to
            node.updated_at = at
            node.reason = reason
            self.update_node(node, **changes)
            c.execute("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
                      (node.id, src.value, to.value, at, reason, actor))
            self.event(node, src, reason, at)
            if to in (NodeState.LOST,) or (to is NodeState.GONE and node.notice_id):
                kind = "lost" if to is NodeState.LOST else "notice"
                c.execute("INSERT INTO reclaims (pool, node_id, at, kind) VALUES (?,?,?,?)",
                          (node.pool, node.id, at, kind))
                self.count("spotctl_reclaims", {"pool": node.pool, "kind": kind}, at)
                if c.execute("SELECT 1 FROM transitions WHERE node_id=? AND to_state='advised' LIMIT 1",
                             (node.id,)).fetchone():
                    self.count("spotctl_advisories_followed", {"pool": node.pool}, at)
            elif to is NodeState.ADVISED and src is not NodeState.ADVISED:
                self.count("spotctl_advisories", {"pool": node.pool}, at)
            elif to is NodeState.DELETING and node.notice_id:
                r = c.execute("SELECT first_seen_at, kind FROM notices WHERE id=?", (node.notice_id,)).fetchone()
                if r is not None:
                    self.observe("spotctl_notice_empty_seconds", {"pool": node.pool, "kind": r[1]}, at - r[0], at)
        return node

    def activations_since(self, t: float) -> list[tuple[str, float]]:
        """(node, when it became active) for nodes created at or after ``t``."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT t.node_id, t.at FROM transitions t JOIN nodes n ON n.id = t.node_id "
            "WHERE t.to_state = 'active' AND n.created_at >= ? ORDER BY t.at", (t,))]

    def transitions(self, node_id: str | None = None) -> list[dict]:
        if node_id:
            return [dict(r) for r in self.conn.execute("SELECT * FROM transitions WHERE node_id=? ORDER BY id",
                                                       (node_id,))]
        return [dict(r) for r in self.conn.execute("SELECT * FROM transitions ORDER BY id")]

    def counts(self) -> dict:
        c = self.conn
        return {
            "nodes": c.execute("SELECT count(*) FROM nodes").fetchone()[0],
            "transitions": c.execute("SELECT count(*) FROM transitions").fetchone()[0],
            "actions": c.execute("SELECT count(*) FROM actions").fetchone()[0],
            "outbox": c.execute("SELECT count(*) FROM outbox").fetchone()[0],
            "outbox_pending": c.execute("SELECT count(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0],
            "audit": c.execute("SELECT count(*) FROM audit").fetchone()[0],
            "plans": c.execute("SELECT count(*) FROM plans").fetchone()[0],
        }

    # -- actions (intent before effect) --------------------------------------

    def record_intent(self, *, action_id: str, plan_id: str | None, kind: str, priority: Priority, reason: str,
                      actor: str, at: float, inputs: dict, pool: str | None = None, node: str | None = None,
                      count: int | None = None) -> bool:
        """Record an action before acting; False if this id is already recorded (idempotency)."""
        with self.tx() as c:
            cur = c.execute(
                "INSERT OR IGNORE INTO actions (id, plan_id, kind, pool, node, count, priority, status, reason, actor,"
                " created_at, updated_at, inputs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (action_id, plan_id, kind, pool, node, count, priority.name.lower(), "intended", reason, actor, at, at,
                 canonical(inputs)))
            return cur.rowcount == 1

    def finish_action(self, action_id: str, status: str, result: str, at: float) -> None:
        with self.tx() as c:
            r = c.execute("UPDATE actions SET status=?, result=?, updated_at=? WHERE id=? RETURNING kind",
                          (status, result, at, action_id)).fetchone()
            if r is not None:
                self.count("spotctl_actions", {"kind": r[0], "result": status}, at)

    def actions(self, status: str | None = None, limit: int | None = 200) -> list[dict]:
        """Actions, newest first; ``limit=None`` for all of them."""
        sql = "SELECT * FROM actions"
        args: list = []
        if status:
            sql += " WHERE status=?"
            args.append(status)
        args.append(-1 if limit is None else limit)
        rows = self.conn.execute(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", args)
        out = []
        for r in rows:
            d = dict(r)
            d["inputs"] = loads(self.path, "actions", d["id"], "inputs", d["inputs"])
            if not isinstance(d["priority"], str) or d["priority"].upper() not in Priority.__members__:
                raise bad_value(self.path, "actions", d["id"], "priority", d["priority"],
                                known=[m.lower() for m in Priority.__members__])
            out.append(d)
        return out

    # -- passes --------------------------------------------------------------

    def start_pass(self, actor: str, at: float) -> int:
        """A new pass row (the caller holds the region lock, so no other pass is live): a row an earlier
        pass left ``running`` (killed, or failed without finishing) is closed as ``abandoned``."""
        with self.tx() as c:
            left = c.execute("UPDATE passes SET status='abandoned', finished_at=? WHERE status='running' "
                             "RETURNING seq", (at,)).fetchall()
            if left:
                self.count("spotctl_passes", {"result": "abandoned"}, at, by=len(left))
            self.started_pass = inserted(c.execute("INSERT INTO passes (started_at, actor, status) VALUES (?,?,?)",
                                                   (at, actor, "running")))  # known even if interrupted now
            return self.started_pass

    def finish_pass(self, seq: int, status: str, summary: dict, at: float, *, only_running: bool = False,
                    duration: float | None = None) -> None:
        """The end of a pass; ``only_running``: unless it has one already (an interrupt after the end).
        ``duration``: the pass's own measure of its time (else the clock's ``at`` minus its start)."""
        with self.tx() as c:
            r = c.execute("UPDATE passes SET finished_at=?, status=?, summary=? WHERE seq=?"
                          + (" AND status='running'" if only_running else "") + " RETURNING started_at",
                          (at, status, canonical(summary), seq)).fetchone()
            if r is not None:
                self.count("spotctl_passes", {"result": status}, at)
                self.observe("spotctl_pass_duration_seconds", {}, at - r[0] if duration is None else duration, at)
            c.execute("DELETE FROM passes WHERE seq <= (SELECT max(seq) - 2000 FROM passes)")

    def last_pass(self) -> dict | None:
        r = self.conn.execute("SELECT * FROM passes WHERE finished_at IS NOT NULL ORDER BY seq DESC LIMIT 1").fetchone()
        if r is None:
            return None
        d = dict(r)
        d["summary"] = loads(self.path, "passes", d["seq"], "summary", d["summary"])
        return d


def _node(r: sqlite3.Row, path: Path) -> Node:
    """A node of its row, as ``_NODE_SELECT`` reads it (by position: 20k rows a pass)."""
    (nid, pool, state_text, action_id, instance_id, host, created_at, updated_at, reason, cordoned, idle_since,
     notice_deadline, notice_id, price, protected_until, protect_closed) = r
    state = NODE_STATES.get(state_text) if isinstance(state_text, str) else None
    if state is None:
        raise bad_value(path, "nodes", nid, "state", state_text, known=NODE_STATES)
    return Node(
        id=nid, pool=pool, state=state, action_id=action_id, created_at=created_at, updated_at=updated_at,
        instance_id=instance_id, host=host, reason=reason, cordoned=bool(cordoned), idle_since=idle_since,
        notice_deadline=notice_deadline, notice_id=notice_id, price=price, protected_until=protected_until,
        protect_closed=bool(protect_closed),
    )


def _node_row(n: Node) -> tuple:
    return (n.id, n.pool, n.state.value, n.action_id, n.instance_id, n.host, n.created_at, n.updated_at, n.reason,
            int(n.cordoned), n.idle_since, n.notice_deadline, n.notice_id, n.price, n.protected_until,
            int(n.protect_closed))
