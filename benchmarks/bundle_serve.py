#!/usr/bin/env python3
"""`spotctl bundle serve` under 1,000 node agents (issue 16): p99 of 304 answers and of full fetches of a
1 MiB bundle over mutual TLS on loopback, and the server's CPU.

    make bench-services   (or: .venv/bin/python benchmarks/bundle_serve.py [--quick] [--json])

Set-up (in a temporary directory, removed afterwards; XDG homes pointed there too): a test PKI
(tests/pki.py) with a server SVID, the contract pipeline's SVID and one distinct SVID per agent
(``spiffe://example.org/agent/node-N``); an Ed25519 signing key; a bundle of region ``demo`` built here with
``spotctl.bundles.archive.pack`` whose ``files/padding.json`` is a JSON list of random hex strings, sized
so that the gzip'd bundle is 1 MiB (created now, expires in a day), signed. The server runs as a user runs
it (the ``spotctl`` executable, ``bundle serve``, stopped with SIGTERM); the bundle is published to it with
``spotctl bundle publish`` and the pipeline's SVID.

Load: a second process (asyncio + aiohttp client). Each logical agent has its own SVID, its own TLS context
and its own keep-alive connection (one aiohttp session with a single-connection connector), and polls
every PERIOD seconds with If-None-Match, the agents' offsets spread uniformly over the period. Real time,
not compressed: 1,000 agents every 30 s is ~33 requests/s. The first round (one period) is the warm-up:
each agent opens its connection (the TLS handshake) and polls once; it is reported apart, not in the
targets. Then ROUNDS measured rounds. The ~1 % of polls that fetch the whole bundle: each measured poll
sends, with probability 1 % (seeded), a stale ETag (a bundle changed since that agent's last poll); the
others send the current one and get a 304. (No publish during the measured window: a real publish makes
every agent fetch within one period, which is a 100 % mix for 30 s, not the steady state measured here.)
Latency: client side, from the request to the last byte of the body; a 200 must be the served bytes
(size and SHA-256 = its ETag), a 304 must carry the current ETag; anything else, a timeout or an
exception is an error (any error fails both latency rows).

CPU: the server process's utime + stime (``/proc/PID/stat``, all threads) over the measured window, per
second of wall time, scaled to 1,000 agents polling every 30 s by the request rate actually served
(``--quick`` serves the same ~33 requests/s with 100 agents polling every 3 s).

The machine may be small and shared: the load generator runs on the same cores as the server, and the
load average at the start is in the detail.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PY = sys.executable
BIN = Path(PY).parent
TD = "spiffe://example.org"
REGION = "demo"
TARGET_MS = 50.0
BUNDLE_SIZE = 1024 * 1024
STALE_FRACTION = 0.01
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: The load generator, run as a second process: reads its config (JSON) from argv[1], writes its results
#: (JSON) to argv[2]; prints "measure" on stdout when the warm-up round ends and "done" at the end.
LOADGEN = r'''
import asyncio, hashlib, json, random, ssl, sys, time
import aiohttp

cfg = json.load(open(sys.argv[1]))
N, PERIOD, ROUNDS = cfg["agents"], cfg["period"], cfg["rounds"]
URL, CURRENT, STALE, SIZE = cfg["url"], cfg["etag"], cfg["stale_etag"], cfg["size"]
rng = random.Random(16)
lat = {"304": [], "200": []}
warm = {"304": [], "200": []}
errors = []
lag = []


def ctx_of(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cfg["trust_bundle"])
    return ctx


async def poll(session, etag, into):
    t0 = time.perf_counter()
    async with session.get(URL, headers={"If-None-Match": etag}) as r:
        body = await r.read()
        dt = time.perf_counter() - t0
        got = r.headers.get("ETag")
        status = r.status
    if status == 304 and got == CURRENT and not body:
        into["304"].append(dt)
    elif status == 200 and len(body) == SIZE and got == CURRENT \
            and f'"{hashlib.sha256(body).hexdigest()}"' == got:
        into["200"].append(dt)
    else:
        errors.append(f"status {status}, ETag {got}, {len(body)} bytes")


async def agent(i, cert, key, t0):
    offset = PERIOD * (i + rng.random()) / N
    stale = [rng.random() < cfg["stale_fraction"] for _ in range(ROUNDS)]
    conn = aiohttp.TCPConnector(ssl=ctx_of(cert, key), limit=1, keepalive_timeout=PERIOD * 4)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=10)) as s:
        for k in range(ROUNDS + 1):
            at = t0 + k * PERIOD + offset
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            late = time.perf_counter() - at
            if k:
                lag.append(late)
            try:
                await poll(s, STALE if k and stale[k - 1] else CURRENT, lat if k else warm)
            except Exception as e:  # a timeout, a reset, a handshake that failed: an error, counted
                errors.append(f"{type(e).__name__}: {e}"[:200])


def cpu():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / cfg["clk_tck"]


async def main():
    t0 = time.perf_counter() + 0.5
    tasks = [asyncio.create_task(agent(i, c, k, t0)) for i, (c, k) in enumerate(cfg["svids"])]
    await asyncio.sleep(max(0.0, t0 + PERIOD - time.perf_counter()))
    c0 = cpu()
    print("measure", flush=True)
    m0 = time.perf_counter()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - m0
    print("done", flush=True)
    json.dump({"lat": lat, "warm": warm, "errors": errors, "lag": lag, "wall": wall,
               "client_cpu": (cpu() - c0) / wall}, open(sys.argv[2], "w"))

asyncio.run(main())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def big_bundle(key, created: int, revision: int = 1) -> bytes:
    """A signed bundle of region demo whose gzip'd bytes are ~1 MiB: files/padding.json, random hex strings."""
    from spotctl.bundles.archive import pack
    from spotctl.bundles.signing import sign
    from spotctl.core.bundle import canonical, manifest

    rng = random.Random(revision)

    def make(n: int) -> bytes:
        files = {"padding.json": canonical([rng.randbytes(32).hex() for _ in range(n)])}
        m = canonical(manifest(REGION, revision, created, created + 86_400, files))
        return pack(m, [sign(m, key)], files, created)

    n = BUNDLE_SIZE // 35  # hex gzips to a little over half its size; ~67 bytes of JSON per string
    for _ in range(4):
        data = make(n)
        if abs(len(data) - BUNDLE_SIZE) <= BUNDLE_SIZE // 100:
            break
        n = int(n * BUNDLE_SIZE / len(data))
    return data


def _env(tmp: Path) -> dict:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_CONFIG_HOME": str(tmp / "config"),
            "XDG_CACHE_HOME": str(tmp / "cache")}


def _start_server(tmp: Path, svid: tuple[str, str], bundle_pem: str, trust: str, env: dict) -> tuple:
    port = free_port()
    with open(tmp / "serve.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([str(BIN / "spotctl"), "bundle", "serve", "--cert", svid[0], "--key", svid[1],
                                 "--trust-bundle", bundle_pem, "--trust", trust,
                                 "--allow-get", f"{TD}/agent/*", "--allow-put", f"{TD}/ci/contract-pipeline",
                                 "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp / "served")],
                                stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = (tmp / "serve.log").read_text()
        if "serving region demo's bundle at https://" in text:
            return proc, f"https://127.0.0.1:{port}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    _stop(proc)
    raise RuntimeError(f"bundle serve did not start: {(tmp / 'serve.log').read_text()[-2000:]}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def bench(quick: bool = False) -> list[dict]:
    from benchmarks._services import pct
    from spotctl.bundles.signing import generate, load_private
    from tests.pki import CA

    agents, period, rounds = (100, 3.0, 4) if quick else (1000, 30.0, 4)
    load0 = os.getloadavg()[0]
    server = loadgen = None
    with tempfile.TemporaryDirectory(prefix="spotctl-bench-bundle-serve-") as tmpname:
        tmp = Path(tmpname)
        try:
            env = _env(tmp)
            pki = tmp / "pki"
            pki.mkdir()
            ca = CA("example.org")
            bundle_pem = str(pki / "bundle.pem")
            Path(bundle_pem).write_bytes(ca.pem())
            t = time.perf_counter()
            server_svid = ca.svid(pki, "server", [f"{TD}/spotctl/bundle-server"])
            pipeline = ca.svid(pki, "pipeline", [f"{TD}/ci/contract-pipeline"])
            svids = [ca.svid(pki, f"agent-{i}", [f"{TD}/agent/node-{i}"]) for i in range(agents)]
            svid_s = time.perf_counter() - t
            generate(tmp / "signing.pem", tmp / "signing.pem.pub")
            created = int(time.time())
            data = big_bundle(load_private(tmp / "signing.pem"), created)
            (tmp / "big.bundle").write_bytes(data)
            import hashlib

            etag = f'"{hashlib.sha256(data).hexdigest()}"'

            server, url = _start_server(tmp, server_svid, bundle_pem, str(tmp / "signing.pem.pub"), env)
            t = time.perf_counter()
            p = subprocess.run([str(BIN / "spotctl"), "bundle", "publish", str(tmp / "big.bundle"), "--to", url,
                                "--cert", pipeline[0], "--key", pipeline[1], "--trust-bundle", bundle_pem,
                                "-o", "json"], capture_output=True, text=True, env=env, timeout=60, check=False)
            publish_s = time.perf_counter() - t
            if p.returncode != 0:
                raise RuntimeError(f"bundle publish failed ({p.returncode}): {p.stderr[-2000:]}")

            cfg = {"agents": agents, "period": period, "rounds": rounds, "url": f"{url}/v1/regions/{REGION}/bundle",
                   "etag": etag, "stale_etag": '"' + "0" * 64 + '"', "size": len(data), "svids": svids,
                   "trust_bundle": bundle_pem, "stale_fraction": STALE_FRACTION, "clk_tck": CLK_TCK}
            (tmp / "loadgen.json").write_text(json.dumps(cfg))
            (tmp / "loadgen.py").write_text(LOADGEN)
            c_start = proc_cpu(server.pid)
            w_start = time.perf_counter()
            loadgen = subprocess.Popen([PY, str(tmp / "loadgen.py"), str(tmp / "loadgen.json"),
                                        str(tmp / "result.json")], stdout=subprocess.PIPE, text=True, env=env)
            assert loadgen.stdout is not None
            marks = {}
            for line in loadgen.stdout:
                marks[line.strip()] = (time.perf_counter(), proc_cpu(server.pid))
            rc = loadgen.wait(timeout=60)
            if rc != 0 or "done" not in marks or "measure" not in marks:
                raise RuntimeError(f"the load generator failed (exit {rc})")
            res = json.loads((tmp / "result.json").read_text())
        finally:
            if loadgen is not None and loadgen.poll() is None:
                loadgen.kill()
                loadgen.wait()
            _stop(server)
        server_log = [x for x in (tmp / "serve.log").read_text().strip().splitlines()[1:]
                      if x != "spotctl: terminated"]  # what it says on SIGTERM

    (wm, cm), (wd, cd) = marks["measure"], marks["done"]
    warm_cpu = (cm - c_start) / (wm - w_start)
    cpu = (cd - cm) / (wd - wm)
    l304, l200, errors = res["lat"]["304"], res["lat"]["200"], res["errors"]
    n = len(l304) + len(l200) + len(errors)
    rate = n / res["wall"]
    equiv = rate * 30.0  # agents polling every 30 s that make this request rate
    cpu_per_1000 = cpu * 1000.0 / equiv
    p99_304, p99_200 = pct(l304, 0.99), pct(l200, 0.99)
    w304, w200 = res["warm"]["304"], res["warm"]["200"]
    lag99 = pct(res["lag"], 0.99) or 0.0
    shape = (f"{agents} agents, each its own SVID and keep-alive connection, polling every {period:g} s "
             f"({rate:.1f} req/s measured, real time), {rounds} measured rounds after a warm-up round; "
             f"~{STALE_FRACTION:.0%} of polls send a stale ETag")
    common = (f"{len(l304)} 304s, {len(l200)} full fetches of {len(data):,} bytes, {len(errors)} errors"
              + (f" (first: {errors[0]})" if errors else "") + f"; client start lag p99 {_ms(lag99)} ms; "
              f"load average {load0:.2f} at start, 2-core machine shared with other work")
    ok = not errors
    rows = [
        {"name": f"bundle serve p99, 304 ({agents:,} agents / {period:g} s)", "value": round(p99_304 * 1000, 1)
         if p99_304 is not None else None, "unit": "ms", "target": f"<= {TARGET_MS:g} ms",
         "pass": ok and p99_304 is not None and p99_304 * 1000 <= TARGET_MS,
         "detail": f"p50 {_ms(pct(l304, 0.5))} ms, p99 {_ms(p99_304)} ms, max {_ms(max(l304, default=None))} ms; "
                   f"{shape}; {common}"},
        {"name": "bundle serve p99, full 1 MiB fetch", "value": round(p99_200 * 1000, 1)
         if p99_200 is not None else None, "unit": "ms", "target": f"<= {TARGET_MS:g} ms",
         "pass": ok and p99_200 is not None and p99_200 * 1000 <= TARGET_MS,
         "detail": f"p50 {_ms(pct(l200, 0.5))} ms, p99 {_ms(p99_200)} ms, max {_ms(max(l200, default=None))} ms "
                   f"over {len(l200)} fetches (time to the last byte; few samples: p99 is near the max); "
                   f"warm-up round (new connection, TLS handshake, then a 304): p50 {_ms(pct(w304, 0.5))} ms, "
                   f"p99 {_ms(pct(w304, 0.99))} ms over {len(w304)} ({len(w200)} 200s); "
                   f"publish of the bundle with `spotctl bundle publish`: {publish_s:.2f} s (CLI start included)"},
        {"name": "bundle serve CPU per 1,000 agents (30 s polls)", "value": round(cpu_per_1000, 4),
         "unit": "CPU s/s", "target": "report", "pass": True,
         "detail": f"server process {cpu:.4f} CPU s per s of wall time over the measured window "
                   f"({res['wall']:.1f} s, /proc/PID/stat utime+stime), scaled by request rate to 1,000 agents "
                   f"polling every 30 s (33.3 req/s); warm-up round (1 handshake per agent) {warm_cpu:.4f} CPU s/s; "
                   f"load generator {res['client_cpu']:.4f} CPU s/s on the same cores; {agents} agent SVIDs made "
                   f"in {svid_s:.2f} s" + (f"; server stderr: {' | '.join(server_log)[:300]}" if server_log else "")},
    ]
    return rows


if __name__ == "__main__":
    from benchmarks._rows import main

    sys.exit(main(bench, __doc__))
