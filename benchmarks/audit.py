#!/usr/bin/env python3
"""`spotctl audit verify|list` over a long history: constant memory, incremental verify, --limit in SQL.

    .venv/bin/python benchmarks/audit.py [--quick]

Writes 1M chained audit records (100k with --quick), each queued in the outbox as the store queues
it (same payload, interleaved with one lifecycle event per record), straight into a fresh state
database with ``executemany``; then times whole CLI calls in subprocesses (``spotctl --state-db``)
and reads each child's peak RSS (``resource.getrusage(RUSAGE_CHILDREN)`` of a fresh runner per call).

Targets (issue 14, item 4): ``audit verify --full`` and ``audit list -o json`` over every record
<= 100 MiB peak RSS; incremental ``audit verify`` right after a full one <= 1 s; ``audit list
--limit 10`` <= 0.5 s (the median of three calls). For scale, the same run times ``spotctl audit
--help`` (start-up alone): the figures above it are what the history costs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPOTCTL = ROOT / ".venv" / "bin" / "spotctl"
TARGET_RSS_MIB = 100.0
TARGET_INCREMENTAL_S = 1.0
TARGET_LIST_LIMIT_S = 0.5


def generate(path: Path, n: int, *, chunk: int = 20_000) -> None:
    """``n`` chained audit records (and their outbox rows) written directly, as ``Store.audit`` writes them."""
    from spotctl.core.audit import GENESIS, audit_hash, canonical
    from spotctl.state.store import Store

    Store.open(path, "demo").close()
    import sqlite3

    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA synchronous=OFF")
    prev, at0 = GENESIS, 1767571200.0
    for start in range(0, n, chunk):
        audit_rows, outbox_rows = [], []
        for i in range(start, min(n, start + chunk)):
            at = at0 + i * 3.0
            rec = {"id": str(uuid.UUID(int=i + 1, version=4)), "at": at, "actor": "svc:spot-reconciler",
                   "action": ("node.launch", "node.drain", "node.delete")[i % 3], "target": f"spot-gp-az1-{i:08x}",
                   "result": "ok", "inputs": {"pool": "gp-az1", "plan": f"p-{i // 50}", "budget_tokens": i % 7}}
            h = audit_hash(rec, prev)
            audit_rows.append((i + 1, rec["id"], at, rec["actor"], rec["action"], rec["target"], rec["result"],
                               canonical(rec["inputs"]), prev, h))
            outbox_rows.append(("audit", rec["id"], canonical({**rec, "prev_hash": prev, "hash": h,
                                                               "region": "demo"}), at))
            outbox_rows.append(("event", rec["target"], canonical({"type": "spot.node.launching",
                                                                   "subject": rec["target"]}), at))
            prev = h
        c.execute("BEGIN")
        c.executemany("INSERT INTO audit (seq, id, at, actor, action, target, result, inputs, prev_hash, hash) "
                      "VALUES (?,?,?,?,?,?,?,?,?,?)", audit_rows)
        c.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)", outbox_rows)
        c.execute("COMMIT")
    c.close()


def run(args: list[str], env: dict[str, str], *, keep: bool = True) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MiB, exit code, stdout) of one CLI call, measured by a fresh runner (stdout
    to /dev/null when not ``keep``)."""
    code = (
        "import resource, subprocess, sys, time, json\n"
        "out = subprocess.PIPE if sys.argv[1] == 'keep' else subprocess.DEVNULL\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.PIPE)\n"
        "dt = time.perf_counter() - t\n"
        "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps({'s': dt, 'rss': ru.ru_maxrss / 1024, 'rc': p.returncode,\n"
        "                  'out': (p.stdout or b'').decode(errors='replace'),\n"
        "                  'err': p.stderr[-2000:].decode(errors='replace')}))\n")
    p = subprocess.run([sys.executable, "-c", code, "keep" if keep else "drop", str(SPOTCTL), *args], env=env,
                       capture_output=True, text=True, check=True)
    d = json.loads(p.stdout)
    if d["rc"] not in (0,):
        print(f"spotctl {' '.join(args)}: exit {d['rc']}: {d['err']}", file=sys.stderr)
    return d["s"], d["rss"], d["rc"], d["out"]


def median_of(k: int, args: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """The run with the median time of ``k`` (a short call on a shared machine: one slow start is noise)."""
    runs = sorted((run(args, env) for _ in range(k)), key=lambda r: r[0])
    return runs[k // 2]


def bench(quick: bool = False) -> list[dict]:
    n = 100_000 if quick else 1_000_000
    with tempfile.TemporaryDirectory(prefix="spotctl-bench-audit-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
        env.update(XDG_STATE_HOME=f"{tmp}/state", XDG_CONFIG_HOME=f"{tmp}/config", HOME=tmp, NO_COLOR="1")
        db = Path(tmp) / "audit.db"
        t0 = time.perf_counter()
        generate(db, n)
        gen_s = time.perf_counter() - t0
        size_mib = db.stat().st_size / 2**20
        base_s, base_rss, _, _ = median_of(3, ["audit", "--help"], env)
        full_s, full_rss, full_rc, full_out = run(["-o", "json", "audit", "verify", "--full", "--state-db", str(db)],
                                                  env)
        full = json.loads(full_out)["data"] if full_rc == 0 else {}
        inc_s, inc_rss, inc_rc, inc_out = median_of(3, ["-o", "json", "audit", "verify", "--state-db", str(db)], env)
        inc = json.loads(inc_out)["data"] if inc_rc == 0 else {}
        lim_s, lim_rss, lim_rc, lim_out = median_of(3, ["-o", "json", "audit", "list", "--limit", "10",
                                                        "--state-db", str(db)], env)
        lim = json.loads(lim_out)["data"] if lim_rc == 0 else {}
        all_s, all_rss, all_rc, _ = run(["-o", "json", "audit", "list", "--state-db", str(db)], env, keep=False)
    common = f"{n:,} records, DB {size_mib:.0f} MiB written in {gen_s:.1f} s; `audit --help` {base_s:.2f} s {base_rss:.0f} MiB"
    full_ok = full_rc == 0 and full.get("ok") is True and full.get("records") == n and full.get("mode") == "full"
    inc_ok = inc_rc == 0 and inc.get("ok") is True and inc.get("mode") == "incremental" and inc.get("from_seq") == n
    lim_ok = lim_rc == 0 and [r["seq"] for r in lim.get("records", [])] == list(range(n - 9, n + 1))
    return [
        {"name": "audit verify --full peak RSS", "value": round(full_rss, 1), "unit": "MiB",
         "target": f"<= {TARGET_RSS_MIB:g}", "pass": full_ok and full_rss <= TARGET_RSS_MIB,
         "detail": f"{full_s:.2f} s, exit {full_rc}, checked {full.get('records')}; {common}"},
        {"name": "audit verify (incremental, after --full)", "value": round(inc_s, 3), "unit": "s",
         "target": f"<= {TARGET_INCREMENTAL_S:g}", "pass": inc_ok and inc_s <= TARGET_INCREMENTAL_S,
         "detail": f"{inc_rss:.0f} MiB, exit {inc_rc}, mode {inc.get('mode')} from seq {inc.get('from_seq')}, "
                   f"checked {inc.get('records')}; full walk {full_s:.2f} s; {common}"},
        {"name": "audit list --limit 10", "value": round(lim_s, 3), "unit": "s",
         "target": f"<= {TARGET_LIST_LIMIT_S:g}", "pass": lim_ok and lim_s <= TARGET_LIST_LIMIT_S,
         "detail": f"{lim_rss:.0f} MiB, exit {lim_rc}, {len(lim.get('records', []))} newest records; {common}"},
        {"name": "audit list -o json (every record) peak RSS", "value": round(all_rss, 1), "unit": "MiB",
         "target": f"<= {TARGET_RSS_MIB:g}", "pass": all_rc == 0 and all_rss <= TARGET_RSS_MIB,
         "detail": f"{all_s:.2f} s, exit {all_rc}; {common}"},
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rows

    sys.exit(_rows.main(bench, __doc__))
