#!/usr/bin/env python3
"""Relay throughput: outbox → Kafka, against a raw kafka-python producer in the same run.

    scripts/testenv/kafka up
    .venv/bin/python benchmarks/relay.py [--events 100000] [--json]

Fills a state database with N lifecycle events (CloudEvents JSON, 200 node
keys), then relays them with ``spotctl.ops.relay`` and ``KafkaRelay``
(acks=all, idempotent, one transaction per 500-event batch, each batch marked
delivered in SQLite after the commit). The baseline sends the same records
with a bare kafka-python producer (acks=all, idempotent, no transactions, no
database). Memory: RSS sampled after every tenth of the relay.

Targets: >= 5,000 events/s; RSS growth from the first to the last tenth <= 16 MiB.
"""

from __future__ import annotations

import argparse
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

TARGET_RATE = 5000.0
TARGET_RSS_GROWTH_MIB = 16.0


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def bootstrap() -> str:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"]
    p = subprocess.run([str(ROOT / "scripts" / "testenv" / "kafka"), "env"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("benchmarks/relay.py: no broker; run `scripts/testenv/kafka up` (or set KAFKA_BOOTSTRAP)")
    for line in p.stdout.splitlines():
        if "KAFKA_BOOTSTRAP=" in line:
            return line.split("=", 1)[1].strip()
    sys.exit("benchmarks/relay.py: cannot read KAFKA_BOOTSTRAP")


def _fill(store, n: int) -> None:
    from spotctl.core.audit import canonical
    from spotctl.state.store import iso

    t0 = 1767571200.0
    states = ["intended", "building", "active", "draining", "deleting", "gone"]
    step = 5000
    for start in range(0, n, step):
        with store.tx() as c:
            rows = []
            for i in range(start, min(n, start + step)):
                node = f"spot-gp-{i % 200:04d}"
                ev = {"specversion": "1.0", "id": str(uuid.uuid4()), "source": f"spotctl/{store.region}",
                      "type": f"io.spotctl.node.{states[i % 6]}", "subject": node, "time": iso(t0 + i),
                      "datacontenttype": "application/json",
                      "data": {"node": node, "pool": "gp-az1", "from": states[(i - 1) % 6], "to": states[i % 6],
                               "reason": "benchmark", "instance_id": str(uuid.UUID(int=i)), "action_id": f"a{i}"}}
                rows.append(("event", node, canonical(ev), t0 + i))
            c.executemany("INSERT INTO outbox (kind, key, payload, created_at) VALUES (?,?,?,?)", rows)


def bench(events: int = 100_000) -> dict:
    """Run both and return the figures (also used by benchmarks/run.py-style callers)."""
    from kafka import KafkaProducer

    from spotctl.adapters.kafka import KafkaRelay
    from spotctl.ops.relay import relay
    from spotctl.state.store import Store

    bs = bootstrap()
    with tempfile.TemporaryDirectory(prefix="spotctl-bench-relay-") as tmp:
        store = Store.open(Path(tmp) / "bench.db", "bench")
        _fill(store, events)
        rows = [(k.encode(), p.encode()) for _, k, p in store.pending_batch("event", events)]

        # baseline: a bare kafka-python producer sending the same records
        topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
        p = KafkaProducer(bootstrap_servers=bs, acks="all", enable_idempotence=True, linger_ms=5,
                          batch_size=256 * 1024)
        p.send(topic, key=b"warm", value=b"{}").get(30)
        t0 = time.perf_counter()
        for k, v in rows:
            p.send(topic, key=k, value=v)
        p.flush()
        raw_s = time.perf_counter() - t0
        p.close()
        del rows

        # the relay: outbox → KafkaRelay, transactions, marks in SQLite
        relay_out = KafkaRelay(bootstrap_servers=bs, topic=f"bench-relay-{uuid.uuid4().hex[:8]}",
                               client_id="spotctl-bench", max_wait_seconds=30)
        relay_out.deliver([("warm", "{}")])
        tenth = max(1, events // 10)
        samples = []
        delivered = 0
        t0 = time.perf_counter()
        while True:
            r = relay(store, {"kafka": relay_out}, now=time.time, max_rows=tenth)
            if r.failed:
                raise SystemExit(f"relay failed: {r.failed}")
            delivered += r.kinds["event"].delivered
            samples.append(round(rss_mib(), 1))
            if r.kinds["event"].pending == 0:
                break
        relay_s = time.perf_counter() - t0
        relay_out.close()
        store.close()
    rate = delivered / relay_s
    raw_rate = events / raw_s
    growth = samples[-1] - samples[0]
    return {
        "events": events, "delivered": delivered, "transactional": relay_out.transactional,
        "relay_seconds": round(relay_s, 2), "relay_events_per_s": round(rate),
        "raw_seconds": round(raw_s, 2), "raw_events_per_s": round(raw_rate),
        "ratio_relay_to_raw": round(rate / raw_rate, 3),
        "rss_mib_per_tenth": samples, "rss_growth_mib": round(growth, 1),
        "target_events_per_s": TARGET_RATE, "target_rss_growth_mib": TARGET_RSS_GROWTH_MIB,
        "ok": delivered == events and rate >= TARGET_RATE and growth <= TARGET_RSS_GROWTH_MIB,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    r = bench(args.events)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"relay  {r['delivered']:>7} events in {r['relay_seconds']:>6}s = {r['relay_events_per_s']:>6}/s "
              f"(transactional: {r['transactional']}; target >= {TARGET_RATE:.0f}/s)")
        print(f"raw    {r['events']:>7} events in {r['raw_seconds']:>6}s = {r['raw_events_per_s']:>6}/s")
        print(f"ratio  relay / raw producer = {r['ratio_relay_to_raw']}")
        print(f"memory RSS per tenth (MiB): {r['rss_mib_per_tenth']}; growth {r['rss_growth_mib']} MiB "
              f"(target <= {TARGET_RSS_GROWTH_MIB:.0f})")
        print("OK" if r["ok"] else "BELOW TARGET")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
