"""Secrets kept in files: one reader for every ``token_file``, ``sasl_password_file`` and ``--token-file``.

:class:`SecretFile` reads the file when its value is first asked for and again whenever the file
changes — another inode (a rename into place, a Kubernetes projected-token symlink swap), another
mtime or another size — so a rotated token is used on the next call without a restart, by clients
and by the reference servers that check a bearer token alike. The file is stat'ed on every
``value()`` (one system call) and read only when it changed.

What a secret file may hold: one line. Surrounding whitespace (the trailing newline editors and
``echo`` leave) is stripped; an empty file, and one that holds a second line, are refused, and so is
a token with whitespace inside (``Bearer xyz``, ``token = xyz``: not a token) — pass
``spaces_ok=True`` for a password, which may hold spaces. Every refusal is a
:class:`~spotctl.core.errors.ConfigError` naming the setting and the file; a file that cannot be read
(missing, unreadable) is one too. The value never appears in a message or a ``repr``.

Why in core: the adapters (clients) and the services (the reference servers) both read secret
files, and those two floors may not import each other; this is configuration reading, as
:mod:`spotctl.core.config` is (stdlib only, no decisions).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import overload

from .errors import ConfigError


class SecretFile:
    """A secret read from ``path``, re-read when the file changes (see the module doc). Thread-safe."""

    def __init__(self, path: str | os.PathLike[str], *, setting: str = "secret file", spaces_ok: bool = False):
        self.path = Path(path).expanduser()
        self.setting = setting  # for messages: e.g. "regions.lab.slurm.token_file" or "--token-file"
        self.spaces_ok = spaces_ok
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None  # (device, inode, mtime ns, size) of the read
        self._value: str | None = None
        self.reads = 0  # how many times the file was read (tests, diagnostics)

    def __repr__(self) -> str:  # never shows the secret
        return f"SecretFile({str(self.path)!r}, setting={self.setting!r})"

    def _fail(self, why: str) -> ConfigError:
        return ConfigError(f"{self.setting} {self.path}: {why}",
                           hint="the file must hold the secret alone, on one line")

    def value(self) -> str:
        """The secret as the file holds it now (read again only when the file changed)."""
        try:
            st = os.stat(self.path)  # follows symlinks: a swapped ..data link is a change
        except OSError as e:
            raise self._fail(f"cannot read it ({e.strerror})") from None
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key == self._seen and self._value is not None:
                return self._value
            try:
                text = self.path.read_text(encoding="utf-8")
            except OSError as e:
                raise self._fail(f"cannot read it ({e.strerror})") from None
            except UnicodeDecodeError:
                raise self._fail("is not UTF-8 text") from None
            self.reads += 1
            value = text.strip()
            if not value:
                raise self._fail("is empty")
            if "\n" in value or "\r" in value:
                raise self._fail("holds more than one line")
            if not self.spaces_ok and any(c.isspace() for c in value):
                raise self._fail("holds whitespace inside the token")
            self._seen, self._value = key, value
            return value


@overload
def secret_value(secret: SecretFile | str) -> str: ...
@overload
def secret_value(secret: SecretFile | str | None) -> str | None: ...
def secret_value(secret: SecretFile | str | None) -> str | None:
    """The secret now: a file's current content (re-read once rotated), or the value given as it is."""
    if secret is None or isinstance(secret, str):
        return secret
    return secret.value()  # a SecretFile, or a token that renews itself (core.identity.Bearer)
