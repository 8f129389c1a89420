"""The audit ledger: chained records appended in the caller's transaction (each also queued in the
outbox for the audit service), and the queries over them — all streamed in seq-ordered chunks, so
that no read loads the whole history.

The chain itself — what is hashed, how, the one walk that checks it, and where a verify starts
(checkpoint, pruning anchor) — is :mod:`spotctl.core.audit`; this module only stores and reads it.
The verify checkpoint and the pruning anchor are :class:`~spotctl.core.audit.Mark` values in the
``kv`` table (:data:`CHECKPOINT_KEY`, :data:`ANCHOR_KEY`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sqlite3
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spotctl.core.audit import (GENESIS, ChainWalk, Mark, check_mark_record,
                                verify_start, walk)
from spotctl.core.errors import NotFoundError, StateError
from spotctl.state.dbfile import loads
from spotctl.state.memory import Memory
from spotctl.state.outbox import Outbox

if TYPE_CHECKING:
    from spotctl.state.bulk import SharedInputs

CHUNK = 5000
CHECKPOINT_KEY = "audit.checkpoint"  # the last record a successful verify checked (seq, hash)
ANCHOR_KEY = "audit.anchor"          # the last record pruning removed (seq, hash, its outbox row id)


@dataclass(frozen=True)
class ChainCheck:
    """What ``audit verify`` checked: ``mode`` ("full" | "incremental"), the records after ``from_seq``
    (0: from the first kept record), and the walk over them. ``checkpoint``: the mark a successful check
    leaves (None when nothing new was verified)."""

    mode: str
    from_seq: int
    walk: ChainWalk

    @property
    def ok(self) -> bool:
        return self.walk.ok

    @property
    def checkpoint(self) -> Mark | None:
        last = self.walk.last
        return Mark(int(last["seq"]), str(last["hash"])) if self.walk.ok and last is not None else None


@dataclass(frozen=True)
class AuditFilter:
    """Which records a query reads: each given filter must match (``action`` may end with ``*``)."""

    since: float | None = None
    actor: str | None = None
    action: str | None = None
    target: str | None = None

    def sql(self, *, by_seq: bool = False) -> tuple[str, list[object]]:
        """The WHERE terms (each ``AND …``) and their arguments; ``by_seq``: never through the ``audit_at``
        index (a scan from the newest record stops at the first matches; the index would sort them all)."""
        sql, args = "", list[object]()
        if self.since is not None:
            sql, args = sql + (" AND +at >= ?" if by_seq else " AND at >= ?"), args + [self.since]
        if self.actor:  # the whole actor, or its name, sub or client (core.identity.Actor's form)
            a = self.actor.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            sql = sql + (" AND (actor = ? OR actor LIKE ? ESCAPE '\\' OR actor LIKE ? ESCAPE '\\'"
                         " OR actor LIKE ? ESCAPE '\\')")
            args = args + [self.actor, a + " [sub=%", "% [sub=" + a + ", client=%", "%, client=" + a + "]"]
        if self.action:
            if self.action.endswith("*"):
                sql, args = sql + " AND action LIKE ? ESCAPE '\\'", args + [
                    self.action[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"]
            else:
                sql, args = sql + " AND action = ?", args + [self.action]
        if self.target:
            sql, args = sql + " AND target = ?", args + [self.target]
        return sql, args


EVERY = AuditFilter()


class AuditLog(Outbox, Memory):
    """The audit methods of :class:`spotctl.state.store.Store` (marks live in Memory's ``kv`` values)."""

    def audit(self, *, actor: str, action: str, target: str, result: str, inputs: dict | SharedInputs,
              at: float) -> dict:
        """Append a chained audit record and queue it in the outbox (same transaction). ``inputs``: a dict, or
        :class:`~spotctl.state.bulk.SharedInputs` (inputs many records share, encoded once)."""
        from spotctl.state.bulk import AuditRows  # the rows, with one encoding of the inputs

        with self.tx() as c:
            chain = AuditRows(self.region, self.chain_head())
            rec, row, queued = chain.make(actor=actor, action=action, target=target, result=result, inputs=inputs,
                                          at=at)
            c.execute("INSERT INTO audit (id, at, actor, action, target, result, inputs, prev_hash, hash) "
                      "VALUES (?,?,?,?,?,?,?,?,?)", row)
            self.queue_rows([queued])
            self._head = chain.head
        return rec

    #: the chain's head within the current write transaction (None: not read yet in it; see chain_head)
    _head: str | None = None

    def chain_head(self) -> str:
        """The hash the next record chains to, inside a write transaction: the newest record's (the anchor's
        when every record was pruned). Read once per transaction and then kept as records are appended (the
        transaction holds the write lock: no other process appends meanwhile); forgotten when it ends."""
        if self._head is None:
            prev = self.conn.execute("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            self._head = prev[0] if prev else self._anchor_hash()
        return self._head

    def _pre_commit(self) -> None:
        self._head = None
        super()._pre_commit()

    def _rolled_back(self) -> None:
        self._head = None
        super()._rolled_back()

    def _anchor_hash(self) -> str:
        """What the next record chains to when every record was pruned: the anchor's hash."""
        anchor = self.audit_mark(ANCHOR_KEY)
        return anchor.hash if anchor is not None else GENESIS

    def _record(self, r: sqlite3.Row) -> dict:
        return {**dict(r), "inputs": loads(self.path, "audit", r["id"], "inputs", r["inputs"])}

    # -- reading, chunk by chunk --------------------------------------------------------------------

    def iter_audit(self, where: AuditFilter = EVERY, *, after_seq: int = 0, chunk: int = CHUNK) -> Iterator[dict]:
        """Audit records matching ``where`` after ``after_seq``, oldest first, read ``chunk`` at a time (by
        seq: constant memory whatever the history)."""
        cond, args = where.sql()
        after = after_seq
        while True:
            rows = self.conn.execute(f"SELECT * FROM audit WHERE seq > ?{cond} ORDER BY seq LIMIT ?",
                                     [after, *args, chunk]).fetchall()
            for r in rows:
                yield self._record(r)
            if len(rows) < chunk:
                return
            after = rows[-1]["seq"]

    def audit_records(self, limit: int | None = None) -> list[dict]:
        """The oldest ``limit`` records (every record when None: for small chains and tests only —
        :meth:`iter_audit` streams)."""
        return self.audit_query(limit=limit)

    def audit_query(self, *, since: float | None = None, actor: str | None = None, action: str | None = None,
                    target: str | None = None, limit: int | None = None) -> list[dict]:
        """Audit records matching every given filter, oldest first, the oldest ``limit`` when limited
        (``action`` may end with ``*``). A list: :meth:`iter_audit` streams a long history."""
        recs = self.iter_audit(AuditFilter(since, actor, action, target),
                               chunk=min(CHUNK, int(limit)) if limit else CHUNK)
        return list(itertools.islice(recs, int(limit)) if limit else recs)

    def audit_count(self, where: AuditFilter = EVERY, *, after_seq: int = 0) -> int:
        cond, args = where.sql(by_seq=bool(after_seq))
        return int(self.conn.execute(f"SELECT count(*) FROM audit WHERE seq > ?{cond}",
                                     [after_seq, *args]).fetchone()[0])

    def audit_newest_from(self, n: int, where: AuditFilter = EVERY) -> int:
        """The seq before the newest ``n`` matching records (0 when fewer match): ``ORDER BY seq DESC
        LIMIT 1 OFFSET n`` — the newest records are read from the end, not the whole table."""
        cond, args = where.sql(by_seq=True)
        r = self.conn.execute(f"SELECT seq FROM audit WHERE 1=1{cond} ORDER BY seq DESC LIMIT 1 OFFSET ?",
                              [*args, int(n)]).fetchone()
        return int(r[0]) if r else 0

    @contextlib.contextmanager
    def audit_snapshot(self) -> Iterator[None]:
        """One read transaction: every read inside sees the same records (a record appended or pruned
        meanwhile neither shows up half way through a listing nor breaks a walk). Joins a transaction
        already open; write nothing inside it."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")

    def with_delivery(self, records: Iterable[dict], *, newest_first: bool = False) -> Iterator[dict]:
        """Each record with ``delivered_at`` (when the audit service acknowledged its outbox row; None:
        still queued), read by one pass over the audit outbox rows in the records' order (they were
        queued in the transaction that wrote each record, so in seq order): no lookup by key, which
        the outbox has no index for."""
        cursor = _Deliveries(self.conn, newest_first=newest_first, start=self._anchor_outbox_id())
        for rec in records:
            yield {**rec, "delivered_at": cursor.delivered_at(rec)}

    def audit_delivered_at(self, record_id: str) -> float | None:
        """When one record's outbox row was delivered (None: still queued, or never queued)."""
        r = self.conn.execute("SELECT max(delivered_at) FROM outbox WHERE kind='audit' AND key=?",
                              (record_id,)).fetchone()
        return r[0] if r else None

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
        return self._record(rows[0])

    # -- verifying -----------------------------------------------------------------------------------

    def audit_mark(self, key: str) -> Mark | None:
        """The checkpoint or the anchor, checked where it enters: a stored value that is not a mark is a
        StateError naming the key (nothing is verified from a start point that cannot be read)."""
        text = self.get_value(key)
        if text is None:
            return None
        try:
            return Mark.from_text(text)
        except ValueError as e:
            raise StateError(f"state database {self.path}: kv {key!r} is not an audit mark: {e}",
                             hint="`spotctl audit verify --full` does not read the checkpoint" if key == CHECKPOINT_KEY
                             else "the anchor says where pruning cut the chain; restore it from a backup") from None

    def check_audit_chain(self, *, full: bool = False) -> ChainCheck:
        """Walk the chain in one read snapshot, chunk by chunk: ``full`` from the first kept record
        (chained to the pruning anchor, else GENESIS), else from the checkpoint on (whose record must
        still carry the checkpoint's hash). Writes nothing: the caller saves the new checkpoint."""
        with self.audit_snapshot():
            anchor = self.audit_mark(ANCHOR_KEY)
            checkpoint = None if full else self.audit_mark(CHECKPOINT_KEY)
            mode, mark, check_record = verify_start(full=full, checkpoint=checkpoint, anchor=anchor)
            if mark is not None and check_record:
                row = self.conn.execute("SELECT * FROM audit WHERE seq=?", (mark.seq,)).fetchone()
                rec = self._record(row) if row is not None else None
                problem = check_mark_record(rec, mark)
                if problem is not None:
                    bad = rec or {"id": None, "seq": mark.seq, "action": None, "target": None}
                    return ChainCheck(mode, mark.seq, ChainWalk(False, int(rec is not None), bad, problem,
                                                                None, mark.hash))
            after = mark.seq if mark is not None and mode == "incremental" else 0
            w = walk(self.iter_audit(after_seq=after), mark.hash if mark is not None else GENESIS)
            return ChainCheck(mode, mark.seq if mark is not None else 0, w)

    def verify_audit(self) -> tuple[bool, dict | None, int]:
        """Walk the whole kept chain (``--full``); return (ok, first bad record, records checked)."""
        w = self.check_audit_chain(full=True).walk
        return w.ok, (dict(w.first_bad) if w.first_bad is not None else None), w.checked

    def save_audit_checkpoint(self, mark: Mark, at: float) -> str | None:
        """Store the checkpoint of a successful verify; the reason it could not be (a read-only state
        directory, a database another writer holds for more than a second) instead of failing the verify."""
        (busy,) = self.conn.execute("PRAGMA busy_timeout").fetchone()
        self.conn.execute("PRAGMA busy_timeout=1000")  # an optional write: not worth the usual 10 s wait
        try:
            self.set_value(CHECKPOINT_KEY, mark.to_text(), at)
        except StateError as e:
            return e.message
        except sqlite3.Error as e:
            return str(e)
        finally:
            self.conn.execute(f"PRAGMA busy_timeout={int(busy)}")
        return None

    def audit_against(self, remote: Iterable[tuple[str, str]]) -> dict:
        """Compare the service's (id, hash) pairs with the local records that were delivered, in SQL over
        a temporary table (not the main database: read-only use; no dict of the whole history)."""
        c = self.conn
        c.execute("CREATE TEMP TABLE IF NOT EXISTS audit_remote (id TEXT PRIMARY KEY, hash TEXT NOT NULL)")
        c.execute("DELETE FROM temp.audit_remote")
        try:
            batch: list[tuple[str, str]] = []
            for pair in remote:
                batch.append(pair)
                if len(batch) >= 1000:
                    c.executemany("INSERT OR IGNORE INTO temp.audit_remote VALUES (?,?)", batch)
                    batch = []
            c.executemany("INSERT OR IGNORE INTO temp.audit_remote VALUES (?,?)", batch)
            d = ("(SELECT a.seq, a.id, a.hash FROM audit a JOIN (SELECT DISTINCT key FROM outbox WHERE "
                 "delivered_at IS NOT NULL AND kind='audit') o ON o.key = a.id)")
            total = c.execute("SELECT count(*) FROM audit").fetchone()[0]
            checked = c.execute(f"SELECT count(*) FROM {d}").fetchone()[0]
            missing = [r[0] for r in c.execute(f"SELECT d.id FROM {d} d LEFT JOIN temp.audit_remote r ON r.id = d.id "
                                               "WHERE r.id IS NULL ORDER BY d.seq")]
            mismatched = [r[0] for r in c.execute(f"SELECT d.id FROM {d} d JOIN temp.audit_remote r ON r.id = d.id "
                                                  "WHERE r.hash != d.hash ORDER BY d.seq")]
            unknown = c.execute("SELECT count(*) FROM temp.audit_remote r WHERE NOT EXISTS "
                                "(SELECT 1 FROM audit a WHERE a.id = r.id)").fetchone()[0]
        finally:
            c.execute("DELETE FROM temp.audit_remote")
        return {"checked": checked, "pending": total - checked, "missing": missing[:20],
                "missing_count": len(missing), "mismatched": mismatched[:20], "mismatched_count": len(mismatched),
                "unknown_locally": unknown}

    # -- pruning (the retention: a contiguous prefix of acknowledged records) -------------------------

    def prune_audit(self, cutoff_at: float, limit: int, *, dry_run: bool = False) -> int:
        """Delete, oldest first and only as a contiguous prefix, up to ``limit`` records older than
        ``cutoff_at`` whose outbox row the audit service acknowledged (delivered); a record not yet
        delivered, never queued or not past the cutoff stops the prefix and is kept. Their outbox rows
        go in the same transaction, with the anchor (the last pruned record's seq and hash) that
        ``verify --full`` then starts from. Returns how many were (``dry_run``: would be) deleted."""
        if not (isinstance(cutoff_at, (int, float)) and math.isfinite(cutoff_at)):
            raise ValueError(f"cutoff_at must be a finite time, got {cutoff_at!r}")
        if not (type(limit) is int and limit >= 1):
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        if dry_run:
            with self.audit_snapshot():
                return len(self._prunable(cutoff_at, 0, self._anchor_outbox_id(), limit))
        with self.tx() as c:
            pairs = self._prunable(cutoff_at, 0, self._anchor_outbox_id(), limit)
            if not pairs:
                return 0
            last, last_out = pairs[-1]
            c.execute("DELETE FROM audit WHERE seq <= ?", (last["seq"],))
            self._head = None  # (read again: the anchor, when the newest went)
            c.executemany("DELETE FROM outbox WHERE id = ?", [(out["id"],) for _, out in pairs])
            self.set_value(ANCHOR_KEY, Mark(last["seq"], last["hash"], last_out["id"]).to_text(), time.time())
        return len(pairs)

    def audit_prunable(self, cutoff_at: float) -> tuple[int, int]:
        """(records :meth:`prune_audit` would delete now, records older than the cutoff kept because
        they — or one before them — are not acknowledged yet), for a dry-run report: the same prefix
        rule, chunk by chunk (keyset, in one snapshot), then one count on the ``audit_at`` index."""
        with self.audit_snapshot():
            eligible, after_seq, after_oid = 0, 0, self._anchor_outbox_id()
            while True:
                pairs = self._prunable(cutoff_at, after_seq, after_oid, CHUNK)
                eligible += len(pairs)
                if len(pairs) < CHUNK:
                    break
                after_seq, after_oid = pairs[-1][0]["seq"], pairs[-1][1]["id"]
            older = self.conn.execute("SELECT count(*) FROM audit WHERE at < ?", (cutoff_at,)).fetchone()[0]
        return eligible, older - eligible

    def _anchor_outbox_id(self) -> int:
        anchor = self.audit_mark(ANCHOR_KEY)
        return anchor.outbox_id if anchor is not None else 0

    def _prunable(self, cutoff_at: float, after_seq: int, after_oid: int,
                  limit: int) -> list[tuple[sqlite3.Row, sqlite3.Row]]:
        """The (record, outbox row) pairs that continue the prunable prefix after ``after_seq``: records
        and their audit outbox rows are written in the same order (one transaction each), so the prefix
        is where the two, read side by side, stop matching or a record is too new or unacknowledged."""
        recs = self.conn.execute("SELECT seq, id, at, hash FROM audit WHERE seq > ? ORDER BY seq LIMIT ?",
                                 (after_seq, limit)).fetchall()
        outs = self.conn.execute("SELECT id, key, delivered_at FROM outbox WHERE id > ? AND +kind = 'audit' "
                                 "ORDER BY id LIMIT ?", (after_oid, limit)).fetchall()
        pairs = []
        for rec, out in zip(recs, outs, strict=False):
            if not rec["at"] < cutoff_at or out["key"] != rec["id"] or out["delivered_at"] is None:
                break
            pairs.append((rec, out))
        return pairs


class _Deliveries:
    """A cursor over the audit outbox rows in id order (or reverse), matched to records read in the same
    order. A row whose record comes earlier in the walk (or is gone) is skipped; a record whose row is
    not next (never queued, or its row removed) gets None."""

    def __init__(self, conn: sqlite3.Connection, *, newest_first: bool, start: int = 0):
        self.conn, self.newest_first = conn, newest_first
        self.after = 2**63 - 1 if newest_first else start
        self.buf: deque[tuple[int, str, float | None]] = deque()
        self.exhausted = False
        self.size = 64

    def _fill(self) -> bool:
        if self.exhausted:
            return False
        sql = ("SELECT id, key, delivered_at FROM outbox WHERE id < ? AND +kind = 'audit' ORDER BY id DESC LIMIT ?"
               if self.newest_first else
               "SELECT id, key, delivered_at FROM outbox WHERE id > ? AND +kind = 'audit' ORDER BY id LIMIT ?")
        rows = self.conn.execute(sql, (self.after, self.size)).fetchall()
        if len(rows) < self.size:
            self.exhausted = True
        self.size = min(CHUNK, self.size * 4)  # a few rows first (`list --limit 10`), then whole chunks
        if rows:
            self.after = rows[-1][0]
            self.buf.extend((r[0], r[1], r[2]) for r in rows)
        return bool(rows)

    def delivered_at(self, rec: dict) -> float | None:
        while self.buf or self._fill():
            _, key, delivered = self.buf[0]
            if key == rec["id"]:
                self.buf.popleft()
                return delivered
            r = self.conn.execute("SELECT seq FROM audit WHERE id = ?", (key,)).fetchone()
            behind = r is None or (r[0] > rec["seq"] if self.newest_first else r[0] < rec["seq"])
            if not behind:
                return None  # the next row belongs to a record still ahead: this one has none
            self.buf.popleft()
        return None
