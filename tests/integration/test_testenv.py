"""The test environment itself: services on loopback only, and a suite that fails when one is down.

Both are promises `make test` makes to whoever runs it: the services it starts are reachable from this
host only, and a green run means the real services were exercised (a service that is down fails its
tests under `SPOTCTL_REQUIRE_SERVICES=1`; it is never skipped).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import conftest as harness

pytestmark = pytest.mark.integration

TESTENV = harness.ROOT / "scripts" / "testenv"
TESTENV_DIR = os.environ.get("SPOTCTL_TESTENV_DIR", "/var/tmp/spotctl-testenv")


def services() -> list[str]:
    """The services `scripts/testenv/all` starts: extension-less executables beside it."""
    return sorted(p.name for p in TESTENV.iterdir()
                  if p.is_file() and os.access(p, os.X_OK) and "." not in p.name and p.name != "all")


# ------------------------------------------------------------------------------------------ listeners

def _hex_addr(h: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/{tcp,udp}[6] prints it (host byte order in 32-bit words)."""
    raw = bytes.fromhex(h)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words)


def listeners() -> list[tuple[str, str, int, int]]:
    """(protocol, address, port, socket inode) of every listening TCP and bound UDP socket."""
    out = []
    for proto, state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        path = Path("/proc/net") / proto
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != state:
                continue
            host, port = f[1].split(":")
            out.append((proto, str(_hex_addr(host)), int(port, 16), int(f[9])))
    return out


def socket_owners() -> dict[int, int]:
    """socket inode -> pid, from every process's open descriptors."""
    owners: dict[int, int] = {}
    for pd in Path("/proc").iterdir():
        if not pd.name.isdigit():
            continue
        try:
            for fd in (pd / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    owners.setdefault(int(target[8:-1]), int(pd.name))
        except OSError:
            continue
    return owners


def started_by_testenv(pid: int) -> bool:
    """A process of ours: its command line, environment, working directory or root names the test
    environment's state directory or the repository's scripts/testenv (daemons re-parent to init, so
    ancestry does not tell)."""
    marks = (TESTENV_DIR, str(TESTENV))
    pd = Path("/proc") / str(pid)
    texts = []
    for name in ("cmdline", "environ"):
        try:
            texts.append((pd / name).read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    for link in ("cwd", "root"):
        try:
            texts.append(os.readlink(pd / link))
        except OSError:
            pass
    return any(m in t for m in marks for t in texts)


def comm(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def test_every_test_service_listens_on_loopback_only():
    for name in services():          # each must be up (fails under make test when one is down)
        harness.testenv(name)
    owners = socket_owners()
    ours, exposed = [], []
    for proto, addr, port, inode in listeners():
        pid = owners.get(inode)
        if pid is None or not started_by_testenv(pid):
            continue
        where = f"{comm(pid)} (pid {pid}) on {proto} {addr}:{port}"
        ours.append(where)
        if not ipaddress.ip_address(addr).is_loopback:
            exposed.append(where)
    # the scan must see the services, or it proves nothing
    assert len(ours) >= len(services()), f"found only {ours} for services {services()}"
    assert not exposed, "test services listening beyond loopback:\n  " + "\n  ".join(exposed)


# ------------------------------------------------------------------------------------ a service down

def test_a_stopped_service_fails_the_suite_instead_of_skipping(tmp_path):
    """Stop the Kubernetes test server and run the tests that need it as `make test` does: they fail."""
    harness.testenv("k8s")
    script = str(TESTENV / "k8s")
    subprocess.run([script, "down"], check=True, capture_output=True, timeout=60)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env["SPOTCTL_REQUIRE_SERVICES"] = "1"
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
             "tests/integration/test_both_schedulers.py", "tests/integration/test_kubernetes.py"],
            cwd=harness.ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        subprocess.run([script, "up"], check=True, capture_output=True, timeout=120)
    summary = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    assert p.returncode == 1, f"pytest exited {p.returncode}: {summary}\n{p.stdout[-2000:]}"
    assert "test service 'k8s' is not up" in p.stdout
    assert "skipped" not in summary and ("failed" in summary or "error" in summary), summary
