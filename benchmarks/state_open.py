#!/usr/bin/env python3
"""Opening the state database and counting the outbox, whatever the age of the region (issue 14, items 1, 2).

    .venv/bin/python benchmarks/state_open.py [--quick]

1. ``Store.open`` (the close is not timed: its fsync is disk latency) of a large state database (200 MB of audit records and their outbox
   rows, written straight in with ``executemany``; 40 MB with --quick) against a small one (a fresh
   region with a few records), both closed cleanly, both in the page cache (each opened once before
   timing), interleaved runs in this process (each first half the time); the ratio is of the fastest
   run of each (an open is ~1-2 ms: on a loaded machine its median moves by more than the checks cost;
   the medians are in the detail). Target: large <= 1.2x small. The detail
   also gives what the large open cost before (a ``PRAGMA quick_check`` on every open), measured here.
2. The outbox pending count a pass reads per kind (``Store.outbox_pending``: counter + index seeks)
   with 1M undelivered rows (100k with --quick) against 1k, medians of interleaved calls. Targets:
   <= 1 ms per call at 1M, and 1M <= 1.5x 1k (a few microseconds each: the 1M index is one B-tree
   level deeper, which is what the ratio shows). The detail gives the count on the partial index
   alone (what a stale counter costs, once) and the old ``count(*)`` over the history.
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_OPEN_RATIO = 1.2
TARGET_PENDING_MS = 1.0
TARGET_PENDING_RATIO = 1.5


def _fresh(path: Path, records: int = 20) -> None:
    from spotctl.state.store import Store

    s = Store.open(path, "bench")
    with s.tx():
        for i in range(records):
            s.audit(actor="bench", action="node.launch", target=f"n{i}", result="ok", inputs={"i": i}, at=float(i))
    s.close()


def _grow(path: Path, megabytes: int, *, chunk: int = 20_000) -> int:
    """Audit-like records and their outbox rows (delivered, as a region with a relay has them) until the file
    holds ``megabytes``; the rows written."""
    c = sqlite3.connect(path)
    pad = "x" * 400
    rows = 0
    seq = c.execute("SELECT coalesce(max(seq), 0) FROM audit").fetchone()[0]
    while path.stat().st_size < megabytes * 2**20:
        audit, outbox = [], []
        for i in range(chunk):
            seq += 1
            rid = str(uuid.UUID(int=seq))
            at = 1.7e9 + seq
            audit.append((seq, rid, at, "bench", "node.launch", f"n{seq % 5000}", "ok", f'{{"pad":"{pad}"}}',
                          "0" * 64, "1" * 64))
            outbox.append(("audit", rid, f'{{"id":"{rid}","pad":"{pad}"}}', at, at + 1))
        with c:
            c.executemany("INSERT INTO audit (seq, id, at, actor, action, target, result, inputs, prev_hash, hash) "
                          "VALUES (?,?,?,?,?,?,?,?,?,?)", audit)
            c.executemany("INSERT INTO outbox (kind, key, payload, created_at, delivered_at) VALUES (?,?,?,?,?)", outbox)
        rows += chunk
    c.close()
    return rows


def _open_times(paths: dict[str, Path], runs: int) -> dict[str, list[float]]:
    from spotctl.state.store import Store

    times: dict[str, list[float]] = {k: [] for k in paths}
    for k, p in paths.items():  # warm: both in the page cache, both imported paths hot
        Store.open(p, "bench").close()
    for i in range(runs):
        for k, p in (list(paths.items()) if i % 2 else list(paths.items())[::-1]):  # each goes first half the time
            t0 = time.perf_counter()
            s = Store.open(p, "bench")
            times[k].append(time.perf_counter() - t0)
            s.close()  # not timed: the checkpoint's fsync at close is disk latency, the same at any size
            assert not s.full_checked
    return times


def _quick_check_s(path: Path) -> float:
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    t0 = time.perf_counter()
    c.execute("PRAGMA quick_check").fetchone()
    dt = time.perf_counter() - t0
    c.close()
    return dt


def _pending_db(path: Path, undelivered: int) -> None:
    """A region whose Kafka has been down for a long time: ``undelivered`` event rows queued."""
    from spotctl.state.store import Store

    Store.open(path, "bench").close()
    c = sqlite3.connect(path)
    with c:
        for start in range(0, undelivered, 50_000):
            c.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES ('event', ?, '{}', ?)",
                          [(f"n{i % 5000}", 1.7e9 + i) for i in range(start, min(undelivered, start + 50_000))])
    c.close()
    s = Store.open(path, "bench")
    s.queue_rows([("event", "n0", "{}", 1.8e9)])  # a pass's write: the counter is current from here on
    s.close()


def _median_pending(stores: dict, calls: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in stores}
    for _ in range(calls):
        for k, s in stores.items():
            t0 = time.perf_counter()
            s.outbox_pending("event")
            s.outbox_pending("audit")
            times[k].append((time.perf_counter() - t0) / 2)
    return {k: statistics.median(v) for k, v in times.items()}


def _timed(conn, sql: str) -> float:
    t0 = time.perf_counter()
    conn.execute(sql).fetchone()
    return time.perf_counter() - t0


def bench(quick: bool = False) -> list[dict]:
    from spotctl.state.store import Store

    big_mb = 40 if quick else 200
    many = 100_000 if quick else 1_000_000
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="spotctl-bench-open-") as tmp:
        small, large = Path(tmp) / "small.db", Path(tmp) / "large.db"
        _fresh(small)
        _fresh(large)
        t0 = time.perf_counter()
        n = _grow(large, big_mb)
        gen_s = time.perf_counter() - t0
        times = _open_times({"small": small, "large": large}, 21 if quick else 41)
        low = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        qc = _quick_check_s(large)
        ratio = low["large"] / low["small"]
        rows.append({"name": "Store.open: large DB / small DB", "value": round(ratio, 3), "unit": "x",
                     "target": f"<= {TARGET_OPEN_RATIO}", "pass": ratio <= TARGET_OPEN_RATIO,
                     "detail": f"open {low['large'] * 1000:.2f} ms (median {med['large'] * 1000:.2f}) at "
                               f"{large.stat().st_size / 2**20:.0f} MiB ({n} audit + {n} outbox rows, generated in "
                               f"{gen_s:.1f} s) vs {low['small'] * 1000:.2f} ms (median {med['small'] * 1000:.2f}) at "
                               f"{small.stat().st_size / 2**10:.0f} KiB (fastest of {len(times['small'])} interleaved "
                               f"runs each); the quick_check every open used to run: {qc * 1000:.0f} ms on the large one"})
        large.unlink()

        few_db, many_db = Path(tmp) / "few.db", Path(tmp) / "many.db"
        _pending_db(few_db, 1_000)
        _pending_db(many_db, many)
        stores = {"few": Store.open(few_db, "bench"), "many": Store.open(many_db, "bench")}
        try:
            assert stores["many"].outbox_pending("event")[0] == many + 1
            pm = _median_pending(stores, 200 if quick else 1000)
            c = stores["many"].conn
            index_s = _timed(c, "SELECT count(*) FROM outbox INDEXED BY outbox_undelivered "
                                "WHERE kind='event' AND delivered_at IS NULL")
            old_s = _timed(c, "SELECT count(*), min(created_at) FROM outbox NOT INDEXED "
                              "WHERE kind='event' AND delivered_at IS NULL")
        finally:
            for s in stores.values():
                s.close()
        pratio = pm["many"] / pm["few"]
        detail = (f"{pm['many'] * 1e6:.1f} us per kind at {many} pending vs {pm['few'] * 1e6:.1f} us at 1000 "
                  f"(medians); counted on the partial index instead (a stale counter, once): {index_s * 1000:.1f} ms; "
                  f"the old count over the table: {old_s * 1000:.1f} ms")
        rows.append({"name": f"outbox pending per kind per pass at {many // 1000}k pending", "value":
                     round(pm["many"] * 1000, 4), "unit": "ms", "target": f"<= {TARGET_PENDING_MS}",
                     "pass": pm["many"] * 1000 <= TARGET_PENDING_MS, "detail": detail})
        rows.append({"name": f"outbox pending: {many // 1000}k pending / 1k pending", "value": round(pratio, 3),
                     "unit": "x", "target": f"<= {TARGET_PENDING_RATIO}", "pass": pratio <= TARGET_PENDING_RATIO,
                     "detail": detail})
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rows

    sys.exit(_rows.main(bench, __doc__))
