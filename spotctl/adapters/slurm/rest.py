"""The slurmrestd client: the JWT and its checks, API version discovery, requests, and what an error
answer means.

API versions: the client reads ``/openapi/v3`` once (on first use, inside a pass) and uses the newest
version it supports among :data:`SUPPORTED_VERSIONS`, or the pinned one.

Errors follow the one HTTP rule of :mod:`spotctl.adapters._http`: 401/403 and rejected tokens ->
AuthError (Slurm >= 23.11 answers a token slurmctld rejects with HTTP 511, 22.05 with HTTP 500
"Unspecified error", see :meth:`SlurmRest._check_access`); refused connections -> UnavailableError;
5xx and timeouts -> TemporaryError; 400/422 -> RefusedError; an unknown node -> NotFoundError (HTTP
404, or — Slurm's own addition to the rule — HTTP 500 with Slurm error 2018 from a v0.0.39+ node
update). A ``token_file`` is re-read when it changes (rotation).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotctl.core import deadline
from spotctl.core.errors import (
    AuthError,
    ConfigError,
    NotFoundError,
    RefusedError,
    SpotctlError,
    TemporaryError,
    UnavailableError,
)
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.secrets import SecretFile
from spotctl.core.timefmt import iso

from .. import _http
from .parsing import ESLURM_INVALID_NODE_NAME, _error_numbers, error_message, version_key
from .scontrol import Scontrol

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")
NODE_UPDATE_FROM = "v0.0.39"  # Slurm 23.02: POST/DELETE /slurm/vX/node/{name}


def _jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT (not verified: slurmctld does that); None when it is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        pad = "=" * (-len(parts[1]) % 4)
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + pad))
    except (ValueError, UnicodeDecodeError):
        return None
    return claims if isinstance(claims, dict) else None


@dataclass
class _Token:
    """Where the JWT comes from: the config, a token file (re-read when it changes: rotation) or the environment."""

    source: str
    value: str | None = None
    file: SecretFile | None = None
    env: str | None = None

    def get(self) -> str:
        if self.file is not None:
            return self.file.value()  # ConfigError naming the file when it is missing, empty or not one token
        if self.env is not None:
            self.value = (os.environ.get(self.env) or "").strip()
        if not self.value:
            raise ConfigError(f"slurm: the token from {self.source} is empty")
        return self.value


class SlurmRest:
    """slurmrestd at ``url`` as ``user`` with ``token`` (and ``scontrol``, found on PATH, where REST cannot)."""

    def __init__(self, url: str, user: str, token: _Token, *, api_version: str | None = None,
                 scontrol: str | None = "scontrol", slurm_conf: str | None = None, timeout: float = 10.0,
                 verify: bool | str = True, clock: Clock | None = None):
        self.url = url.rstrip("/")
        self.user = user
        self._token = token
        self.pinned_version = api_version
        self.api_version: str | None = None
        self.served_versions: list[str] = []
        self.timeout = timeout
        self.verify = verify
        self.clock = clock or SystemClock()
        path = shutil.which(scontrol) if scontrol else None
        self.scontrol = Scontrol(path, user=user, jwt=self._check_token, slurm_conf=slurm_conf,
                                 timeout=timeout) if path else None
        self.scontrol_configured = scontrol
        self._session: requests.Session | None = None
        self._lock = threading.Lock()
        self._access_checked = False

    def _http(self) -> requests.Session:
        if self._session is None:
            import requests

            s = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=32)  # the drain fan-out
            s.mount("https://", adapter)
            s.mount("http://", adapter)
            s.headers["Accept"] = "application/json"
            s.verify = self.verify
            self._session = s
        return self._session

    def _check_token(self) -> str:
        """The JWT, checked before it is sent: a JWT at all, not expired, of the configured user."""
        token = self._token.get()
        claims = _jwt_claims(token)
        if claims is None:
            raise AuthError(f"slurm: the token from {self._token.source} is not a JWT",
                            hint=f"generate one with: scontrol token username={self.user}")
        exp = claims.get("exp")
        if isinstance(exp, (int, float)) and exp <= self.clock.now():
            raise AuthError(f"slurm: the token for user {claims.get('sun', self.user)} from {self._token.source} "
                            f"expired at {iso(exp)}",
                            hint=f"generate a new one: scontrol token username={self.user} lifespan=SECONDS")
        sun = claims.get("sun")
        if sun and sun != self.user:
            raise AuthError(f"slurm: the token from {self._token.source} belongs to user {sun!r}, "
                            f"not to the configured user {self.user!r}")
        return token

    def _request(self, method: str, path: str, *, json_body: dict[str, Any] | None = None,
                 timeout: float | None = None, what: str = "") -> dict[str, Any]:
        """One request; the answer's JSON object, or the spotctl error for anything else."""
        token = self._check_token()
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": token}
        url = f"{self.url}{path}"
        what = what or f"{method} {path}"
        t = deadline.bounded(timeout or self.timeout)  # inside a pass's observe: no longer than the time left
        r = _http.send(self._http(), method, url, what=f"slurm: {what}", peer=f"slurmrestd at {self.url}",
                       timeout=(min(t, 5.0), t), headers=headers, json=json_body,
                       unreachable_hint="is slurmrestd running and listening there?",
                       tls_hint="set ca_file or verify_tls in the slurm table")
        body: dict[str, Any] | None = None
        try:
            parsed = r.json()
            body = parsed if isinstance(parsed, dict) else None
        except ValueError:
            body = None
        if r.status_code >= 400:
            raise self._http_error(r.status_code, body, (r.text or r.reason or ""), what)
        if body is None:
            raise UnavailableError(f"slurm: {what}: the answer is not a JSON object (HTTP {r.status_code})")
        return body

    def _http_error(self, status: int, body: dict[str, Any] | None, text: str, what: str) -> SpotctlError:
        """The error for an HTTP error answer of slurmrestd (``body``: its JSON object, if it sent one): the
        class by the rule of ``_http``, the message and hint Slurm's."""
        msg = error_message(body, text)
        if status == 511:
            # Slurm >= 23.11: slurmctld rejected the token slurmrestd passed through (bad signature,
            # unknown key); the answer carries no error entry. 22.05 says HTTP 500 instead (_check_access).
            return AuthError(f"slurm: slurmctld refuses the token of user {self.user!r} from {self._token.source} "
                             f"(slurmrestd: HTTP 511, {msg})",
                             hint=f"generate a new one: scontrol token username={self.user}")
        if ESLURM_INVALID_NODE_NAME in _error_numbers(body):
            # Slurm's own addition: v0.0.39+ node updates answer an unknown node with HTTP 500 and error 2018
            return NotFoundError(f"slurm: {what}: not found (HTTP {status}): {msg}")
        cls = _http.error_class(status)
        if cls is AuthError:
            return AuthError(f"slurm: slurmrestd refused user {self.user!r} (HTTP {status}): {msg}",
                             hint=f"check the token ({self._token.source}); scontrol token username={self.user}")
        if cls is NotFoundError:
            return NotFoundError(f"slurm: {what}: not found (HTTP {status}): {msg}")
        return cls(f"slurm: {what}: HTTP {status}: {msg}", details={"status": status})

    def _api(self, path: str, method: str = "GET", *, json_body: dict[str, Any] | None = None,
             what: str = "") -> dict[str, Any]:
        """A request to ``/slurm/<version>/<path>`` (the version discovered, the token checked once)."""
        self.discover()
        if not self._access_checked:
            # once per process: a refused token is an AuthError (the pass goes on degraded and exits 4)
            self._check_access()
            self._access_checked = True
        return self._request(method, f"/slurm/{self.api_version}/{path}", json_body=json_body, what=what)

    def _list(self, path: str, key: str) -> list[dict[str, Any]]:
        """A list read (jobs, nodes, partitions). slurmrestd may answer HTTP 200 with an empty list and
        ``errors`` when it could not load the data from slurmctld (busy, timed out): that is a failure,
        not an empty cluster."""
        body = self._api(path, what=f"GET {path}")
        items = body.get(key)
        errors = body.get("errors") or []
        if errors and not items:
            raise TemporaryError(f"slurm: GET {path}: slurmrestd answered without data: {error_message(body, '')}")
        if errors:
            log.warning("slurm: GET %s: %s", path, error_message(body, ""))
        if not isinstance(items, list):
            if items is None:
                return []
            raise UnavailableError(f"slurm: GET {path}: {key!r} is not a list")
        return [x for x in items if isinstance(x, dict)]

    # --- discovery ----------------------------------------------------------------

    def discover(self, start: bool = False) -> str:
        """Pick the API version (newest supported, or the pinned one). Once; later calls are free.

        At start, an unreachable slurmrestd is not fatal (the pass goes on degraded and the next call
        tries again); a rejected token is (AuthError), and so is a server without a supported version.
        """
        if self.api_version is not None:
            return self.api_version
        with self._lock:
            if self.api_version is not None:
                return self.api_version
            try:
                doc = self._request("GET", "/openapi/v3", what="API discovery (GET /openapi/v3)")
            except UnavailableError as e:
                if not start:
                    raise
                log.warning("%s; API version discovery deferred", e.message)
                return ""
            served = sorted({m.group(1) for p in (doc.get("paths") or {})
                             if (m := re.match(r"^/slurm/(v\d+\.\d+\.\d+)/", p))}, key=version_key)
            self.served_versions = served
            usable = [v for v in served if v in SUPPORTED_VERSIONS]
            if self.pinned_version:
                if self.pinned_version not in served:
                    raise ConfigError(f"slurm: api_version {self.pinned_version} is not served by {self.url}",
                                      hint=f"served: {', '.join(served) or 'none'}")
                chosen = self.pinned_version
            elif usable:
                chosen = usable[-1]
            else:
                raise UnavailableError(
                    f"slurm: slurmrestd at {self.url} serves no supported API version "
                    f"(served: {', '.join(served) or 'none'}; supported: {', '.join(SUPPORTED_VERSIONS)})",
                    hint="Slurm 22.05 or newer is needed; without slurmdbd, load the openapi/v0.0.3x or "
                         "openapi/slurmctld plugins with slurmrestd -s")
            self.api_version = chosen
            log.info("slurm: using API %s of %s (served: %s)", chosen, self.url, ", ".join(served))
        if start:
            self._check_access()
        return chosen

    def _check_access(self) -> None:
        """One authenticated read at start, so that a rejected token fails loudly (exit 4), not later.

        Slurm 22.05's slurmrestd answers a token that slurmctld rejects with HTTP 500 "Unspecified
        error" — the same answer as for a controller that is down. When scontrol can reach the
        controller on its own (munge), a 500 here means the token was refused.
        """
        try:
            self._request("GET", f"/slurm/{self.api_version}/partitions", what="GET partitions")
        except TemporaryError as e:
            if self.scontrol and self.scontrol.controller_up():
                raise AuthError(f"slurm: slurmctld is up but refuses the token of user {self.user!r} "
                                f"from {self._token.source}; slurmrestd said: {e.message.split(': ', 2)[-1]}",
                                hint=f"generate a new one: scontrol token username={self.user}") from None
            log.warning("%s", e.message)
        except (UnavailableError, RefusedError) as e:  # not the token's fault: the reads say so themselves
            log.warning("%s", e.message)
