"""Client of the audit log service (``docs/audit/openapi.yaml``): one bounded attempt per call.

Region table ``[regions.R.audit]``::

    url = "https://audit.example.net"     # required
    token_file = "/etc/spotctl/audit.token"   # or token = "..." (prefer the file)
    timeout_seconds = 5        # one HTTP request
    ca_file = "/etc/ssl/certs/internal-ca.pem"

Each record is sent with its id as the idempotency key, so a batch retried
after a lost answer (or re-sent after a crash) is acknowledged as
``duplicate`` and stored once. Errors follow the one HTTP rule of
:mod:`spotctl.adapters._http` (5xx, 429, timeouts: TemporaryError; a refused
connection: UnavailableError; 401/403: AuthError); any of them ends the attempt
at once (no retry loop, no sleep): the rows stay queued and the next pass sends
them again. The relay runs after the pass lock is released. A ``token_file`` is
re-read when it changes (rotation).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from spotctl.core.config import RegionConfig
from spotctl.core.errors import ConfigError, SpotctlError, TemporaryError
from spotctl.core.secrets import SecretFile, secret_value

from . import _http

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

ACKNOWLEDGED = ("created", "duplicate")
QUEUED = "the records stay queued in the outbox; the next pass sends them again"


class AuditClient:
    """Talks to one audit log service; implements ``spotctl.ops.relay.Outlet``."""

    def __init__(self, url: str, token: str | SecretFile | None, *, timeout_seconds: float = 5.0,
                 ca_file: str | None = None, batch_size: int = 200):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"audit: url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self._token = token  # a SecretFile is read on each request (re-read when rotated)
        self.timeout_seconds = float(timeout_seconds)
        self.verify: bool | str = ca_file or True
        self.batch_size = max(1, min(1000, int(batch_size)))  # records per POST (the service takes <= 1000)
        self.last_error: str | None = None
        self.attempts = 0  # HTTP attempts made (for reports and tests)
        self._session: requests.Session | None = None

    def __repr__(self) -> str:  # never shows the token
        return f"AuditClient({self.url!r})"

    def use_bearer(self, bearer) -> None:
        """Authenticate with the identity's token (``identity_token = true``: the reconciler's service
        account, or the operator who runs the command), renewed as it expires."""
        self._token = bearer

    @classmethod
    def from_config(cls, region: RegionConfig) -> "AuditClient":
        t = region.section("audit") or {}
        if not t.get("url"):
            raise ConfigError(f"region {region.name!r}: [audit] needs url")
        token: str | SecretFile | None = t.get("token")
        if t.get("token_file"):
            token = SecretFile(t["token_file"], setting=f"regions.{region.name}.audit.token_file")
            token.value()  # a missing or empty file is a ConfigError now, not at the first delivery
        if not token and not t.get("identity_token"):
            raise ConfigError(f"region {region.name!r}: [audit] needs token_file (or token, or identity_token = true)")
        return cls(t["url"], token, timeout_seconds=t.get("timeout_seconds", 5.0), ca_file=t.get("ca_file"),
                   batch_size=t.get("batch_size", 200))

    # -- the Outlet interface ----------------------------------------------------

    def deliver(self, rows: list[tuple[str, str]]) -> int:
        """Send audit outbox rows; return how many leading records the service acknowledged."""
        self.last_error = None
        items = [{"idempotency_key": key, "record": json.loads(payload)} for key, payload in rows]
        body = self._request("POST", "/v1/batches", json_body={"records": items})
        results = body.get("results") if isinstance(body, dict) else None
        if not isinstance(results, list) or len(results) != len(items):
            raise TemporaryError(f"audit service {self.url}: malformed answer (expected {len(items)} results)")
        n = 0
        for item, res in zip(items, results):
            if res.get("idempotency_key") != item["idempotency_key"] or res.get("status") not in ACKNOWLEDGED:
                err = res.get("error") or {}
                self.last_error = (f"record {item['idempotency_key']}: {res.get('status')}"
                                   f"{': ' + err.get('message', '') if err else ''}")
                break
            n += 1
        return n

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # -- reading -------------------------------------------------------------------

    def records(self, region: str | None = None, page: int = 500) -> Iterator[dict]:
        """Every stored record (of a region), in the order the service received them."""
        after = 0
        while True:
            params: dict[str, int | str] = {"after": after, "limit": page}
            if region:
                params["region"] = region
            body = self._request("GET", "/v1/records", params=params)
            yield from body.get("records", [])
            if body.get("next_after") is None:
                return
            after = body["next_after"]

    def record(self, record_id: str) -> dict:
        return self._request("GET", f"/v1/records/{record_id}")

    # -- HTTP, one attempt -----------------------------------------------------------

    def _request(self, method: str, path: str, *, json_body: object = None,
                 params: dict[str, int | str] | None = None) -> dict:
        """One HTTP attempt, bounded by ``timeout_seconds``; errors by the rule of ``_http``. No retry loop and
        no sleep (a pass never waits): the rows stay queued and the next pass sends them again (the service
        stores each record once, by its id). ``last_error`` says why the attempt failed."""
        import requests

        if self._session is None:
            self._session = requests.Session()
        self.attempts += 1
        what = f"audit service {method} {path}"
        token = secret_value(self._token)
        try:
            resp = _http.send(self._session, method, self.url + path, what=what, peer=self.url,
                              timeout=self.timeout_seconds, json=json_body, params=params, verify=self.verify,
                              headers={"Authorization": f"Bearer {token}"}, unreachable_hint=QUEUED)
            if resp.status_code >= 300:
                raise _http.status_error(resp.status_code, f"{what}: HTTP {resp.status_code} ({_message(resp)})",
                                         auth_hint="check [audit] token_file", hint=QUEUED)
            try:
                return resp.json()
            except ValueError:
                raise TemporaryError(f"{what}: HTTP {resp.status_code} with a body that is not JSON",
                                     hint=QUEUED) from None
        except SpotctlError as e:
            self.last_error = e.message
            raise


def _message(resp: requests.Response) -> str:
    try:
        err = resp.json().get("error", {})
        return f"{err.get('code')}: {err.get('message')}"
    except (ValueError, AttributeError):
        return (resp.text or "")[:200]
