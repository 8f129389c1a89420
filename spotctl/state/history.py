"""What ``spotctl report`` reads and no other table keeps, written by each pass where it happens, and the
rows of a report's window read back.

- ``prices``: a pool's rate-card price each time a pass sees it change (one row per change, not per
  pass), so that spend over a window is node time × the price in force, in any region.
- ``waits``: each pending unit (pod or Slurm job) the schedulers report, from its submit time to the
  first pass that no longer sees it pending (``gone_at``): the wait as the reconciler observed it, to the
  pass interval. A unit seen pending again after it left (requeued) starts a new wait. A pass writes
  only the waits that start or end.

Both are bounded: rows older than :data:`KEEP_SECONDS` go as new ones come (by index). Every read here
is bounded by the window through an index (``prices_at`` and the primary key, ``waits_gone``,
``waits_open``, ``transitions_at``, ``nodes_updated``, ``notices_seen``, ``reclaims_at``, ``audit_at``,
``passes_started``), never a scan of the whole history.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping
from itertools import compress
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


#: Ends the open waits of some units, found by the primary key: ``+gone_at`` keeps SQLite from taking
#: ``waits_gone`` for ``gone_at IS NULL``, which walks every open wait for each chunk of units (0.7 s for 10k
#: waits ended among 200k open, 50 ms by the key).
END_WAITS = "UPDATE waits SET gone_at = ? WHERE unit IN ({}) AND +gone_at IS NULL"
END_WAITS_CHUNK = 500  # units per statement


def _open_waits(c: Any, names: list[str]) -> set[str]:
    """The units of the open waits of the schedulers ``names`` (the ``waits_open`` index), read as one text that
    SQLite joins and Python splits rather than one row each (196k open waits: 0.26 -> 0.15 s, every pass). A
    unit id that holds the separator (a newline: no scheduler names a job or pod so) or is not text makes the
    count differ: they are then read row by row."""
    where = (f"FROM waits INDEXED BY waits_open WHERE gone_at IS NULL AND scheduler IN "
             f"({','.join('?' * len(names))})")
    n, text = c.execute(f"SELECT count(*), group_concat(unit, char(10)) {where}", names).fetchone()
    if not n:
        return set()
    ids = text.split("\n") if isinstance(text, str) else []
    if len(ids) == n:
        return set(ids)
    return {r[0] for r in c.execute(f"SELECT unit {where}", names)}


def record_waits(store: StoreBase, units: Iterable[WorkUnit], schedulers: Collection[str], at: float) -> None:
    """This pass's pending units: a unit not waiting yet starts its wait; an open wait of a scheduler that
    was read (``schedulers``) whose unit is no longer pending ends at ``at``. A scheduler that was not read
    this pass ends none of its waits. Writes only what changed: the open waits' ids are read (the
    ``waits_open`` index), not every unit rewritten each pass."""
    names = sorted(schedulers)
    c = store.conn
    open_ids = _open_waits(c, names) if names else set()
    units = units if isinstance(units, list) else list(units)
    ids = [u.id for u in units]  # each unit read once (200k units are 200k cache misses a walk)
    seen = set(ids)
    fresh = seen - open_ids
    new = [(u.id, str(u.scheduler), float(u.submitted_at), at) for u in compress(units, map(fresh.__contains__, ids))
           if math.isfinite(u.submitted_at) and 0 < u.submitted_at <= at] if fresh else []
    ended = sorted(open_ids - seen)
    if not (new or ended):
        return
    new.sort()  # in key order: the B-tree takes them as appends, not at random (200k new waits: 1.45 -> 0.86 s)
    with store.tx() as tx:
        # a unit seen again after its wait ended (requeued) starts a new one
        tx.executemany("INSERT INTO waits (unit, scheduler, submitted_at, first_seen_at) VALUES (?,?,?,?) "
                       "ON CONFLICT(unit) DO UPDATE SET scheduler = excluded.scheduler, "
                       "submitted_at = excluded.submitted_at, first_seen_at = excluded.first_seen_at, gone_at = NULL",
                       new)
        for i in range(0, len(ended), END_WAITS_CHUNK):
            chunk = ended[i:i + END_WAITS_CHUNK]
            tx.execute(END_WAITS.format(",".join("?" * len(chunk))), (at, *chunk))
        tx.execute("DELETE FROM waits WHERE gone_at < ?", (at - KEEP_SECONDS,))


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
        waits += q("SELECT unit, scheduler, submitted_at, first_seen_at, gone_at FROM waits INDEXED BY waits_open "
                   "WHERE gone_at IS NULL AND first_seen_at <= ?", (end,))
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
