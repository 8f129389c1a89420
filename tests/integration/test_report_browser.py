"""The HTML report opened in a real headless browser (Debian's chromium, `scripts/testenv/chromium up`): it
renders with no console errors and no request leaves the page, and its screenshot is not blank."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

from tests.integration.conftest import testenv as service_env
from tests.integration.conftest import unavailable

BIN = Path(sys.executable).parent / "spotctl"


def _chromium() -> str:
    path = os.environ.get("SPOTCTL_CHROMIUM") or service_env("chromium").get("SPOTCTL_CHROMIUM")
    if not path or not os.access(path, os.X_OK):
        unavailable("chromium", f"no chromium at {path!r}")
    return str(path)


def _pixels(png: bytes) -> tuple[int, int, set[tuple[int, ...]]]:
    """Width, height and the distinct colours of an 8-bit RGB(A) PNG (non-interlaced), decoded with zlib."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    i, idat, head = 8, b"", None
    while i < len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        body = png[i + 8:i + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        i += 12 + n
    assert head is not None
    w, h, depth, ctype, _, _, interlace = head
    assert depth == 8 and ctype in (2, 6) and interlace == 0, head
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    colours: set[tuple[int, ...]] = set()
    pos = 0
    for _ in range(h):
        f = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(bytes(line[x:x + 3]) for x in range(0, stride, bpp * 4))  # every 4th pixel
        prev = line
    return w, h, colours


def _open(chromium: str, page: Path, shot: Path, profile: Path) -> tuple[list[str], str]:
    """Open a page in headless chromium, screenshot it: the page's console lines, and the browser's stderr."""
    b = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
                        "--window-size=1280,1800", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert b.returncode == 0, b.stderr[-2000:]
    return [ln for ln in b.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln], b.stderr


def test_the_console_check_sees_a_page_error(tmp_path):
    """The check below can fail: a page that logs an error and throws is caught."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('boom'); notDefined();</script></body></html>")
    console, _ = _open(_chromium(), page, tmp_path / "bad.png", tmp_path / "profile")
    assert any("boom" in ln for ln in console) and any("notDefined" in ln for ln in console), console


def test_html_report_renders_in_headless_chromium(tmp_path):
    chromium = _chromium()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path))
    p = subprocess.run([str(BIN), "-o", "json", "simulate", "--hours", "4", "--seed", "7", "--keep-state",
                        str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    db = json.loads(p.stdout)["data"]["state_db"]
    page = tmp_path / "report.html"
    p = subprocess.run([str(BIN), "report", "--since", "4h", "--state-db", db, "--format", "html", "--output",
                        str(page)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    text = page.read_text()
    # five charts inline; pygal's external JS off (its inline config object stays: it fetches nothing)
    assert text.count("<svg") == 5
    assert "src=" not in text and "@import" not in text and "<link" not in text and 'href="http' not in text
    shot = tmp_path / "shot.png"
    console, stderr = _open(chromium, page, shot, tmp_path / "profile")
    assert console == [], console
    assert "net::ERR" not in stderr
    w, h, colours = _pixels(shot.read_bytes())
    assert (w, h) == (1280, 1800)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: a blank page?"
