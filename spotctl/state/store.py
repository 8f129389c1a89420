"""The state store: one SQLite database per region (WAL, versioned migrations).

What it holds: our nodes and every transition; actions with their idempotency
key, recorded *before* each side effect; the token bucket; plan history with
the inputs that produced each plan; pool failure memory; notices seen; and the
**outbox** — lifecycle events (CloudEvents) and audit records written in the
same transaction as the state change they describe, for the relays to deliver.

Audit records are chained: each carries the SHA-256 of the previous one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sqlite3
import uuid
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from spotctl.core.budget import Bucket, Priority
from spotctl.core.errors import NotFoundError, StateError
from spotctl.core.lifecycle import check_transition, event_type
from spotctl.core.models import Node, NodeState

SCHEMA_VERSION = 4

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY, pool TEXT NOT NULL, state TEXT NOT NULL, action_id TEXT NOT NULL UNIQUE,
        instance_id TEXT, host TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL,
        reason TEXT NOT NULL DEFAULT '', cordoned INTEGER NOT NULL DEFAULT 0, idle_since REAL,
        notice_deadline REAL, notice_id TEXT, price REAL NOT NULL DEFAULT 0
    );
    CREATE INDEX nodes_state ON nodes(state);
    CREATE TABLE transitions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, node_id TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL,
        at REAL NOT NULL, reason TEXT NOT NULL, actor TEXT NOT NULL
    );
    CREATE INDEX transitions_node ON transitions(node_id);
    CREATE TABLE actions (
        id TEXT PRIMARY KEY, plan_id TEXT, kind TEXT NOT NULL, pool TEXT, node TEXT, count INTEGER,
        priority TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL, actor TEXT NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, result TEXT, inputs TEXT NOT NULL
    );
    CREATE INDEX actions_status ON actions(status);
    CREATE TABLE plans (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, plan_id TEXT NOT NULL, at REAL NOT NULL, actor TEXT NOT NULL,
        executed INTEGER NOT NULL, summary TEXT NOT NULL, input BLOB NOT NULL
    );
    CREATE TABLE budget (
        region TEXT PRIMARY KEY, rate REAL NOT NULL, burst INTEGER NOT NULL, tokens REAL NOT NULL, at REAL NOT NULL,
        used_total INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE pool_failures (pool TEXT PRIMARY KEY, until REAL NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL);
    CREATE TABLE reclaims (id INTEGER PRIMARY KEY AUTOINCREMENT, pool TEXT NOT NULL, node_id TEXT NOT NULL,
        at REAL NOT NULL, kind TEXT NOT NULL);
    CREATE TABLE notices (
        id TEXT PRIMARY KEY, node_id TEXT, instance_id TEXT NOT NULL, kind TEXT NOT NULL, issued_at REAL NOT NULL,
        deadline REAL, first_seen_at REAL NOT NULL, handled_at REAL, reason TEXT NOT NULL DEFAULT ''
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, key TEXT NOT NULL, payload TEXT NOT NULL,
        created_at REAL NOT NULL, delivered_at REAL
    );
    CREATE INDEX outbox_pending ON outbox(kind, delivered_at);
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, at REAL NOT NULL, actor TEXT NOT NULL,
        action TEXT NOT NULL, target TEXT NOT NULL, result TEXT NOT NULL, inputs TEXT NOT NULL,
        prev_hash TEXT NOT NULL, hash TEXT NOT NULL
    );
    CREATE TABLE passes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, started_at REAL NOT NULL, finished_at REAL, actor TEXT NOT NULL,
        status TEXT NOT NULL, summary TEXT NOT NULL DEFAULT '{}'
    );
    """,
    2: """
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL);
    """,
    3: """
    ALTER TABLE notices ADD COLUMN delivered_at REAL;
    ALTER TABLE notices ADD COLUMN pool TEXT;
    CREATE INDEX notices_seen ON notices(first_seen_at);
    """,
    4: """
    ALTER TABLE nodes ADD COLUMN protected_until REAL;
    ALTER TABLE nodes ADD COLUMN protect_closed INTEGER NOT NULL DEFAULT 0;
    """,
}

_NODE_COLS = ("id", "pool", "state", "action_id", "instance_id", "host", "created_at", "updated_at", "reason",
              "cordoned", "idle_since", "notice_deadline", "notice_id", "price", "protected_until", "protect_closed")

GENESIS = "0" * 64


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def audit_hash(record: dict, prev_hash: str) -> str:
    body = {k: record[k] for k in ("id", "at", "actor", "action", "target", "result", "inputs")}
    return hashlib.sha256((prev_hash + canonical(body)).encode()).hexdigest()


class Store:
    """A region's state database. Use :meth:`open`; close with :meth:`close`."""

    def __init__(self, path: Path, region: str, conn: sqlite3.Connection):
        import sqlite_utils

        self.path = path
        self.region = region
        self.conn = conn
        self.db = sqlite_utils.Database(conn)
        self._lock_fd: int | None = None
        self._in_tx = False

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, region: str, *, create: bool = True) -> "Store":
        path = Path(path)
        if not path.exists():
            if not create:
                raise NotFoundError(f"no state database at {path}",
                                    hint="run `spotctl reconcile` (or any command) once to create it")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StateError(f"cannot create state directory {path.parent}: {e.strerror}") from None
        try:
            conn = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=10000")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            del mode
        except sqlite3.DatabaseError as e:
            raise StateError(
                f"state database {path} is unreadable or corrupt: {e}",
                hint="nothing was changed; move the file aside and restore a backup, or start afresh "
                     "(`mv` it away) if losing local state is acceptable",
                details={"path": str(path)},
            ) from None
        store = cls(path, region, conn)
        store._migrate()
        return store

    def _migrate(self) -> None:
        try:
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.path} has schema version {version}, newer than this spotctl "
                    f"understands ({SCHEMA_VERSION})", hint="upgrade spotctl")
            for v in range(version + 1, SCHEMA_VERSION + 1):
                self.conn.execute("BEGIN IMMEDIATE")
                for stmt in _statements(MIGRATIONS[v]):
                    self.conn.execute(stmt)
                self.conn.execute(f"PRAGMA user_version={v}")
                self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise StateError(f"state database {self.path} could not be migrated: {e}",
                             hint="nothing was changed") from None

    def close(self) -> None:
        self.unlock()
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- locking and transactions -------------------------------------------

    def try_lock(self) -> bool:
        """Take the region's pass lock; False if another pass holds it."""
        if self._lock_fd is not None:
            return True
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        return True

    @contextlib.contextmanager
    def relay_lock(self) -> Iterator[bool]:
        """The outbox relay's own lock (not the pass lock: a slow destination must not hold up passes or the
        watcher). Yields False, at once, when another process is relaying: it delivers the same rows."""
        fd = os.open(str(self.path) + ".relay.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; nested calls join the outer one."""
        if self._in_tx:
            yield self.conn
            return
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as e:
            raise StateError(f"state database {self.path}: {e}") from None
        self._in_tx = True
        try:
            yield self.conn
        except BaseException:
            self._in_tx = False
            self.conn.execute("ROLLBACK")
            raise
        else:
            self._in_tx = False
            self.conn.execute("COMMIT")

    # -- nodes ---------------------------------------------------------------

    def nodes(self, *, live_only: bool = False, states: tuple[NodeState, ...] | None = None) -> list[Node]:
        sql = "SELECT * FROM nodes"
        args: tuple = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args = tuple(s.value for s in states)
        elif live_only:
            sql += " WHERE state NOT IN ('gone','failed','lost')"
        return [_node(r) for r in self.conn.execute(sql + " ORDER BY id", args)]

    def node(self, node_id: str) -> Node:
        r = self.conn.execute("SELECT * FROM nodes WHERE id=?", (node_id,)).fetchone()
        if r is None:
            raise NotFoundError(f"unknown node {node_id!r} in region {self.region!r}",
                                hint="`spotctl status` lists the region's nodes")
        return _node(r)

    def node_by_instance(self, instance_id: str) -> Node | None:
        r = self.conn.execute("SELECT * FROM nodes WHERE instance_id=? ORDER BY created_at DESC LIMIT 1",
                              (instance_id,)).fetchone()
        return None if r is None else _node(r)

    def find_node(self, node_id: str) -> Node | None:
        r = self.conn.execute("SELECT * FROM nodes WHERE id=?", (node_id,)).fetchone()
        return None if r is None else _node(r)

    def add_node(self, node: Node, *, actor: str, reason: str) -> None:
        """Record a new node (state ``intended``) with its event, in the caller's transaction."""
        with self.tx() as c:
            c.execute(f"INSERT INTO nodes ({','.join(_NODE_COLS)}) VALUES ({','.join('?' * len(_NODE_COLS))})",
                      _node_row(node))
            c.execute("INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
                      (node.id, None, node.state.value, node.created_at, reason, actor))
            self.event(node, None, reason, node.created_at)

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
                c.execute("INSERT INTO reclaims (pool, node_id, at, kind) VALUES (?,?,?,?)",
                          (node.pool, node.id, at, "lost" if to is NodeState.LOST else "notice"))
        return node

    def activations_since(self, t: float) -> list[tuple[str, float]]:
        """(node, when it became active) for nodes created at or after ``t``."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT t.node_id, t.at FROM transitions t JOIN nodes n ON n.id = t.node_id "
            "WHERE t.to_state = 'active' AND n.created_at >= ? ORDER BY t.at", (t,))]

    def transitions(self, node_id: str | None = None) -> list[dict]:
        if node_id:
            return list(self.db.query("SELECT * FROM transitions WHERE node_id=? ORDER BY id", (node_id,)))
        return list(self.db.query("SELECT * FROM transitions ORDER BY id"))

    # -- outbox: events and audit -------------------------------------------

    def event(self, node: Node, src: NodeState | None, reason: str, at: float) -> None:
        """The lifecycle event of a node's transition (keyed by node id: per-node order on Kafka)."""
        self.cloud_event(event_type(node.state), node.id, {
            "node": node.id, "pool": node.pool, "from": src.value if src else None, "to": node.state.value,
            "reason": reason, "instance_id": node.instance_id, "action_id": node.action_id}, at)

    def cloud_event(self, type_: str, subject: str, data: dict, at: float, key: str | None = None) -> None:
        """Queue a CloudEvents 1.0 (structured JSON) event in the outbox, in the caller's transaction."""
        self.outbox("event", key or subject, {
            "specversion": "1.0", "id": str(uuid.uuid4()), "source": f"spotctl/{self.region}", "type": type_,
            "subject": subject, "time": iso(at), "datacontenttype": "application/json", "data": data}, at)

    def outbox(self, kind: str, key: str, payload: dict, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)",
                      (kind, key, canonical(payload), at))

    def audit(self, *, actor: str, action: str, target: str, result: str, inputs: dict, at: float) -> dict:
        """Append a chained audit record and queue it in the outbox (same transaction)."""
        with self.tx() as c:
            prev = c.execute("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            prev_hash = prev[0] if prev else GENESIS
            rec = {"id": str(uuid.uuid4()), "at": at, "actor": actor, "action": action, "target": target,
                   "result": result, "inputs": inputs}
            rec["inputs"] = json.loads(canonical(inputs))
            h = audit_hash(rec, prev_hash)
            c.execute("INSERT INTO audit (id, at, actor, action, target, result, inputs, prev_hash, hash) "
                      "VALUES (?,?,?,?,?,?,?,?,?)",
                      (rec["id"], at, actor, action, target, result, canonical(rec["inputs"]), prev_hash, h))
            rec.update(prev_hash=prev_hash, hash=h, region=self.region)
            self.outbox("audit", rec["id"], rec, at)
        return rec

    def audit_records(self, limit: int | None = None) -> list[dict]:
        sql = "SELECT * FROM audit ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else "")
        return [{**r, "inputs": json.loads(r["inputs"])} for r in self.db.query(sql)]

    def verify_audit(self) -> tuple[bool, dict | None, int]:
        """Walk the chain; return (ok, first bad record, records checked)."""
        prev = GENESIS
        n = 0
        for rec in self.audit_records():
            n += 1
            if rec["prev_hash"] != prev or audit_hash(rec, prev) != rec["hash"]:
                return False, rec, n
            prev = rec["hash"]
        return True, None, n

    def outbox_rows(self, kind: str | None = None, pending_only: bool = False) -> list[dict]:
        sql = "SELECT * FROM outbox WHERE 1=1"
        args: list = []
        if kind:
            sql += " AND kind=?"
            args.append(kind)
        if pending_only:
            sql += " AND delivered_at IS NULL"
        return list(self.db.query(sql + " ORDER BY id", args))

    # -- outbox relay and audit queries (issue 6) ----------------------------

    def pending_batch(self, kind: str, limit: int, after_id: int = 0) -> list[tuple[int, str, str]]:
        """The oldest undelivered outbox rows of a kind, as (id, key, payload), in id order (no sort: index)."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT id, key, payload FROM outbox WHERE kind=? AND delivered_at IS NULL AND id > ? ORDER BY id LIMIT ?",
            (kind, after_id, int(limit)))]

    def mark_delivered(self, ids: list[int], at: float) -> None:
        """Mark outbox rows delivered (called only after the destination acknowledged them)."""
        with self.tx() as c:
            c.executemany("UPDATE outbox SET delivered_at=? WHERE id=? AND delivered_at IS NULL",
                          [(at, i) for i in ids])

    def outbox_pending(self, kind: str) -> tuple[int, float | None]:
        """(undelivered rows of a kind, creation time of the oldest)."""
        r = self.conn.execute("SELECT count(*), min(created_at) FROM outbox WHERE kind=? AND delivered_at IS NULL",
                              (kind,)).fetchone()
        return r[0], r[1]

    def audit_delivered(self) -> dict[str, float | None]:
        """Audit record id -> when its outbox row was delivered (None: still queued)."""
        return {r[0]: r[1] for r in self.conn.execute("SELECT key, delivered_at FROM outbox WHERE kind='audit'")}

    def audit_query(self, *, since: float | None = None, actor: str | None = None, action: str | None = None,
                    target: str | None = None, limit: int | None = None) -> list[dict]:
        """Audit records matching every given filter, oldest first (``action`` may end with ``*``)."""
        sql, args = "SELECT * FROM audit WHERE 1=1", []
        if since is not None:
            sql, args = sql + " AND at >= ?", args + [since]
        if actor:
            sql, args = sql + " AND actor = ?", args + [actor]
        if action:
            if action.endswith("*"):
                sql, args = sql + " AND action LIKE ? ESCAPE '\\'", args + [
                    action[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"]
            else:
                sql, args = sql + " AND action = ?", args + [action]
        if target:
            sql, args = sql + " AND target = ?", args + [target]
        sql += " ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else "")
        return [{**dict(r), "inputs": json.loads(r["inputs"])} for r in self.conn.execute(sql, args)]

    def audit_record(self, record_id: str) -> dict:
        """One audit record by id (a unique prefix of at least 8 characters also works)."""
        rows = self.conn.execute("SELECT * FROM audit WHERE id = ?", (record_id,)).fetchall()
        if not rows and len(record_id) >= 8:
            rows = self.conn.execute("SELECT * FROM audit WHERE id LIKE ? LIMIT 2",
                                     (record_id.replace("%", "").replace("_", "") + "%",)).fetchall()
        if len(rows) != 1:
            raise NotFoundError(f"no audit record {record_id!r} in region {self.region!r}" if not rows else
                                f"audit record id prefix {record_id!r} is ambiguous",
                                hint="`spotctl audit list` shows record ids")
        return {**dict(rows[0]), "inputs": json.loads(rows[0]["inputs"])}

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
            c.execute("UPDATE actions SET status=?, result=?, updated_at=? WHERE id=?", (status, result, at, action_id))

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
            d["inputs"] = json.loads(d["inputs"])
            out.append(d)
        return out

    # -- budget --------------------------------------------------------------

    def bucket(self, rate: float, burst: int, now: float) -> Bucket:
        r = self.conn.execute("SELECT * FROM budget WHERE region=?", (self.region,)).fetchone()
        if r is None:
            return Bucket.full(rate, burst, now)
        tokens = min(float(burst), r["tokens"])
        return Bucket(rate, burst, tokens, r["at"]).refill(now)

    def take_tokens(self, n: int, priority: Priority, rate: float, burst: int, now: float) -> int:
        """Atomically take up to n tokens from the shared bucket; return how many were granted."""
        with self.tx() as c:
            b = self.bucket(rate, burst, now)
            b, granted = b.take(n, priority, now)
            c.execute(
                "INSERT INTO budget (region, rate, burst, tokens, at, used_total) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(region) DO UPDATE SET rate=excluded.rate, burst=excluded.burst, tokens=excluded.tokens,"
                " at=excluded.at, used_total=budget.used_total+?",
                (self.region, rate, burst, b.tokens, b.at, granted, granted))
        return granted

    def tokens_used_total(self) -> int:
        r = self.conn.execute("SELECT used_total FROM budget WHERE region=?", (self.region,)).fetchone()
        return r[0] if r else 0

    # -- pool failures, reclaims, notices -----------------------------------

    def remember_failure(self, pool: str, until: float, reason: str, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO pool_failures (pool, until, reason, at) VALUES (?,?,?,?) ON CONFLICT(pool) DO "
                      "UPDATE SET until=excluded.until, reason=excluded.reason, at=excluded.at", (pool, until, reason, at))

    def pool_failures(self, now: float) -> dict[str, float]:
        return {r[0]: r[1] for r in self.conn.execute("SELECT pool, until FROM pool_failures WHERE until > ?", (now,))}

    def recent_reclaims(self, since: float) -> dict[str, int]:
        return {r[0]: r[1] for r in self.conn.execute(
            "SELECT pool, count(*) FROM reclaims WHERE at >= ? GROUP BY pool", (since,))}

    def see_notice(self, *, notice_id: str, node_id: str | None, instance_id: str, kind: str, issued_at: float,
                   deadline: float | None, reason: str, at: float, delivered_at: float | None = None,
                   pool: str | None = None) -> bool:
        """Record a notice the first time it is seen; True if new."""
        with self.tx() as c:
            cur = c.execute(
                "INSERT OR IGNORE INTO notices (id, node_id, instance_id, kind, issued_at, deadline, first_seen_at,"
                " reason, delivered_at, pool) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (notice_id, node_id, instance_id, kind, issued_at, deadline, at, reason, delivered_at, pool))
            return cur.rowcount == 1

    def notices_since(self, t: float) -> list[dict]:
        """Notices first seen at or after ``t`` (the evidence for contract conformance)."""
        return list(self.db.query("SELECT * FROM notices WHERE first_seen_at >= ? ORDER BY first_seen_at, id", (t,)))

    def notice_handled(self, notice_id: str, at: float) -> None:
        with self.tx() as c:
            c.execute("UPDATE notices SET handled_at=? WHERE id=? AND handled_at IS NULL", (at, notice_id))

    def notices(self) -> list[dict]:
        return list(self.db.query("SELECT * FROM notices ORDER BY first_seen_at, id"))

    # -- small persistent values (feed cursors, ETags) ------------------------

    def get_value(self, key: str, default: str | None = None) -> str | None:
        r = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return default if r is None else r[0]

    def set_value(self, key: str, value: str, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO kv (key, value, updated_at) VALUES (?,?,?) ON CONFLICT(key) DO UPDATE SET "
                      "value=excluded.value, updated_at=excluded.updated_at", (key, value, at))

    # -- plans and passes ----------------------------------------------------

    def record_plan(self, *, plan_id: str, at: float, actor: str, executed: bool, summary: dict, plan_input: dict) -> int:
        blob = zlib.compress(canonical(plan_input).encode(), 6)
        with self.tx() as c:
            cur = c.execute("INSERT INTO plans (plan_id, at, actor, executed, summary, input) VALUES (?,?,?,?,?,?)",
                            (plan_id, at, actor, int(executed), canonical(summary), blob))
            c.execute("DELETE FROM plans WHERE seq <= (SELECT max(seq) - 500 FROM plans)")
            return cur.lastrowid

    def plans(self, limit: int = 20) -> list[dict]:
        rows = self.conn.execute("SELECT seq, plan_id, at, actor, executed, summary FROM plans ORDER BY seq DESC LIMIT ?",
                                 (limit,))
        return [{**dict(r), "summary": json.loads(r["summary"])} for r in rows]

    def plan_input(self, seq: int) -> dict:
        return self.plan_record(seq)["input"]

    def plan_record(self, seq: int) -> dict:
        """A recorded plan: its id, time, actor, summary and the full input it was made from."""
        r = self.conn.execute("SELECT * FROM plans WHERE seq=?", (seq,)).fetchone()
        if r is None:
            raise NotFoundError(f"no recorded plan #{seq} in region {self.region!r}",
                                hint="`spotctl plan --history` lists the recorded plans")
        d = dict(r)
        d["summary"] = json.loads(d["summary"])
        d["input"] = json.loads(zlib.decompress(d["input"]))
        return d

    def start_pass(self, actor: str, at: float) -> int:
        """A new pass row (the caller holds the region lock, so no other pass is live): a row an earlier
        pass left ``running`` (killed, or failed without finishing) is closed as ``abandoned``."""
        with self.tx() as c:
            c.execute("UPDATE passes SET status='abandoned', finished_at=? WHERE status='running'", (at,))
            return c.execute("INSERT INTO passes (started_at, actor, status) VALUES (?,?,?)",
                             (at, actor, "running")).lastrowid

    def finish_pass(self, seq: int, status: str, summary: dict, at: float) -> None:
        with self.tx() as c:
            c.execute("UPDATE passes SET finished_at=?, status=?, summary=? WHERE seq=?",
                      (at, status, canonical(summary), seq))
            c.execute("DELETE FROM passes WHERE seq <= (SELECT max(seq) - 2000 FROM passes)")

    def last_pass(self) -> dict | None:
        r = self.conn.execute("SELECT * FROM passes WHERE finished_at IS NOT NULL ORDER BY seq DESC LIMIT 1").fetchone()
        if r is None:
            return None
        d = dict(r)
        d["summary"] = json.loads(d["summary"])
        return d


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


_STATES = {s.value: s for s in NodeState}


def _node(r: sqlite3.Row) -> Node:
    return Node(
        id=r["id"], pool=r["pool"], state=_STATES[r["state"]], action_id=r["action_id"],
        created_at=r["created_at"], updated_at=r["updated_at"], instance_id=r["instance_id"], host=r["host"],
        reason=r["reason"], cordoned=bool(r["cordoned"]), idle_since=r["idle_since"],
        notice_deadline=r["notice_deadline"], notice_id=r["notice_id"], price=r["price"],
        protected_until=r["protected_until"], protect_closed=bool(r["protect_closed"]),
    )


def _node_row(n: Node) -> tuple:
    return (n.id, n.pool, n.state.value, n.action_id, n.instance_id, n.host, n.created_at, n.updated_at, n.reason,
            int(n.cordoned), n.idle_since, n.notice_deadline, n.notice_id, n.price, n.protected_until,
            int(n.protect_closed))
