"""Filesystem conditions for tests that must hold even when the suite runs as root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def read_only(path: Path):
    """Make a file or directory really read-only for this process.

    Root ignores permission bits, so as root the immutable attribute (``chattr +i``, which root too must
    obey: open for writing, create, unlink all fail with EPERM) is used; otherwise ``chmod``. Skips when
    neither can be had (root on a filesystem without the attribute)."""
    path = Path(path)
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("root ignores permission bits and chattr is not installed")
        r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"root ignores permission bits and chattr +i failed: {r.stderr.strip()}")
        try:
            assert not os.access(path, os.W_OK), "chattr +i did not make the path read-only"
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
