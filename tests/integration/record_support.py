"""Shared helpers of the record tests: a region config with [kafka] and [audit], the reference
audit receiver as a real process, and a read_committed consumer that dedupes by CloudEvents id."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

TOKEN = "record-tests-token"

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def region_toml(name: str, *, bootstrap: str, audit_url: str, token_file: Path, kafka_wait: float = 3,
                audit_wait: float = 3, kafka_batch: int = 500, audit_batch: int = 200, seed: int = 3) -> str:
    pools = []
    for i, (pool, az) in enumerate((("gp", "az1"), ("gp2", "az2"))):
        pools.append(f"""
[regions.{name}.pools.{pool}]
kind = "vm"
az = "{az}"
flavor = "spot.gp.8x32"
vcpu = 8
ram_mb = 32768
max_nodes = 12
boot_seconds = {3 + i}
kubernetes = {{labels = {{"spot.pool" = "gp"}}, taints = ["spot=true:NoSchedule"]}}
slurm = {{partition = "spot", features = ["gp"]}}
""")
    return f"""
[regions.{name}]
backend = "sim"
seed = {seed}
budget = {{rate = 5.0, burst = 40}}
policy = {{idle_ttl_seconds = 5}}
{''.join(pools)}
[regions.{name}.kafka]
bootstrap_servers = "{bootstrap}"
max_wait_seconds = {kafka_wait}
batch_size = {kafka_batch}

[regions.{name}.audit]
url = "{audit_url}"
token_file = "{token_file}"
timeout_seconds = 2
max_wait_seconds = {audit_wait}
batch_size = {audit_batch}
"""


class Receiver:
    """`spotctl audit serve` as a real process on a free loopback port."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token_file = tmp / "audit.token"
        self.token_file.write_text(TOKEN + "\n")
        self.db = tmp / "receiver.db"
        self.proc = subprocess.Popen(
            [str(BIN / "spotctl"), "audit", "serve", "--port", str(self.port), "--db", str(self.db),
             "--token-file", str(self.token_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url + "/v1/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"audit receiver died: {self.proc.stderr.read().decode()}")
                time.sleep(0.1)
        raise RuntimeError("audit receiver did not start")

    def records(self, region: str) -> list[dict]:
        out, after = [], 0
        while True:
            req = urllib.request.Request(f"{self.url}/v1/records?region={region}&after={after}&limit=1000",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
            body = json.loads(urllib.request.urlopen(req, timeout=10).read())
            out += body["records"]
            if body["next_after"] is None:
                return out
            after = body["next_after"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def consume(bootstrap: str, topic: str, idle_ms: int = 2500) -> list:
    """Every committed message of a topic (read_committed: aborted transactions stay hidden)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=idle_ms, isolation_level="read_committed",
                      group_id=f"record-tests-{uuid.uuid4().hex[:8]}")
    try:
        return list(c)
    finally:
        c.close()


def dedupe(messages) -> tuple[list[dict], int]:
    """CloudEvents by id, first occurrence kept (what a consumer must do); and how many duplicates."""
    seen: set[str] = set()
    events = []
    dups = 0
    for m in messages:
        ev = json.loads(m.value)
        ev["_key"] = m.key.decode() if m.key else None
        ev["_headers"] = dict(m.headers or [])
        if ev["id"] in seen:
            dups += 1
            continue
        seen.add(ev["id"])
        events.append(ev)
    return events, dups


def per_key(events: list[dict]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ev in events:
        out.setdefault(ev["subject"], []).append(ev["id"])
    return out
