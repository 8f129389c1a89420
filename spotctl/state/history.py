"""What ``spotctl report`` reads and no other table keeps, written by each pass where it happens, and the
rows of a report's window read back.

- ``prices``: a pool's rate-card price each time a pass sees it change (one row per change, not per
  pass), so that spend over a window is node time × the price in force, in any region.
- waits: each pending unit (pod or Slurm job) the schedulers report, from its submit time to the
  first pass that no longer sees it pending (``gone_at``): the wait as the reconciler observed it, to the
  pass interval. A unit seen pending again after it left (requeued) starts a new wait. A pass writes
  only the waits that start or end: an open wait is an entry of an ``open_waits`` chunk
  (:class:`WaitChunk`), an ended one a ``waits`` row.

Both are bounded: rows older than :data:`KEEP_SECONDS` go as new ones come (by index). Every read here
is bounded by the window through an index (``prices_at`` and the primary key, ``waits_gone``,
``waits_open`` (the open waits of schema 8, until a pass moves them), ``transitions_at``, ``nodes_updated``,
``notices_seen``, ``reclaims_at``, ``audit_at``, ``passes_started``), never a scan of the whole history; the open
waits are read whole, a few rows per 64k units.
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import and_, eq, gt, le, lt
from typing import Any

from spotctl.core.models import WorkUnit
from spotctl.state.connection import StoreBase
from spotctl.state.dbfile import bad_value, loads
from spotctl.state.prune import ENDED

#: How long price changes and finished waits are kept (a report reaches back this far at most).
KEEP_SECONDS = 35 * 86400


def record_prices(store: StoreBase, prices: Mapping[str, Any], currency: str, at: float) -> int:
    """Record each pool's price where it differs from the last one recorded; returns the rows written."""
    rows = []
    last: dict[str, float] = store.__dict__.setdefault("_last_prices", {})
    for pool, price in sorted(prices.items()):
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
            continue  # the rate card's own check reports it; a price that is not one is not recorded
        if pool not in last:
            r = store.conn.execute("SELECT price FROM prices WHERE pool=? ORDER BY at DESC LIMIT 1", (pool,)).fetchone()
            if r is not None:
                last[pool] = float(r[0])
        if last.get(pool) != float(price):
            rows.append((pool, at, float(price), currency))
    if rows:
        with store.tx() as c:
            c.executemany("INSERT OR REPLACE INTO prices (pool, at, price, currency) VALUES (?,?,?,?)", rows)
            c.execute("DELETE FROM prices WHERE at < ? AND EXISTS (SELECT 1 FROM prices p2 WHERE p2.pool = "
                      "prices.pool AND p2.at > prices.at AND p2.at < ?)", (at - KEEP_SECONDS, at - KEEP_SECONDS))
        for pool, _, price, _ in rows:
            last[pool] = price
    return len(rows)


#: The kv key of the last two rate cards a pass saw (version and prices): consolidation's two ticks.
RATE_CARD_TICKS_KEY = "rate_card_ticks"


def _card(v: Any) -> tuple[str, dict[str, float]] | None:
    """A recorded card (``{"version", "prices"}``) as (version, prices); None when it is not one (a row
    edited by hand, or none): the planner then knows no previous tick, and consolidation waits."""
    if not isinstance(v, dict) or not isinstance(v.get("version"), str) or not isinstance(v.get("prices"), dict):
        return None
    prices: dict[str, float] = {}
    for pool, price in v["prices"].items():
        if not isinstance(pool, str) or isinstance(price, bool) or not isinstance(price, (int, float)) \
                or not math.isfinite(price) or price < 0:
            return None
        prices[pool] = float(price)
    return v["version"], prices


def _ticks(store: StoreBase) -> tuple[tuple[str, dict[str, float]] | None, tuple[str, dict[str, float]] | None]:
    raw = store.get_value(RATE_CARD_TICKS_KEY)  # type: ignore[attr-defined]
    if raw is None:
        return None, None
    try:
        d = json.loads(raw)
    except ValueError:
        return None, None
    if not isinstance(d, dict):
        return None, None
    return _card(d.get("current")), _card(d.get("previous"))


def record_rate_card_tick(store: StoreBase, version: str, prices: Mapping[str, Any], at: float) -> bool:
    """Remember the rate card this pass saw and the one before it (a new version moves the last one back);
    True when the version was new. Prices that are not finite, non-negative numbers are left out."""
    current, _ = _ticks(store)
    if current is not None and current[0] == version:
        return False
    clean = {p: float(v) for p, v in sorted(prices.items()) if not isinstance(v, bool) and isinstance(v, (int, float))
             and math.isfinite(v) and v >= 0}
    value = {"current": {"version": version, "prices": clean},
             "previous": None if current is None else {"version": current[0], "prices": current[1]}}
    store.set_value(RATE_CARD_TICKS_KEY, json.dumps(value, sort_keys=True), at)  # type: ignore[attr-defined]
    return True


def previous_rate_card(store: StoreBase, version: str) -> tuple[str, dict[str, float]] | None:
    """The rate card seen before the one named ``version``: the one recorded before it when this card is
    recorded already (a pass records it before it plans), else the last one recorded (``spotctl plan``
    records nothing). None when no pass has seen another card."""
    current, previous = _ticks(store)
    if current is None:
        return None
    return previous if current[0] == version else current


#: Units per open-wait chunk row, at most: a row is written (and its ``alive`` bytes rewritten) whole, and a few
#: MB at a time at most (a million units in one row made buffers of 30 MB, which left the process holding memory
#: it had freed: glibc's allocator raises its threshold for giving memory back to the largest block freed).
CHUNK_UNITS = 1 << 16
#: Small chunks (under a quarter of CHUNK_UNITS units) of a scheduler, at most, before they are merged: a pass that
#: sees a few new units adds a small chunk, and reading chunks stays a few rows per 64k units whatever the history.
MAX_SMALL_CHUNKS = 16
#: A chunk with fewer than this share of its units still waiting is merged with the new ones (its dead entries
#: would be read and carried for nothing).
MIN_LIVE_SHARE = 0.25
_ENDED = ("INSERT INTO waits (unit, scheduler, submitted_at, first_seen_at, gone_at) VALUES (?,?,?,?,?) "
          "ON CONFLICT(unit) DO UPDATE SET scheduler = excluded.scheduler, submitted_at = excluded.submitted_at, "
          "first_seen_at = excluded.first_seen_at, gone_at = excluded.gone_at")


class WaitChunk:
    """Open waits of one scheduler, as one ``open_waits`` row: the units (their ids one per line, or a JSON
    array when an id holds a newline), their submit and first-seen times (little-endian doubles) and which
    still wait (a byte each). A pass reads every chunk of the schedulers it read, ends the waits of units no
    longer pending (their ``alive`` byte, and a row in ``waits`` with the end), and adds one chunk of the
    units it sees for the first time: the pending units are not written again each pass, nor one row each."""

    __slots__ = ("alive", "first_seen", "id", "live", "scheduler", "submitted", "units")

    def __init__(self, id: int | None, scheduler: str, units: list[str], submitted: Sequence[float],
                 first_seen: Sequence[float], alive: bytearray) -> None:
        self.id, self.scheduler, self.units = id, scheduler, units
        self.submitted, self.first_seen, self.alive = submitted, first_seen, alive
        self.live = alive.count(1)

    @classmethod
    def read(cls, path: Any, row: Any) -> WaitChunk:
        """A chunk from its row, every column checked: a row edited by hand or damaged is named (exit 9)."""
        cid, scheduler, encoding, text, submitted, first_seen, alive = row
        try:
            if encoding == "lines" and isinstance(text, str):
                units = text.split("\n")
            elif encoding == "json" and isinstance(text, str):
                units = json.loads(text)
                if not (isinstance(units, list) and all(isinstance(u, str) for u in units)):
                    raise ValueError
            else:
                raise ValueError
            times = [_doubles(submitted), _doubles(first_seen)]
            if not (isinstance(alive, bytes) and len(alive) == len(units) == len(times[0]) == len(times[1])
                    and alive.strip(b"\x00\x01") == b"" and isinstance(scheduler, str)):
                raise ValueError
            for a in times:  # (a sum is finite when every value is, and is computed in C; only then checked one by one)
                if not math.isfinite(sum(a)) and not all(map(math.isfinite, a)):
                    raise ValueError
        except (ValueError, TypeError):
            raise bad_value(path, "open_waits", cid, "units", f"chunk of {encoding!r}") from None
        return cls(cid, scheduler, units, times[0], times[1], bytearray(alive))

    def row(self) -> tuple[str, str, str, bytes, bytes, bytes]:
        """(scheduler, encoding, units, submitted, first_seen, alive) as the row holds them."""
        text = "\n".join(self.units)
        encoding = "lines"
        if text.count("\n") != len(self.units) - 1:  # an id holds the separator: every id kept as it is
            text, encoding = json.dumps(self.units, ensure_ascii=False), "json"
        return self.scheduler, encoding, text, _packed(self.submitted), _packed(self.first_seen), bytes(self.alive)

    def waiting(self) -> list[int]:
        """The positions of the units that still wait."""
        return list(compress(range(len(self.units)), self.alive))


def _doubles(raw: Any) -> Sequence[float]:
    """Packed little-endian doubles as a sequence of floats: a view of the bytes, not a copy (a million units'
    times are 8 MB a column)."""
    if not isinstance(raw, bytes) or len(raw) % 8:
        raise ValueError
    if sys.byteorder == "little":
        return memoryview(raw).cast("d")
    a = array("d", raw)
    a.byteswap()
    return a


def _packed(a: Sequence[float]) -> bytes:
    if sys.byteorder == "little" and isinstance(a, (array, memoryview)):
        return a.tobytes()
    b = array("d", a)
    if sys.byteorder != "little":
        b.byteswap()
    return b.tobytes()


_CHUNK_COLUMNS = "id, scheduler, encoding, units, submitted, first_seen, alive"


def open_chunks(store: StoreBase, names: Collection[str] | None = None) -> list[WaitChunk]:
    """The open-wait chunks of the schedulers ``names`` (None: every scheduler), oldest first."""
    if names is not None and not names:
        return []
    where = "" if names is None else f" WHERE scheduler IN ({','.join('?' * len(names))})"
    rows = store.conn.execute(f"SELECT {_CHUNK_COLUMNS} FROM open_waits{where} ORDER BY id",
                              sorted(names or ())).fetchall()
    rows.reverse()
    out = []
    while rows:  # each row's text let go once split (a million ids are 13 MB of text beside their list)
        out.append(WaitChunk.read(store.path, rows.pop()))
    return out


def _legacy_open(store: StoreBase, names: list[str]) -> list[tuple[str, str, float, float]]:
    """Waits left open in ``waits`` rows by schema 8 (before chunks), of the schedulers ``names``: (unit,
    scheduler, submitted_at, first_seen_at). Found through the partial ``waits_open`` index, empty once moved."""
    rows = [dict(r) for r in store.conn.execute(
        f"SELECT unit, scheduler, submitted_at, first_seen_at FROM waits INDEXED BY waits_open WHERE gone_at IS NULL "
        f"AND scheduler IN ({','.join('?' * len(names))})", names)]
    _check(store, "waits", rows, "unit", ("submitted_at", "first_seen_at"))
    return [(str(r["unit"]), str(r["scheduler"]), float(r["submitted_at"]), float(r["first_seen_at"])) for r in rows]


def record_waits(store: StoreBase, units: Iterable[WorkUnit], schedulers: Collection[str], at: float) -> None:
    """This pass's pending units: a unit not waiting yet starts its wait; an open wait of a scheduler that
    was read (``schedulers``) whose unit is no longer pending ends at ``at`` (a ``waits`` row). A scheduler
    that was not read this pass ends none of its waits. Writes only what changed: the units seen for the first
    time (one chunk per scheduler), which waits ended; a pass that changes nothing writes nothing."""
    names = sorted(schedulers)
    if not names:
        return
    chunks = open_chunks(store, names)
    legacy = _legacy_open(store, names)
    units = units if isinstance(units, list) else list(units)
    ids = [u.id for u in units]  # each unit read once (200k units are 200k cache misses a walk)
    seen = set(ids)
    ended: list[tuple[str, str, float, float, float]] = []
    touched: list[WaitChunk] = []
    for ch in chunks:
        if not ch.live:
            continue
        gone = list(compress(range(len(ch.units)), map(gt, ch.alive, map(seen.__contains__, ch.units))))
        if gone:
            us, sub, fs, alive = ch.units, ch.submitted, ch.first_seen, ch.alive
            ended += [(us[j], ch.scheduler, sub[j], fs[j], at) for j in gone]
            for j in gone:
                alive[j] = 0
            ch.live -= len(gone)
            touched.append(ch)
    carried = [w for w in legacy if w[0] in seen]  # schema 8's open rows that still wait: into a chunk
    ended += [(*w, at) for w in legacy if w[0] not in seen]
    # what is left of the units seen once those that wait already are taken out: the new ones (in place: a
    # million ids are a 32 MB set, not copied)
    fresh = seen
    for ch in chunks:
        fresh.difference_update(ch.units if ch.live == len(ch.units) else compress(ch.units, ch.alive))
    fresh.difference_update(w[0] for w in carried)
    new: dict[str, tuple[list[str], list[float]]] = {}  # scheduler -> the units first seen now, and their submits
    if fresh:
        mask = list(map(fresh.__contains__, ids))
        f_ids, f_units = list(compress(ids, mask)), list(compress(units, mask))
        if len(f_ids) != len(fresh):  # a unit listed twice: its first listing
            firsts = sorted(dict(zip(reversed(f_ids), reversed(range(len(f_ids))))).values())
            f_ids, f_units = [f_ids[i] for i in firsts], [f_units[i] for i in firsts]
        subs = [u.submitted_at for u in f_units]
        scheds = [u.scheduler for u in f_units]
        del f_units
        ok = list(map(and_, map(lt, repeat(0.0), subs), map(le, subs, repeat(at))))  # (a NaN, an infinity: no)
        kinds = set(scheds)
        for sched in sorted(kinds):
            keep = list(map(and_, ok, map(eq, scheds, repeat(sched)))) if len(kinds) > 1 else ok
            new[str(sched)] = list(compress(f_ids, keep)), list(compress(subs, keep))
    if not (new or ended or legacy):
        return
    with store.tx() as tx:
        if legacy:
            tx.execute(f"DELETE FROM waits WHERE gone_at IS NULL AND scheduler IN ({','.join('?' * len(names))})",
                       names)
        if ended:
            ended.sort()  # in key order: the B-tree takes them as appends, not at random
            tx.executemany(_ENDED, ended)
        _write_chunks(tx, chunks, touched, new, carried, at)
        tx.execute("DELETE FROM waits WHERE gone_at < ?", (at - KEEP_SECONDS,))


def _write_chunks(tx: Any, chunks: list[WaitChunk], touched: list[WaitChunk],
                  new: dict[str, tuple[list[str], list[float]]],
                  carried: list[tuple[str, str, float, float]], at: float) -> None:
    """Write what changed: chunks left with no unit waiting go, those with some units ended get their new
    ``alive`` bytes; new chunks per scheduler for the units first seen (and schema 8's open waits), with the
    units still waiting in chunks mostly ended, and in small ones once a scheduler has more than
    :data:`MAX_SMALL_CHUNKS`; :data:`CHUNK_UNITS` units a chunk at most."""
    merged: set[int | None] = set()  # chunks folded into new ones (deleted there, not updated)
    adds: dict[str, tuple[list[str], array, array]] = {}  # scheduler -> units, submit and first-seen times
    for sched, (us, subs) in new.items():
        adds[sched] = us, array("d", subs), array("d", [at]) * len(us)
    for unit, sched, submitted, first_seen in carried:
        a = adds.setdefault(sched, ([], array("d"), array("d")))
        a[0].append(unit)
        a[1].append(submitted)
        a[2].append(first_seen)
    by_sched: dict[str, list[WaitChunk]] = {}
    for ch in chunks:
        if ch.live:
            by_sched.setdefault(ch.scheduler, []).append(ch)
    for sched in sorted(set(adds) | set(by_sched)):
        have = by_sched.get(sched, [])
        fold = [ch for ch in have if ch.live < MIN_LIVE_SHARE * len(ch.units)]
        small = [ch for ch in have if len(ch.units) < CHUNK_UNITS // 4 and ch.live >= MIN_LIVE_SHARE * len(ch.units)]
        if len(small) + (sched in adds) > MAX_SMALL_CHUNKS:
            fold = sorted(fold + small, key=lambda ch: ch.id or 0)
        if not (fold or sched in adds):
            continue
        us, sub_a, fs_a = adds.get(sched, ([], array("d"), array("d")))
        if fold:  # the units still waiting in the chunks merged, in the order they came, then the new ones
            keep_us, keep_sub, keep_fs = [], array("d"), array("d")
            for ch in fold:
                pos = ch.waiting()
                keep_us += [ch.units[j] for j in pos]
                keep_sub.extend(ch.submitted[j] for j in pos)
                keep_fs.extend(ch.first_seen[j] for j in pos)
            tx.executemany("DELETE FROM open_waits WHERE id = ?", [(ch.id,) for ch in fold])
            merged.update(ch.id for ch in fold)
            us, sub_a, fs_a = keep_us + us, keep_sub + sub_a, keep_fs + fs_a
        for i in range(0, len(us), CHUNK_UNITS):
            part = us[i:i + CHUNK_UNITS]
            chunk = WaitChunk(None, sched, part, sub_a[i:i + CHUNK_UNITS], fs_a[i:i + CHUNK_UNITS],
                              bytearray(b"\x01") * len(part))
            tx.execute("INSERT INTO open_waits (scheduler, encoding, units, submitted, first_seen, alive) "
                       "VALUES (?,?,?,?,?,?)", chunk.row())
    for ch in touched:
        if ch.id in merged:
            continue
        if ch.live:
            tx.execute("UPDATE open_waits SET alive = ? WHERE id = ?", (bytes(ch.alive), ch.id))
        else:
            tx.execute("DELETE FROM open_waits WHERE id = ?", (ch.id,))


def open_wait_rows(store: StoreBase, until: float) -> list[dict]:
    """The waits open now that were first seen by ``until``, as report rows (``gone_at`` None): those in chunks
    and any that schema 8 left in ``waits`` rows (a report before the next pass moves them)."""
    rows = [dict(r) for r in store.conn.execute(
        "SELECT unit, scheduler, submitted_at, first_seen_at, gone_at FROM waits INDEXED BY waits_open "
        "WHERE gone_at IS NULL AND first_seen_at <= ?", (until,))]
    for ch in open_chunks(store):
        us, sub, fs, sched = ch.units, ch.submitted, ch.first_seen, ch.scheduler
        rows += [{"unit": us[j], "scheduler": sched, "submitted_at": sub[j], "first_seen_at": fs[j], "gone_at": None}
                 for j in ch.waiting() if fs[j] <= until]
    return rows


# -- the rows of a report's window --------------------------------------------------------------------


def window_rows(store: StoreBase, start: float, end: float) -> dict[str, list[dict]]:
    """Every row a report over ``[start, end]`` is computed from, read in one snapshot."""
    c = store.conn
    own = not c.in_transaction
    if own:
        c.execute("BEGIN")
    try:
        q = lambda sql, args: [dict(r) for r in c.execute(sql, args)]  # noqa: E731
        ended = ",".join(f"'{s}'" for s in ENDED)
        # nodes up at some time in the window: not ended (live), or ended within or after it; created before its end
        nodes = q(f"SELECT id, pool, state, created_at, updated_at, price FROM nodes WHERE created_at <= ? AND "
                  f"(state NOT IN ({ended}) OR (state IN ({ended}) AND updated_at >= ?)) ORDER BY id", (end, start))
        ids = [n["id"] for n in nodes]
        transitions: list[dict] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            transitions += q(f"SELECT node_id, from_state, to_state, at FROM transitions WHERE node_id IN "
                             f"({','.join('?' * len(chunk))}) ORDER BY id", chunk)
        prices = q("SELECT pool, at, price, currency FROM prices WHERE at > ? AND at <= ? ORDER BY at, pool",
                   (start, end))
        prices += q("SELECT p.pool, p.at, p.price, p.currency FROM prices p WHERE p.at = (SELECT max(at) FROM "
                    "prices WHERE pool = p.pool AND at <= ?)", (start,))
        # waits that ended in the window, and those still open at its end (ended after it, or not yet)
        waits = q("SELECT unit, scheduler, submitted_at, first_seen_at, gone_at FROM waits "
                  "WHERE gone_at >= ? AND first_seen_at <= ?", (start, end))
        waits += open_wait_rows(store, end)
        notices = q("SELECT id, node_id, instance_id, kind, pool, issued_at, deadline, first_seen_at, delivered_at, "
                    "handled_at, reason FROM notices WHERE first_seen_at >= ? AND first_seen_at <= ? "
                    "ORDER BY first_seen_at, id", (start, end))
        reclaims = q("SELECT pool, node_id, at, kind FROM reclaims WHERE at >= ? AND at <= ? ORDER BY at",
                     (start, end))
        audit = q("SELECT seq, at, action, target, result, inputs FROM audit WHERE at >= ? AND at <= ? AND "
                  "action IN ('contract.degraded', 'contract.restored') ORDER BY seq", (start, end))
        for a in audit:
            a["inputs"] = loads(store.path, "audit", a["seq"], "inputs", a["inputs"])
        passes = q("SELECT seq, started_at, finished_at, status FROM passes WHERE started_at >= ? AND "
                   "started_at <= ? ORDER BY seq", (start, end))
        _check(store, "prices", prices, "pool", ("at", "price"))
        _check(store, "waits", waits, "unit", ("submitted_at", "first_seen_at"), optional=("gone_at",))
        _check(store, "nodes", nodes, "id", ("created_at",), optional=("price",))
        _check(store, "transitions", transitions, "node_id", ("at",))
        _check(store, "notices", notices, "id", ("issued_at", "first_seen_at"), optional=("deadline", "delivered_at"))
        return {"nodes": nodes, "transitions": transitions, "prices": prices, "waits": waits, "notices": notices,
                "reclaims": reclaims, "contract_changes": audit, "passes": passes}
    finally:
        if own:
            c.execute("COMMIT")


def _check(store: StoreBase, table: str, rows: list[dict], key: str, required: tuple[str, ...],
           optional: tuple[str, ...] = ()) -> None:
    """The numbers a report computes with are finite numbers (None only where the column may be empty): a
    row edited by hand is named (exit 9), not a traceback half way through the figures."""
    for r in rows:
        for col in required + optional:
            v = r[col]
            if v is None and col in optional:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad_value(store.path, table, r[key], col, v)


def last_recorded(store: StoreBase) -> float | None:
    """When the region's state last recorded a pass (its end): where a report's window ends by default."""
    r = store.conn.execute("SELECT max(finished_at) FROM passes").fetchone()
    return float(r[0]) if r and r[0] is not None else None
