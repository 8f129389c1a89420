"""``scontrol`` on this host, for what slurmrestd does not offer: requeueing jobs, reservations, node
updates before v0.0.39, and the "is slurmctld up?" check of Slurm 22.05 (see ``SlurmRest._check_access``).

It runs with the REST client's JWT (``SLURM_JWT`` in the child's environment only, never ours), so it
acts as the same Slurm user, and with ``TZ=UTC`` (the times we give it are UTC). Its failures are
translated from what it prints, since it has no status codes: an unknown node is NotFoundError, a
refused token AuthError, an unreachable controller UnavailableError, anything else TemporaryError.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import NoReturn

from spotctl.core.errors import AuthError, NotFoundError, TemporaryError, UnavailableError


class Scontrol:
    """One ``scontrol`` binary (``path``, found on PATH) run as ``user`` with the token ``jwt()`` returns."""

    def __init__(self, path: str, *, user: str, jwt: Callable[[], str], slurm_conf: str | None = None,
                 timeout: float = 10.0):
        self.path = path
        self.user = user
        self._jwt = jwt
        self.slurm_conf = slurm_conf
        self.timeout = max(timeout, 10)

    def __repr__(self) -> str:
        return f"<Scontrol {self.path}>"

    def _env(self, with_token: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        env["TZ"] = "UTC"  # times given to scontrol are UTC
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        if with_token:
            env["SLURM_JWT"] = self._jwt()  # this child's environment only, never ours
        return env

    def run(self, args: list[str]) -> tuple[int, str]:
        """``scontrol ARGS``: its exit code and what it said (stderr, else stdout; 300 characters at most)."""
        try:
            p = subprocess.run([self.path, *args], check=False, capture_output=True, text=True, timeout=self.timeout,
                               env=self._env())
        except subprocess.TimeoutExpired:
            raise TemporaryError(f"slurm: scontrol {args[0]} did not finish within {self.timeout:g}s") from None
        except OSError as e:
            raise UnavailableError(f"slurm: cannot run {self.path}: {e.strerror}") from None
        return p.returncode, (p.stderr.strip() or p.stdout.strip())[:300]

    def controller_up(self) -> bool:
        """``scontrol ping`` without the token (munge): whether slurmctld answers this host at all."""
        try:
            p = subprocess.run([self.path, "ping"], check=False, capture_output=True, text=True, timeout=10,
                               env=self._env(with_token=False))
        except (OSError, subprocess.TimeoutExpired):
            return False
        return "is UP" in p.stdout

    def fail(self, out: str, what: str) -> NoReturn:
        """Raise the error for a failed ``scontrol`` that printed ``out`` while doing ``what``."""
        low = out.lower()
        if "invalid node name" in low or "not found" in low:
            raise NotFoundError(f"slurm: {what}: {out}")
        if "authentication" in low or "zero bytes were transmitted" in low or "access/permission denied" in low \
                or "access denied" in low or "permission denied" in low:
            raise AuthError(f"slurm: {what}: slurmctld refused the token of user {self.user!r}: {out}")
        if "unable to contact" in low or "connection refused" in low or "timed out" in low:
            raise UnavailableError(f"slurm: {what}: {out}")
        raise TemporaryError(f"slurm: {what}: scontrol: {out}")


def one_word(s: str) -> str:
    """A value for a ``key=value`` argument: scontrol takes one argv word with spaces, not with newlines."""
    return " ".join(str(s).split())
