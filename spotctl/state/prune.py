"""Pruning the state database: the rows each table may lose once they are done with, deleted a batch at
a time, and the count of what would go and what stays (and why) for ``spotctl state prune --dry-run``.

Every batch is one short write transaction (``BEGIN IMMEDIATE``, :meth:`StoreBase.tx`) whose ``WHERE``
says again, inside it, what makes a row prunable: a kill -9 at any point leaves the database as the
last committed batch made it, with nothing gone that is still needed. What is never deleted, whatever
its age: a live node and anything of it (its transitions, its notices), an ``intended`` or ``running``
action (resumable state), an undelivered outbox row, a ``running`` pass, the newest plan, and an audit
record the audit service has not acknowledged (that part is :meth:`prune_audit`, in
:mod:`spotctl.state.audit`; audit records take their outbox rows with them). The policy (how old) comes
from the caller: :mod:`spotctl.ops.prune`.
"""

from __future__ import annotations

import json
from typing import Any

from spotctl.core.audit import canonical
from spotctl.core.models import NodeState
from spotctl.state.connection import StoreBase
from spotctl.state.outbox import KINDS

#: The states of a node that is done with; every other state is live.
ENDED = (NodeState.GONE.value, NodeState.FAILED.value, NodeState.LOST.value)
LIVE = tuple(s.value for s in NodeState if s.value not in ENDED)
_LIVE_SQL = ",".join(f"'{s}'" for s in LIVE)  # enum values: fixed words, no input
_ENDED_SQL = ",".join(f"'{s}'" for s in ENDED)
#: A node still acted on: live, or failed with an instance the planner has yet to delete (``plannable``).
_ACTED_ON = f"(n.state IN ({_LIVE_SQL}) OR (n.state = 'failed' AND n.instance_id IS NOT NULL))"
_NOT_LIVE_NODE = f"NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = {{col}} AND {_ACTED_ON})"
_UNDONE_FAILURE = "(state = 'failed' AND instance_id IS NOT NULL)"
#: The outbox kinds pruned on their own (audit records' rows go with their record: :meth:`prune_audit`).
_EVENT_KINDS = ",".join(f"'{k}'" for k in sorted(KINDS - {"audit"}))

#: The tables in the order they are pruned (nodes first: their transitions go with them).
TABLES = ("nodes", "transitions", "reclaims", "actions", "notices", "outbox", "passes", "plans", "audit")

Cursor = tuple[float, int] | None
Step = tuple[dict[str, int], Cursor, bool]  # rows deleted per table, where to go on, whether the table is done
#: kv: the (seq, size of its input) of every recorded plan at the passes' last check, oldest first
PLAN_SIZES_KEY = "prune.plans.sizes"


class Prune(StoreBase):
    """The pruning methods of :class:`spotctl.state.store.Store`."""

    _plan_sizes: list[tuple[int, int]] = []  # the last list read or remembered (set on the instance)

    def prune_rates(self) -> dict[str, float]:
        """Seconds per row of each table's prune batches so far on this store (in this process): the budgeted
        prune of a pass sizes its batches from them (:func:`spotctl.ops.prune.run`)."""
        rates: dict[str, float] | None = self.__dict__.get("_prune_rates")
        if rates is None:
            rates = self.__dict__["_prune_rates"] = {}
        return rates

    def prune_step(self, table: str, limit: int, *, cutoff: float = 0.0, cursor: Cursor = None,
                   keep_rows: int = 500, keep_bytes: int = 64 << 20, cached: bool = False, now: float = 0.0) -> Step:
        """Delete up to ``limit`` prunable rows of ``table`` older than ``cutoff`` (epoch seconds) in one
        transaction. ``cursor``: where the last batch of this run ended (tables scanned past rows they
        keep); ``keep_rows``/``keep_bytes``: the plan history's caps; ``cached`` (the passes): the plans'
        sizes from the last check (kv :data:`PLAN_SIZES_KEY`), only new plans read; ``now``: the time
        stamped on that kv row. Returns (deleted, cursor, done)."""
        if limit < 1:
            raise ValueError(f"batch size must be at least 1, got {limit}")
        if table == "audit":
            # a probe of one record first: a pass that finds nothing acknowledged and due reads two rows, not
            # a batch of records and outbox rows (a region without an audit service never acknowledges any)
            if self.prune_audit(cutoff, 1, dry_run=True) == 0:  # type: ignore[attr-defined]
                return {"audit": 0}, None, True
            n = self.prune_audit(cutoff, limit, dry_run=False)  # type: ignore[attr-defined]
            return {"audit": n}, None, n < limit
        with self.tx() as c:
            if table == "nodes":  # a node takes its transitions along (about five): a fifth of the rows per batch
                limit = max(1, limit // 5)
                ids = [r[0] for r in c.execute(f"SELECT id FROM nodes WHERE {_WHERE['nodes']} LIMIT ?", (cutoff, limit))]
                marks = ",".join("?" * len(ids))
                gone = c.execute(f"DELETE FROM transitions WHERE node_id IN ({marks})", ids).rowcount if ids else 0
                # by id alone (chosen just now, in this transaction): a state term here lets SQLite walk the
                # state index instead of the primary key, 100 ms a batch at 10k nodes
                n = c.execute(f"DELETE FROM nodes WHERE id IN ({marks})", ids).rowcount if ids else 0
                return {"nodes": n, "transitions": gone}, None, len(ids) < limit
            if table in _SCANNED:
                return self._scan_step(c, table, limit, cutoff, cursor)
            # reclaims: by ``at`` on its index (reclaims_at), whatever order they were written in, as the dry run counts
            if table == "plans":
                seqs = self._plans_over(keep_rows, keep_bytes, c=c if cached else None, at=now)[:limit]
                n = c.execute(f"DELETE FROM plans WHERE seq IN ({','.join('?' * len(seqs))})",
                              seqs).rowcount if seqs else 0
                if cached and seqs:
                    self._remember_plan_sizes(c, [r for r in self._plan_sizes if r[0] not in set(seqs)], now)
                return {"plans": n}, None, len(seqs) < limit
            where = _WHERE[table]
            key = _KEY[table]
            n = c.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {where} LIMIT ?)",
                          (cutoff, limit)).rowcount
            return {table: n}, None, n < limit

    def _scan_step(self, c, table: str, limit: int, cutoff: float, cursor: Cursor) -> Step:
        """Transitions and delivered outbox rows, walked on their time index from ``cursor`` (where the last
        batch ended): the rows passed over (a live node's transitions, delivered audit records' rows, which
        go with their record) are not read again."""
        col, index, due = _SCANNED[table]
        after = "" if cursor is None else f" AND ({col}, id) > (?, ?)"
        args: tuple = (cutoff,) + (() if cursor is None else cursor) + (limit,)
        # every row of the range is read once (the mark moves past the kept ones too); the due ones go
        rows = c.execute(f"SELECT {col}, id, {due} FROM {table} INDEXED BY {index} WHERE {col} IS NOT NULL AND "
                         f"{col} < ?{after} ORDER BY {col}, id LIMIT ?", args).fetchall()
        ids = [r[1] for r in rows if r[2]]
        n = c.execute(f"DELETE FROM {table} WHERE id IN ({','.join('?' * len(ids))})", ids).rowcount if ids else 0
        return {table: n}, ((rows[-1][0], rows[-1][1]) if rows else cursor), len(rows) < limit

    def _plans_over(self, keep_rows: int, keep_bytes: int, *, c: Any = None, at: float = 0.0) -> list[int]:
        """The recorded plans beyond the newest ``keep_rows`` or past ``keep_bytes`` of stored input, oldest
        first; the newest plan is always kept. With ``c`` (a write transaction), the sizes come from the
        last check's list in kv where it still holds (its oldest row is the table's oldest): only the
        plans recorded since are read; else, and without ``c``, every plan's size is read."""
        sizes = self._cached_plan_sizes(c) if c is not None else None
        if sizes is None:
            sizes = [(r[0], r[1] or 0) for r in self.conn.execute("SELECT seq, length(input) FROM plans ORDER BY seq")]
            changed = True
        else:
            new = [(r[0], r[1] or 0) for r in c.execute("SELECT seq, length(input) FROM plans WHERE seq > ? ORDER BY seq",
                                                        (sizes[-1][0] if sizes else -1,))]
            changed, sizes = bool(new), sizes + new
        self._plan_sizes = sizes
        if c is not None and changed:
            self._remember_plan_sizes(c, sizes, at)
        over, total = [], 0
        for i, (seq, size) in enumerate(reversed(sizes)):
            total += size
            if i > 0 and (i >= keep_rows or total > keep_bytes):
                over.append(seq)
        return over[::-1]

    def _cached_plan_sizes(self, c: Any) -> list[tuple[int, int]] | None:
        """The kv list of (seq, size) of the plans at the last check, less the plans deleted since from the
        bottom (``record_plan``'s cap); None when it is missing, unreadable or does not start at the oldest plan."""
        r = c.execute("SELECT value FROM kv WHERE key = ?", (PLAN_SIZES_KEY,)).fetchone()
        lo = c.execute("SELECT min(seq) FROM plans").fetchone()[0]
        if r is None:
            return None
        try:
            sizes = [(int(s), int(n)) for s, n in json.loads(r[0])]
        except (ValueError, TypeError):
            return None
        if lo is None:
            return []
        sizes = [x for x in sizes if x[0] >= lo]
        return sizes if sizes and sizes[0][0] == lo else None

    def _remember_plan_sizes(self, c: Any, sizes: list[tuple[int, int]], at: float) -> None:
        self._plan_sizes = sizes
        c.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                  "value = excluded.value, updated_at = excluded.updated_at",
                  (PLAN_SIZES_KEY, json.dumps([list(x) for x in sizes], separators=(",", ":")), at))

    # -- what would go, what stays -------------------------------------------

    def prune_report(self, table: str, *, cutoff: float = 0.0, keep_rows: int = 500, keep_bytes: int = 64 << 20,
                     transitions_cutoff: float = 0.0) -> dict[str, Any]:
        """Rows of ``table``, how many a prune now would delete, and why the others stay:
        ``{"rows", "eligible", "kept", "kept_because": [{"rows": n, "why": "..."}]}``; for nodes also
        ``with_them``: their transitions that go with them, not already due (``transitions_cutoff``). Reads only."""
        q = self.conn.execute
        rows = q(f"SELECT count(*) FROM {table}").fetchone()[0]
        why: list[tuple[int, str]] = []
        if table == "audit":
            eligible, blocked = self.audit_prunable(cutoff)  # type: ignore[attr-defined]
            why.append((blocked, "audit records not acknowledged by the audit service"))
            why.append((rows - eligible - blocked, "audit records within their retention"))
        elif table == "plans":
            eligible = len(self._plans_over(keep_rows, keep_bytes))
            why.append((rows - eligible,
                        f"plans within the newest {keep_rows} and {keep_bytes / (1 << 20):g} MiB of recorded input"))
        else:
            eligible = q(f"SELECT count(*) FROM {table} WHERE {_WHERE[table]}", (cutoff,)).fetchone()[0]
            for count_sql, reason in _KEPT[table]:
                why.append((q(count_sql, (cutoff,) * count_sql.count("?")).fetchone()[0], reason))
        out: dict[str, Any] = {"rows": rows, "eligible": eligible, "kept": rows - eligible,
                               "kept_because": [{"rows": n, "why": w} for n, w in why if n > 0]}
        if table == "nodes":  # their transitions go with them
            out["with_them"] = {"transitions": q(f"SELECT count(*) FROM transitions WHERE at >= ? AND node_id IN "
                                                 f"(SELECT id FROM nodes WHERE {_WHERE['nodes']})",
                                                 (transitions_cutoff, cutoff)).fetchone()[0]}
        return out

    def note_pass(self, seq: int, key: str, value: object) -> None:
        """Add ``key`` to a recorded pass's summary (what the prune after it deleted)."""
        with self.tx() as c:
            r = c.execute("SELECT summary FROM passes WHERE seq=?", (seq,)).fetchone()
            if r is None:
                return
            try:
                summary = json.loads(r[0])
            except ValueError:
                summary = {}
            if not isinstance(summary, dict):
                summary = {}
            summary[key] = value
            c.execute("UPDATE passes SET summary=? WHERE seq=?", (canonical(summary), seq))


# What makes a row prunable, with ``?`` the cutoff (each on an index of schema 5).
_WHERE = {
    "nodes": f"state IN ({_ENDED_SQL}) AND updated_at < ? AND NOT {_UNDONE_FAILURE}",
    "transitions": f"at < ? AND {_NOT_LIVE_NODE.format(col='transitions.node_id')}",
    "reclaims": "at < ?",
    "actions": "updated_at < ? AND status NOT IN ('intended', 'running')",
    "notices": f"first_seen_at < ? AND (node_id IS NULL OR {_NOT_LIVE_NODE.format(col='notices.node_id')})",
    "outbox": f"delivered_at IS NOT NULL AND delivered_at < ? AND kind IN ({_EVENT_KINDS})",
    "passes": "started_at < ? AND status != 'running'",
}
# The tables walked on their time index: (its column, the index, what makes a row of the range due).
_SCANNED = {"transitions": ("at", "transitions_at", _NOT_LIVE_NODE.format(col="transitions.node_id")),
            "outbox": ("delivered_at", "outbox_delivered", f"kind IN ({_EVENT_KINDS})")}
_KEY = {"nodes": "id", "reclaims": "id", "actions": "id", "notices": "id", "outbox": "id", "passes": "seq"}

# Why the rows that stay are kept: (SELECT count(*) ..., the reason), one ``?`` per cutoff.
_KEPT: dict[str, list[tuple[str, str]]] = {
    "nodes": [(f"SELECT count(*) FROM nodes WHERE state IN ({_LIVE_SQL})", "live nodes"),
              (f"SELECT count(*) FROM nodes WHERE {_UNDONE_FAILURE}", "failed nodes whose instance is yet to be deleted"),
              (f"SELECT count(*) FROM nodes WHERE state IN ({_ENDED_SQL}) AND updated_at >= ? AND NOT {_UNDONE_FAILURE}",
               "ended nodes within their retention")],
    "transitions": [(f"SELECT count(*) FROM transitions WHERE NOT {_NOT_LIVE_NODE.format(col='transitions.node_id')}",
                     "transitions of nodes still acted on"),
                    ("SELECT count(*) FROM transitions WHERE at >= ? AND "
                     + _NOT_LIVE_NODE.format(col="transitions.node_id"), "transitions within their retention")],
    "reclaims": [("SELECT count(*) FROM reclaims WHERE at >= ?", "reclaims within their retention")],
    "actions": [("SELECT count(*) FROM actions WHERE status IN ('intended', 'running')",
                 "actions intended or running (resumable)"),
                ("SELECT count(*) FROM actions WHERE status NOT IN ('intended', 'running') AND updated_at >= ?",
                 "finished actions within their retention")],
    "notices": [("SELECT count(*) FROM notices WHERE node_id IS NOT NULL AND NOT "
                 + _NOT_LIVE_NODE.format(col="notices.node_id"), "notices of nodes still acted on"),
                ("SELECT count(*) FROM notices WHERE first_seen_at >= ? AND (node_id IS NULL OR "
                 + _NOT_LIVE_NODE.format(col="notices.node_id") + ")", "notices within their retention")],
    "outbox": [("SELECT count(*) FROM outbox WHERE delivered_at IS NULL", "outbox rows not yet delivered"),
               ("SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL AND kind = 'audit'",
                "delivered audit records' rows (pruned with their audit record)"),
               (f"SELECT count(*) FROM outbox WHERE delivered_at >= ? AND kind IN ({_EVENT_KINDS})",
                "delivered rows within their retention")],
    "passes": [("SELECT count(*) FROM passes WHERE status = 'running'", "passes running"),
               ("SELECT count(*) FROM passes WHERE status != 'running' AND started_at >= ?",
                "passes within their retention")],
}
