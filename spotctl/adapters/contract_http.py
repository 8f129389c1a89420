"""The provider contract feed over HTTP (``docs/contract/openapi.yaml``).

:class:`ContractFeed` implements :class:`~spotctl.core.ports.ContractPort`
(``rate_card()``, ``notices()`` = the notices in force) and
:class:`~spotctl.core.ports.NoticeStream` (``poll``, ``reclaim``,
``get_reclaim``, ``status``).

Configured per region::

    [regions.R.contract]
    url = "https://spot-contract.example.net"   # required
    token_file = "/etc/spotctl/contract.token"  # or token = "..." (bearer)
    timeout_seconds = 10                        # per request (long-polls add their wait)

Errors follow the one HTTP rule of :mod:`spotctl.adapters._http` (401/403 → AuthError,
404 → NotFoundError, 400/422 → RefusedError, 409/429/5xx/timeouts → TemporaryError, connection
refused → UnavailableError). One attempt per call, no retry loop and no sleep (a pass or
the watcher never waits on the feed): the next pass asks again; a reclaim is
sent with an idempotency key, so asking again never reclaims twice. A ``token_file`` is
re-read when it changes (rotation, :class:`~spotctl.core.secrets.SecretFile`). The rate card is fetched
with ``If-None-Match``; on 304 the card held is returned. Feed bodies are
checked: a malformed rate card is an UnavailableError; a malformed notice is
skipped, counted in ``rejected`` and logged. ``requests`` is imported on the
first call, never at import time.
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import TYPE_CHECKING

from spotctl.core import deadline
from spotctl.core.config import RegionConfig
from spotctl.core.errors import ConfigError, NotFoundError, UnavailableError
from spotctl.core.models import Notice, NoticeKind, RateCard, Reclaim, ReclaimReceipt
from spotctl.core.secrets import SecretFile, secret_value
from spotctl.core.timefmt import parse_ts

from . import _http

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

_KINDS = {k.value: k for k in NoticeKind}


class ContractFeed:
    """The contract API client for one region."""

    provides_notices = True
    remote = True  # its calls cross the network: a pass reads it in a thread, under its observe deadline

    def __init__(self, url: str, *, token: str | SecretFile | None = None, timeout: float = 10.0,
                 session: requests.Session | None = None):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"contract url {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self._token = token  # a SecretFile is read on each request (re-read when rotated)
        self.timeout = float(timeout)
        self._session = session
        # (ETag, card): one value, replaced whole, so that a read a pass stopped waiting for (it ends in
        # its own thread, see ops.observe) can never pair one card's ETag with another card
        self._cached: tuple[str | None, RateCard] | None = None
        self.rejected = 0  # malformed notices skipped

    @classmethod
    def from_config(cls, region: RegionConfig) -> "ContractFeed":
        sec = region.section("contract") or {}
        where = f"regions.{region.name}.contract"
        if not sec.get("url"):
            raise ConfigError(f"{where}.url is required (the contract API's base URL)")
        token: str | SecretFile | None = sec.get("token") or None
        if sec.get("token_file"):
            if token:
                raise ConfigError(f"{where}: set token or token_file, not both")
            token = SecretFile(sec["token_file"], setting=f"{where}.token_file")
            token.value()  # a missing or empty file is a ConfigError now, not at the first request
        timeout = sec.get("timeout_seconds", 10.0)
        if not timeout > 0:
            raise ConfigError(f"{where}.timeout_seconds must be > 0")
        return cls(sec["url"], token=token, timeout=timeout)

    def use_bearer(self, bearer) -> None:
        """Authenticate with the identity's token (``identity_token = true``), renewed as it expires."""
        self._token = bearer

    def __repr__(self) -> str:  # never shows the token
        return f"<ContractFeed {self.url}>"

    # --- ContractPort ------------------------------------------------------------------

    @property
    def etag(self) -> str | None:
        return self._cached[0] if self._cached else None

    @property
    def card(self) -> RateCard | None:
        return self._cached[1] if self._cached else None

    def rate_card(self) -> RateCard:
        cached = self._cached
        headers = {"If-None-Match": cached[0]} if cached and cached[0] else {}
        resp = self._request("GET", "/v1/rate-card", headers=headers, ok=(200, 304))
        if resp.status_code == 304 and cached:
            return self._copy(cached[1])
        if resp.status_code == 304:
            raise UnavailableError(f"contract feed {self.url}: GET /v1/rate-card answered 304 to a request "
                                   "that named no ETag")
        body = self._json(resp)
        card = self._parse_card(body)
        self._cached = (resp.headers.get("ETag"), card)
        return self._copy(card)

    def notices(self) -> list[Notice]:
        body = self._json(self._request("GET", "/v1/notices/active"))
        items = body.get("notices") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise UnavailableError(f"contract feed {self.url}: malformed active notices (no 'notices' list)")
        return self._notices(items)

    # --- NoticeStream --------------------------------------------------------------------

    def poll(self, cursor: str | None, wait: float = 0.0) -> tuple[list[Notice], str]:
        params: dict[str, str] = {}
        if cursor:
            params["after"] = cursor
        if wait > 0:
            params["wait"] = f"{min(float(wait), 60.0):g}"
        body = self._json(self._request("GET", "/v1/notices", params=params, timeout=self.timeout + max(0.0, wait)))
        if not isinstance(body, dict) or not isinstance(body.get("notices"), list) \
                or not isinstance(body.get("next_cursor"), str):
            raise UnavailableError(f"contract feed {self.url}: malformed notice page")
        if body.get("reset"):
            log.warning("contract feed %s did not recognise cursor %s: reading its log from the start", self.url,
                        cursor)
        return self._notices(body["notices"]), body["next_cursor"]

    def reclaim(self, instance_ids: list[str], notice_seconds: int, advisory_lead_seconds: int = 0,
                drill_id: str | None = None) -> Reclaim:
        """:class:`~spotctl.core.ports.ReclaimPort`: ``POST /v1/reclaims``, parsed into receipts."""
        payload: dict = {"instance_ids": list(instance_ids), "notice_seconds": int(notice_seconds),
                         "advisory_lead_seconds": int(advisory_lead_seconds)}
        if drill_id:
            payload["drill_id"] = drill_id
        # One key for every retry of this call: the provider returns the reclaim it made first.
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        body = self._json(self._request("POST", "/v1/reclaims", json=payload, headers=headers, ok=(201, 202)))
        return self._reclaim(body, instance_ids)

    def _reclaim(self, body: object, asked: list[str]) -> Reclaim:
        """A reclaim record checked where it enters: an id, and one receipt per instance asked for."""
        def bad(why: str) -> UnavailableError:
            return UnavailableError(f"contract feed {self.url}: malformed reclaim record: {why}")

        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not body["id"]:
            raise bad("no id")
        rows = body.get("instances")
        if not isinstance(rows, list):
            raise bad("no instances list")
        out = []
        for r in rows:
            if not isinstance(r, dict) or not isinstance(r.get("instance_id"), str):
                raise bad("an instance receipt without instance_id")
            ids = {k: r.get(k) for k in ("notice_id", "advisory_id", "error")}
            if any(v is not None and not isinstance(v, str) for v in ids.values()):
                raise bad(f"receipt of {r['instance_id']}: notice_id/advisory_id/error must be strings")
            out.append(ReclaimReceipt(instance_id=r["instance_id"], **ids))
        missing = set(asked) - {r.instance_id for r in out}
        if missing:
            raise bad(f"no receipt for {sorted(missing)}")
        return Reclaim(id=body["id"], instances=tuple(out))

    def get_reclaim(self, reclaim_id: str) -> dict:
        from urllib.parse import quote

        return self._json(self._request("GET", f"/v1/reclaims/{quote(reclaim_id, safe='')}"))

    def status(self) -> dict:
        return self._json(self._request("GET", "/v1/status"))

    # --- parsing ---------------------------------------------------------------------------

    @staticmethod
    def _copy(card: RateCard) -> RateCard:
        return RateCard(card.version, card.currency, dict(card.prices), card.valid_from, card.valid_until)

    def _parse_card(self, body: object) -> RateCard:
        try:
            if not isinstance(body, dict):
                raise ValueError("not an object")
            version, currency = body["version"], body["currency"]
            if not isinstance(version, str) or not version or not isinstance(currency, str):
                raise ValueError("version and currency must be strings")
            prices = {}
            for p in body["pools"]:
                price = p["price"]
                if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) \
                        or price < 0:
                    raise ValueError(f"pool {p.get('pool')!r}: price must be a number >= 0, got {price!r}")
                if not isinstance(p["pool"], str) or p["pool"] in prices:
                    raise ValueError(f"pool {p['pool']!r} is missing or repeated")
                prices[p["pool"]] = float(price)
            valid_from, valid_until = parse_ts(body["valid_from"]), parse_ts(body["valid_until"])
            if valid_from is None or valid_until is None or valid_until <= valid_from:
                raise ValueError("valid_until must follow valid_from")
        except (KeyError, TypeError, ValueError) as e:
            raise UnavailableError(f"contract feed {self.url}: malformed rate card ({e})") from None
        return RateCard(version=version, currency=currency, prices=prices, valid_from=valid_from,
                        valid_until=valid_until)

    def _notices(self, items: list) -> list[Notice]:
        out: list[Notice] = []
        seen: set[str] = set()
        for item in items:
            try:
                n = self._notice(item)
            except (KeyError, TypeError, ValueError) as e:
                self.rejected += 1
                log.warning("contract feed %s: ignoring a malformed notice (%s): %.200r", self.url, e, item)
                continue
            if n.id in seen:
                self.rejected += 1
                log.warning("contract feed %s: ignoring duplicate notice %s", self.url, n.id)
                continue
            seen.add(n.id)
            out.append(n)
        return out

    @staticmethod
    def _notice(d: dict) -> Notice:
        nid, iid, kind = d["id"], d["instance_id"], d["kind"]
        if not isinstance(nid, str) or not nid or not isinstance(iid, str) or not iid:
            raise ValueError("id and instance_id must be non-empty strings")
        if kind not in _KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        issued = parse_ts(d["issued_at"])
        if issued is None:
            raise ValueError("issued_at is required")
        deadline = parse_ts(d.get("deadline"))
        if kind == "hard" and deadline is None:
            raise ValueError("a hard notice needs a deadline")
        pool = d.get("pool")
        reason = d.get("reason") or ""
        if pool is not None and not isinstance(pool, str) or not isinstance(reason, str):
            raise ValueError("pool and reason must be strings")
        return Notice(id=nid, instance_id=iid, kind=_KINDS[kind], issued_at=issued, deadline=deadline,
                      reason=reason, pool=pool, delivered_at=parse_ts(d.get("delivered_at")))

    def _json(self, resp: requests.Response) -> dict:
        try:
            return resp.json()
        except ValueError:
            raise UnavailableError(f"contract feed {self.url}: {resp.request.method} {resp.url} answered "
                                   f"HTTP {resp.status_code} with a body that is not JSON") from None

    # --- transport ----------------------------------------------------------------------------

    def _sess(self) -> requests.Session:
        if self._session is None:
            import requests

            s = requests.Session()
            s.headers["Accept"] = "application/json"
            s.headers["User-Agent"] = "spotctl-contract-feed"
            self._session = s
        return self._session

    def _auth(self) -> dict[str, str]:
        token = secret_value(self._token)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _request(self, method: str, path: str, *, params: dict[str, str] | None = None, json: object = None,
                 headers: dict[str, str] | None = None, timeout: float | None = None,
                 ok: tuple[int, ...] = (200,)) -> requests.Response:
        """One attempt (no retry, no sleep: the next pass asks again); errors by the rule of ``_http``."""
        what = f"contract feed {method} {path}"
        timeout = deadline.bounded(timeout or self.timeout)  # inside a pass's observe: no longer than the time left
        resp = _http.send(self._sess(), method, self.url + path, what=what, peer=self.url, timeout=timeout,
                          params=params, json=json, headers={**self._auth(), **(headers or {})},
                          allow_redirects=False,
                          unreachable_hint="is the contract API up? (`spotctl sim serve` for the simulator)")
        if resp.status_code in ok:
            return resp
        raise self._translate(resp, what)

    def _translate(self, resp: requests.Response, what: str) -> Exception:
        code = resp.status_code
        message = ""
        try:
            body = resp.json()
            message = str(body["error"]["message"])[:300]
        except (ValueError, KeyError, TypeError):
            message = (resp.text or "")[:200].strip()
        return _http.status_error(code, f"{what}: HTTP {code}" + (f": {message}" if message else ""),
                                  auth_hint="check the region's [contract] token or token_file")

    # --- the simulator's extension (not part of the contract) -----------------------------------

    def world(self) -> dict:
        """``GET /sim/v1/world`` of a running ``spotctl sim serve``: world time, pools, instances."""
        try:
            return self._json(self._request("GET", "/sim/v1/world"))
        except NotFoundError as e:
            raise NotFoundError(f"{self.url} is not a spotctl simulator (no /sim/v1/world): {e.message}") from None


def world_status(region: RegionConfig, *, url: str | None = None, token: str | None = None,
                 timeout: float = 5.0) -> dict:
    """The world of a running ``spotctl sim serve`` for ``region``: URL and token default to its
    ``[contract]`` table (``token`` or ``token_file``), else ``http://127.0.0.1:8787`` without auth."""
    sec = region.section("contract") or {}
    if url is None:
        url = sec.get("url") or "http://127.0.0.1:8787"
    secret: str | SecretFile | None = token
    if secret is None:
        secret = sec.get("token") or (SecretFile(sec["token_file"], setting=f"regions.{region.name}.contract.token_file")
                                      if sec.get("token_file") else None)
    feed = ContractFeed(url, token=secret, timeout=timeout)
    try:
        return feed.world()
    finally:
        feed.close()
