"""Shared helpers of the record tests: a region config with [kafka] and [audit], the reference
audit receiver as a real process, a read_committed consumer that dedupes by CloudEvents id, and a
Kafka-wire proxy that makes the test broker look like one without transactions."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
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
                kafka_batch: int = 500, audit_batch: int = 200, seed: int = 3) -> str:
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


def consume(bootstrap: str, topic: str, idle_ms: int = 2500, isolation: str = "read_committed") -> list:
    """Every committed message of a topic (read_committed: aborted and open transactions stay hidden);
    ``isolation="read_uncommitted"`` shows every record in the log, aborted ones included."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=idle_ms, isolation_level=isolation,
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


def dedupe_checked(messages) -> tuple[list[dict], int]:
    """:func:`dedupe`, and check that dropping by id is safe: every duplicate is byte-identical to the
    first copy and carries the same key (a re-sent event, never a different event under a reused id)."""
    first: dict[str, tuple] = {}
    for m in messages:
        ev_id = json.loads(m.value)["id"]
        seen = first.setdefault(ev_id, (m.key, m.value))
        assert seen == (m.key, m.value), f"event {ev_id}: a 'duplicate' that differs from the first copy"
    events, dups = dedupe(messages)
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids))  # 0 duplicates left after the consumer-side dedupe
    return events, dups


# -- a broker without transactions ---------------------------------------------------------------

#: Kafka API keys of the transaction protocol (KIP-98): AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
#: TxnOffsetCommit. InitProducerId (22) stays: the broker still offers idempotent producers.
TXN_API_KEYS = frozenset({24, 25, 26, 28})
API_VERSIONS = 18


def _uvarint(buf: bytes, i: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def _put_uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _skip_tags(buf: bytes, i: int) -> int:
    n, i = _uvarint(buf, i)
    for _ in range(n):
        _, i = _uvarint(buf, i)
        size, i = _uvarint(buf, i)
        i += size
    return i


def without_api_keys(body: bytes, version: int, hide: frozenset[int]) -> bytes:
    """An ApiVersions response body (after the correlation id) with the ``hide`` API keys removed."""
    if struct.unpack_from(">h", body, 0)[0] != 0:  # an error (UNSUPPORTED_VERSION) comes as a v0 body: as is
        return body
    kept = []
    if version >= 3:  # flexible: compact array, per-entry tagged fields
        n, j = _uvarint(body, 2)
        for _ in range(max(n - 1, 0)):
            start = j
            key = struct.unpack_from(">h", body, j)[0]
            j = _skip_tags(body, j + 6)
            if key not in hide:
                kept.append(body[start:j])
        return body[:2] + _put_uvarint(len(kept) + 1) + b"".join(kept) + body[j:]
    n = struct.unpack_from(">i", body, 2)[0]
    j = 6
    for _ in range(max(n, 0)):
        if struct.unpack_from(">h", body, j)[0] not in hide:
            kept.append(body[j:j + 6])
        j += 6
    return body[:2] + struct.pack(">i", len(kept)) + b"".join(kept) + body[j:]


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


class NoTransactionsBroker:
    """The test broker seen through a loopback proxy that hides the transaction APIs.

    Every Kafka frame is forwarded unchanged except two: ApiVersions responses lose the API keys in
    :data:`TXN_API_KEYS` (so a client sees a broker that offers idempotence but no transactions, like
    a Kafka-compatible service without a transaction coordinator), and the broker's own address in
    Metadata/FindCoordinator responses is replaced by the proxy's, so that clients stay on the proxy.
    The address is rewritten in place (same host, a 4-byte port), so no frame changes length.
    """

    def __init__(self, upstream: str, hide: frozenset[int] = TXN_API_KEYS):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.hide = hide
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._old = host.encode() + struct.pack(">i", int(port))
        self._new = host.encode() + struct.pack(">i", self.port)
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="no-txn-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                return
            self._socks += [client, upstream]
            versions: dict[int, int] = {}  # correlation id -> ApiVersions request version
            threading.Thread(target=self._requests, args=(client, upstream, versions), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, versions), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, versions: dict[int, int]) -> None:
        try:
            while True:
                size = _read_exactly(src, 4)
                frame = _read_exactly(src, struct.unpack(">i", size)[0])
                key, version, corr = struct.unpack_from(">hhi", frame, 0)
                if key == API_VERSIONS:
                    versions[corr] = version
                dst.sendall(size + frame)
        except (EOFError, OSError):
            pass
        finally:
            _shut(src, dst)

    def _responses(self, src: socket.socket, dst: socket.socket, versions: dict[int, int]) -> None:
        try:
            while True:
                frame = _read_exactly(src, struct.unpack(">i", _read_exactly(src, 4))[0])
                corr = struct.unpack_from(">i", frame, 0)[0]
                if corr in versions:  # ApiVersions responses have no tagged header fields
                    frame = frame[:4] + without_api_keys(frame[4:], versions.pop(corr), self.hide)
                else:
                    frame = frame.replace(self._old, self._new)
                dst.sendall(struct.pack(">i", len(frame)) + frame)
        except (EOFError, OSError):
            pass
        finally:
            _shut(src, dst)

    def close(self) -> None:
        self.listener.close()
        _shut(*self._socks)


def _shut(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass
