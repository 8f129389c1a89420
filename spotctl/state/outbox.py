"""The outbox: lifecycle events (CloudEvents) and audit records queued in the same transaction as the
state change they describe, for the relays (``spotctl.ops.relay``) to deliver and mark.

Events are CloudEvents 1.0, built and validated by the official ``cloudevents`` SDK
(:func:`cloud_event`, imported lazily) and kept in **structured JSON mode**: a row's payload is the
JSON document the SDK's JSON format writes for the event, in canonical form (sorted keys, no spaces),
which ``spotctl.adapters.kafka`` sends as it is (``content-type: application/cloudevents+json``) and
any CloudEvents consumer reads (``cloudevents.core.bindings.kafka.from_structured_event``). Rows
written before the SDK was used have the same shape and publish unchanged.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spotctl.core.audit import canonical
from spotctl.core.models import Node, NodeState
from spotctl.state.connection import StoreBase

if TYPE_CHECKING:
    from cloudevents.core.v1.event import CloudEvent

    from spotctl.state.bulk import EventRows


def cloud_event(*, source: str, type_: str, subject: str, data: dict[str, Any], at: float,
                extensions: dict[str, str] | None = None) -> CloudEvent:
    """A new CloudEvents 1.0 event (a fresh ``id``; ``data`` as JSON), validated by the SDK. ``extensions``:
    extension attributes (the actor's, :func:`actor_extensions`)."""
    from cloudevents.core.v1.event import CloudEvent

    return CloudEvent({"id": str(uuid.uuid4()), "source": source, "type": type_, "subject": subject,
                       "time": datetime.fromtimestamp(at, tz=UTC), "datacontenttype": "application/json",
                       **(extensions or {})}, data)


def actor_extensions(actor: Any) -> dict[str, str]:
    """Who caused an event, as CloudEvents extension attributes (lower-case letters and digits, as the spec
    wants): ``actor`` (preferred_username), ``actorsub`` (sub), ``actorclient`` (the client id)."""
    if actor is None:
        return {}
    out = {"actor": actor.name}
    if actor.sub:
        out["actorsub"] = actor.sub
    if actor.client:
        out["actorclient"] = actor.client
    return out


def structured(event: CloudEvent) -> dict[str, Any]:
    """The event's structured-mode JSON document (its attributes and ``data``), as the SDK's JSON format
    writes it (``time`` in RFC 3339 with ``Z``); the outbox keeps it as :func:`spotctl.core.audit.canonical`
    JSON."""
    attributes = event.get_attributes()
    time: datetime = attributes["time"]
    return {**attributes, "time": time.isoformat().removesuffix("+00:00") + "Z", "data": event.get_data()}


#: Every kind of outbox row: lifecycle events (for Kafka) and audit records (for the audit service).
KINDS: frozenset[str] = frozenset({"event", "audit"})
_COUNTER = "outbox.pending."  # kv key prefix of a kind's pending counter: "<count> <newest pending id>"


class Outbox(StoreBase):
    """The outbox methods of :class:`spotctl.state.store.Store`.

    **What is queued.** Only the kinds in :attr:`outbox_kinds` (:meth:`queue_kinds`; the wired runtime
    sets the kinds its region has a relay for): a region without a relay for a kind writes no row of it —
    nothing would ever deliver or prune it. Rows written another way through this connection (a bulk
    ``executemany``) are dropped the same way, by a temporary trigger of this connection.

    **Pending counts** cost the same whatever the outbox holds: a counter per kind in ``kv``, changed in
    the transaction that queues or marks rows (a kill -9 leaves it as the rows are), kept with the id of
    the newest pending row it counted. A reader checks that id against the partial index
    ``outbox_undelivered`` (one seek): rows queued or delivered around the counter (another connection, a
    bulk insert) make it stale, and it is counted again on that index (pending rows only, never history)."""

    outbox_kinds: frozenset[str] = KINDS
    _event_rows: EventRows | None = None  # the events' builder (templates per type), made at the first event
    event_actor: Any = None  # who this store's events name (core.identity.Actor), set before the first event
    #: per kind, what this write transaction did to its pending rows: [counter before it, rows added (or
    #: marked: negative), the newest pending id when known, time]; written once, just before the commit
    _tx_counts: dict[str, list] | None = None

    def queue_kinds(self, kinds) -> None:
        """Queue only these kinds from now on (a subset of :data:`KINDS`)."""
        chosen = frozenset(kinds)
        unknown = chosen - KINDS
        if unknown:
            raise ValueError(f"unknown outbox kind(s) {sorted(unknown)}; known: {sorted(KINDS)}")
        self.outbox_kinds = chosen
        self.conn.execute("DROP TRIGGER IF EXISTS temp.outbox_unqueued")
        if chosen != KINDS:  # kinds are fixed words (checked above), never input
            allowed = ",".join(f"'{k}'" for k in sorted(chosen))
            when = f"WHEN new.kind NOT IN ({allowed}) " if allowed else ""
            self.conn.execute(f"CREATE TEMP TRIGGER outbox_unqueued BEFORE INSERT ON main.outbox {when}"
                              "BEGIN SELECT RAISE(IGNORE); END")

    def queues(self, kind: str) -> bool:
        """Whether rows of this kind are queued (a relay is configured for it)."""
        return kind in self.outbox_kinds

    def event(self, node: Node, src: NodeState | None, reason: str, at: float) -> None:
        """The lifecycle event of a node's transition (keyed by node id: per-node order on Kafka)."""
        if "event" not in self.outbox_kinds:
            return
        self.queue_rows([self._events().transition(node, src, node.state, reason, at)])

    def cloud_event(self, type_: str, subject: str, data: dict, at: float, key: str | None = None) -> None:
        """Queue a CloudEvents 1.0 (structured JSON) event in the outbox, in the caller's transaction."""
        if "event" not in self.outbox_kinds:
            return  # not even built: no relay would send it
        kind, _, payload, _ = self._events().event(type_, subject, data, at)
        self.queue_rows([(kind, key or subject, payload, at)])

    def _events(self) -> EventRows:
        """The builder of this store's events: the SDK builds and validates the first of each type, the
        others follow it (:class:`spotctl.state.bulk.EventRows`)."""
        if self._event_rows is None:
            from spotctl.state.bulk import EventRows

            self._event_rows = EventRows(self.region, actor_extensions(self.event_actor))
        return self._event_rows

    def outbox(self, kind: str, key: str, payload: dict, at: float) -> None:
        if kind not in self.outbox_kinds:
            return
        self.queue_rows([(kind, key, canonical(payload), at)])

    def queue_rows(self, rows: list[tuple[str, str, str, float]]) -> None:
        """Queue ready-made rows ``(kind, key, payload JSON, created_at)`` in the caller's transaction (one
        ``executemany``), dropping those of kinds not queued, and count them."""
        rows = [r for r in rows if r[0] in self.outbox_kinds]
        if not rows:
            return
        with self.tx() as c:
            for k in {r[0] for r in rows}:
                self._count_in_tx(k)
            if len(rows) == 1:  # the usual case (one event, one record): its id is the newest pending one
                newest = c.execute("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)",
                                   rows[0]).lastrowid
                self._changed(rows[0][0], 1, rows[0][3], newest)
                return
            c.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)", rows)
            for k in {r[0] for r in rows}:
                self._changed(k, sum(1 for r in rows if r[0] == k), rows[-1][3], None)

    def _count_in_tx(self, kind: str) -> None:
        """Read a kind's counter once per write transaction, before the transaction changes its rows."""
        if self._tx_counts is None:
            self._tx_counts = {}
        if kind not in self._tx_counts:
            self._tx_counts[kind] = [self._counter(kind), 0, None, 0.0]

    def _changed(self, kind: str, delta: int, at: float, newest: int | None) -> None:
        entry = (self._tx_counts or {})[kind]
        entry[1] += delta
        entry[2] = newest if delta > 0 else None  # marking rows delivered may take the newest one
        entry[3] = max(entry[3], at)

    def _pre_commit(self) -> None:
        """Each kind's counter, once per transaction, whatever it queued or marked (one statement, not two a row)."""
        counts, self._tx_counts = self._tx_counts, None
        for kind, (before, delta, newest, at) in (counts or {}).items():
            if delta:
                self._recount(kind, before, delta, at, newest)
        super()._pre_commit()

    def _rolled_back(self) -> None:
        self._tx_counts = None
        super()._rolled_back()

    def outbox_rows(self, kind: str | None = None, pending_only: bool = False) -> list[dict]:
        sql = "SELECT * FROM outbox WHERE 1=1"
        args: list = []
        if kind:
            sql += " AND kind=?"
            args.append(kind)
        if pending_only:
            sql += " AND delivered_at IS NULL"
        return [dict(r) for r in self.conn.execute(sql + " ORDER BY id", args)]

    # -- for the relay ---------------------------------------------------------------

    def pending_batch(self, kind: str, limit: int, after_id: int = 0) -> list[tuple[int, str, str]]:
        """The oldest undelivered outbox rows of a kind, as (id, key, payload), in id order (a range of the
        partial index ``outbox_undelivered``: no sort, no delivered row read)."""
        return [tuple(r) for r in self.conn.execute(
            "SELECT id, key, payload FROM outbox INDEXED BY outbox_undelivered "
            "WHERE kind=? AND delivered_at IS NULL AND id > ? ORDER BY id LIMIT ?",
            (kind, after_id, int(limit)))]

    def mark_delivered(self, ids: list[int], at: float) -> None:
        """Mark outbox rows delivered (called only after the destination acknowledged them); by primary key,
        a chunk at a time, each row's kind counted off its pending counter in the same transaction."""
        with self.tx() as c:
            for k in KINDS:
                self._count_in_tx(k)
            done: dict[str, int] = {}
            for i in range(0, len(ids), 500):
                chunk = [int(x) for x in ids[i:i + 500]]
                for (kind,) in c.execute(f"UPDATE outbox SET delivered_at=? WHERE id IN ({','.join('?' * len(chunk))})"
                                         " AND delivered_at IS NULL RETURNING kind", (at, *chunk)).fetchall():
                    done[kind] = done.get(kind, 0) + 1
            for kind, n in done.items():
                self._changed(kind, -n, at, None)

    def outbox_pending(self, kind: str, *, repair_at: float | None = None) -> tuple[int, float | None]:
        """(undelivered rows of a kind, creation time of the oldest — the first in the queue), in a few index
        seeks whatever the outbox holds (see the class docstring). A counter that is not current is counted
        again on the index of pending rows; with ``repair_at`` (the relay, once a pass) it is also stored, so that rows
        nothing queues any more (a kind whose relay was removed) are not counted again at every pass."""
        counter = self._counter(kind)
        if counter is None and repair_at is not None:
            with self.tx():
                counter = self._counter(kind)
                if counter is None:
                    self._recount(kind, None, 0, repair_at)
                    counter = self._counter(kind)
        n = counter[0] if counter is not None else self._count(kind)
        r = self.conn.execute("SELECT created_at FROM outbox INDEXED BY outbox_undelivered "
                              "WHERE kind=? AND delivered_at IS NULL ORDER BY id LIMIT 1", (kind,)).fetchone()
        return n, (r[0] if r is not None else None)

    def outbox_counter_problems(self) -> list[str]:
        """Pending counters that do not match the rows (for :meth:`Store.full_check`; counts every pending row)."""
        out = []
        for kind in sorted(KINDS):
            counter = self._counter(kind)
            real = self._count(kind)
            if counter is not None and counter[0] != real:
                out.append(f"outbox: the pending counter of {kind!r} says {counter[0]} rows, the outbox holds {real}")
        return out

    def _newest_pending(self, kind: str) -> int:
        r = self.conn.execute("SELECT max(id) FROM outbox INDEXED BY outbox_undelivered "
                              "WHERE kind=? AND delivered_at IS NULL", (kind,)).fetchone()
        return r[0] or 0

    def _count(self, kind: str) -> int:
        return self.conn.execute("SELECT count(*) FROM outbox INDEXED BY outbox_undelivered "
                                 "WHERE kind=? AND delivered_at IS NULL", (kind,)).fetchone()[0]

    def _counter(self, kind: str) -> tuple[int, int] | None:
        """A kind's pending counter (count, newest pending id) if it is current; None when missing, unreadable,
        or stale (the newest pending row is not the one it counted last)."""
        value, current = self.conn.execute(
            "SELECT (SELECT value FROM kv WHERE key=?), (SELECT max(id) FROM outbox INDEXED BY outbox_undelivered "
            "WHERE kind=? AND delivered_at IS NULL)", (_COUNTER + kind, kind)).fetchone()
        parts = value.split(" ") if isinstance(value, str) else []
        if len(parts) != 2 or not all(p.isdigit() and p.isascii() for p in parts):
            return None
        n, newest = int(parts[0]), int(parts[1])
        if newest != (current or 0) or (n == 0) != (newest == 0):
            return None
        return n, newest

    def _recount(self, kind: str, before: tuple[int, int] | None, delta: int, at: float,
                 newest: int | None = None) -> None:
        """Store a kind's counter after this transaction changed its pending rows by ``delta`` (counted again
        on the index when it was not current before); ``newest``: the newest pending id, when known."""
        n = before[0] + delta if before is not None else self._count(kind)
        self.conn.execute("INSERT INTO kv (key, value, updated_at) VALUES (?,?,?) ON CONFLICT(key) DO UPDATE "
                          "SET value=excluded.value, updated_at=excluded.updated_at",
                          (_COUNTER + kind, f"{max(0, n)} {self._newest_pending(kind) if newest is None else newest}",
                           at))
