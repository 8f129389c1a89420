"""Logging in, and who is acting (issue 15): the use cases ``spotctl login``, ``logout`` and ``whoami``,
and :func:`current`, which every gated command and the reconciler call before they do anything.

Tokens are cached per region and identity (``user``: an operator's device-flow login; ``client-ID``: a
service account's client-credentials token), refreshed before they expire (a service account's asks
for a new token with its secret, read again from where it was given: never cached), and checked before
every use: signature (the identity port) and claims (:func:`spotctl.core.identity.check_claims`). A
refresh that fails asks for a new login (exit 4): never a fall back to anonymous.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from spotctl.core.errors import AuthError, ConfigError, SpotctlError, UnavailableError
from spotctl.core.identity import Actor, Forbidden, Identity, IdentitySettings, authorize, check_claims
from spotctl.core.ports import IdentityPort
from spotctl.core.secrets import SecretFile

USER = "user"
REFRESH_MARGIN = 60.0  # refresh a token this long before it expires
SECRET_ENV = "SPOTCTL_CLIENT_SECRET"


def client_entry(client_id: str) -> str:
    return f"client-{client_id}"


@dataclass(frozen=True)
class SecretSource:
    """Where a client secret is read from: a file or an environment variable (never a flag's value, never
    the cache). Only its location is cached, so that an expired client-credentials token can be renewed."""

    file: str | None = None
    env: str | None = None

    def read(self) -> str:
        if self.file:
            return SecretFile(self.file, setting="client secret file").value()
        if self.env:
            value = os.environ.get(self.env, "").strip()
            if not value:
                raise ConfigError(f"the client secret variable ${self.env} is empty or unset",
                                  hint="export it, or give --secret-file")
            return value
        raise ConfigError("no client secret given", hint=f"--secret-file FILE, or ${SECRET_ENV}")

    def to_dict(self) -> dict[str, str | None]:
        return {"file": self.file, "env": self.env}

    @classmethod
    def of(cls, d: Any) -> SecretSource | None:
        if not isinstance(d, dict) or not (d.get("file") or d.get("env")):
            return None
        return cls(file=d.get("file"), env=d.get("env"))


def service_secret(s: IdentitySettings, env: dict[str, str] | None = None) -> SecretSource:
    """The service account's secret: ``service_secret_file``, else systemd's credential
    ``$CREDENTIALS_DIRECTORY/<service client id>`` (``LoadCredential=``), else ``$SPOTCTL_CLIENT_SECRET``."""
    env = dict(os.environ) if env is None else env
    if s.service_secret_file:
        return SecretSource(file=s.service_secret_file)
    creds = env.get("CREDENTIALS_DIRECTORY")
    if creds and os.path.isfile(os.path.join(creds, s.service_client_id)):
        return SecretSource(file=os.path.join(creds, s.service_client_id))
    if env.get(SECRET_ENV):
        return SecretSource(env=SECRET_ENV)
    raise ConfigError(f"no secret for the service account {s.service_client_id!r}",
                      hint=("set [identity] service_secret_file, load it with systemd's "
                            f"LoadCredential={s.service_client_id}:/path, or export {SECRET_ENV}"))


def _entry(tokens: dict[str, Any], *, client_id: str, grant: str, now: float,
           secret: SecretSource | None = None) -> dict[str, Any]:
    """What is cached of a token answer: the tokens, when they expire, how to renew them."""
    if not isinstance(tokens, dict) or not isinstance(tokens.get("access_token"), str):
        raise UnavailableError("identity: the token endpoint answered without an access token")
    expires_in = tokens.get("expires_in")
    refresh_in = tokens.get("refresh_expires_in")
    return {
        "access_token": tokens["access_token"],
        "refresh_token": tokens.get("refresh_token") if isinstance(tokens.get("refresh_token"), str) else None,
        "expires_at": now + float(expires_in) if isinstance(expires_in, (int, float)) else None,
        "refresh_expires_at": now + float(refresh_in) if isinstance(refresh_in, (int, float)) and refresh_in else None,
        "client_id": client_id, "grant": grant, "obtained_at": now,
        "secret": secret.to_dict() if secret else None,
    }


def validate(port: IdentityPort, s: IdentitySettings, token: str, now: float, entry: str = "") -> Identity:
    header, claims = port.verify(token)
    return replace(check_claims(header, claims, s, now), token=token, entry=entry)


def _renewed(port: IdentityPort, s: IdentitySettings, region: str, who: str, doc: dict[str, Any],
             now: float) -> dict[str, Any]:
    """A new token for a cached entry about to expire: by its refresh token, or (a service account
    without one) by its secret. A refused renewal ends the session: exit 4, log in again."""
    client = str(doc.get("client_id") or s.client_id)
    secret = SecretSource.of(doc.get("secret"))
    try:
        if doc.get("refresh_token"):
            tokens = port.refresh(doc["refresh_token"], client)
            new = _entry(tokens, client_id=client, grant=str(doc.get("grant")), now=now, secret=secret)
        elif secret is not None:
            new = _entry(port.client_credentials(client, secret.read()), client_id=client,
                         grant="client_credentials", now=now, secret=secret)
        else:
            raise AuthError("no way to renew the token")
    except AuthError:
        port.tokens.delete(region, who)
        raise AuthError(f"the session for region {region!r} has ended (the token could not be renewed)",
                        hint=f"run `spotctl login -r {region}`") from None
    port.tokens.save(region, who, new)
    return new


def _usable(port: IdentityPort, s: IdentitySettings, region: str, who: str, now: float) -> Identity | None:
    doc = port.tokens.load(region, who)
    if doc is None or not isinstance(doc.get("access_token"), str):
        return None
    exp = doc.get("expires_at")
    if not isinstance(exp, (int, float)) or now >= exp - REFRESH_MARGIN:
        try:
            doc = _renewed(port, s, region, who, doc, now)
        except UnavailableError:
            if not isinstance(exp, (int, float)) or now >= exp:
                raise
            # the server is down but the token is still valid: use it
    return validate(port, s, doc["access_token"], now, who)


def renewer(port: IdentityPort, s: IdentitySettings, region: str) -> Callable[[str], Identity]:
    """``entry -> Identity``: that cached login, renewed when due (for :class:`~spotctl.core.identity.Bearer`)."""
    def renew(who: str) -> Identity:
        ident = _usable(port, s, region, who, time.time())
        if ident is None:
            raise AuthError(f"the session for region {region!r} is gone", hint=f"run `spotctl login -r {region}`")
        return ident
    return renew


def current(port: IdentityPort, s: IdentitySettings, region: str, now: float) -> Identity | None:
    """The identity a command acts as: the operator's login, else the newest service-account login; None
    when nobody logged in (the caller decides: required -> exit 4, else the OS user)."""
    names = port.tokens.names(region)
    order = ([USER] if USER in names else []) + sorted(
        (n for n in names if n.startswith("client-")),
        key=lambda n: -float((port.tokens.load(region, n) or {}).get("obtained_at") or 0))
    for who in order:
        ident = _usable(port, s, region, who, now)
        if ident is not None:
            return ident
    return None


def service_identity(port: IdentityPort, s: IdentitySettings, region: str, now: float,
                     secret: SecretSource) -> Identity:
    """The reconciler's service account: its cached token, else a new one by client credentials."""
    who = client_entry(s.service_client_id)
    doc = port.tokens.load(region, who)
    if doc is None:
        doc = _entry(port.client_credentials(s.service_client_id, secret.read()), client_id=s.service_client_id,
                     grant="client_credentials", now=now, secret=secret)
        port.tokens.save(region, who, doc)
    ident = _usable(port, s, region, who, now)
    assert ident is not None
    return ident


def require(port: IdentityPort, s: IdentitySettings, region: str, now: float, verb: str) -> Identity | None:
    """The identity of a command about to run ``verb`` on ``region``, its roles checked: None when the
    region's identity is optional and nobody logged in; AuthError (exit 4) when it is required and nobody
    did; :class:`~spotctl.core.identity.Forbidden` (exit 6) when the roles do not allow the verb."""
    ident = current(port, s, region, now)
    if ident is None:
        if s.required:
            raise AuthError(f"region {region!r} requires a login: nobody is logged in",
                            hint=f"run `spotctl login -r {region}` (or `--client-credentials` for a job)")
        return None
    authorize(verb, ident, s.roles)
    return ident


def record_refusal(store: Any, refusal: Forbidden, now: float) -> None:
    """The refusal is itself an audit record: who, which verb, the roles that would have allowed it."""
    store.audit(actor=str(refusal.actor), action="auth.refused", target=refusal.verb, result="refused",
                inputs={"verb": refusal.verb, "needs_role": refusal.allowing}, at=now)


def login_device(port: IdentityPort, s: IdentitySettings, region: str, *, show: Callable[[dict[str, Any]], None],
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> Identity:
    """The device authorization grant (RFC 8628): show the URL and code, poll at the server's interval
    (five seconds more after a ``slow_down``) until approved, denied or expired. An interactive command's
    wait, never a pass's."""
    start = port.device_start()
    show(start)
    interval = float(start.get("interval") or 5)
    deadline = clock() + float(start.get("expires_in") or 600)
    while True:
        sleep(interval)
        if clock() > deadline:
            raise AuthError("the login code expired before it was approved", hint="run `spotctl login` again")
        answer = port.device_poll(str(start["device_code"]))
        if answer == "slow_down":
            interval += 5
            continue
        if isinstance(answer, str):  # authorization_pending
            continue
        now = clock()
        entry = _entry(answer, client_id=s.client_id, grant="device", now=now)
        ident = validate(port, s, entry["access_token"], now, USER)
        port.tokens.save(region, USER, entry)
        return ident


def login_client(port: IdentityPort, s: IdentitySettings, region: str, client_id: str, secret: SecretSource,
                 now: float) -> Identity:
    """Client credentials (CI jobs, timers): the token checked, then cached with where its secret is."""
    entry = _entry(port.client_credentials(client_id, secret.read()), client_id=client_id,
                   grant="client_credentials", now=now, secret=secret)
    ident = validate(port, s, entry["access_token"], now, client_entry(client_id))
    port.tokens.save(region, client_entry(client_id), entry)
    return ident


def logout(port: IdentityPort, s: IdentitySettings, region: str) -> dict[str, Any]:
    """Revoke each cached session at the server and delete the cache. A server that cannot be reached is
    said (``revoked: false``); the cache is deleted all the same."""
    out: dict[str, Any] = {"region": region, "sessions": []}
    for who in port.tokens.names(region):
        doc = port.tokens.load(region, who) or {}
        revoked: bool | None = None
        error = None
        if doc.get("refresh_token"):
            try:
                port.logout(doc["refresh_token"], str(doc.get("client_id") or s.client_id))
                revoked = True
            except SpotctlError as e:
                revoked, error = False, e.message
        port.tokens.delete(region, who)
        out["sessions"].append({"identity": who, "revoked": revoked, "error": error})
    return out


def describe(ident: Identity | None, s: IdentitySettings | None, region: str, os_actor: str,
             now: float) -> dict[str, Any]:
    """What ``whoami`` shows: the identity, its realm and client roles, expiry, the region."""
    if ident is None:
        mode = "none" if s is None else "optional, not logged in"
        return {"region": region, "identity": mode, "actor": os_actor, "roles": [], "expires_at": None,
                "issuer": s.issuer if s else None}
    c = ident.claims
    ra, rc = c.get("realm_access"), c.get("resource_access")
    realm: dict[str, Any] = ra if isinstance(ra, dict) else {}
    clients: dict[str, Any] = rc if isinstance(rc, dict) else {}
    return {"region": region, "identity": "service account" if ident.actor.service else "user",
            "actor": str(ident.actor), **{k: v for k, v in ident.actor.to_dict().items() if k != "service"},
            "realm_roles": sorted(r for r in realm.get("roles") or () if isinstance(r, str)),
            "client_roles": {k: sorted(v.get("roles") or ()) for k, v in sorted(clients.items()) if isinstance(v, dict)},
            "roles": sorted(ident.roles), "expires_at": ident.expires_at,
            "expires_in_seconds": max(0, int(ident.expires_at - now)), "issuer": ident.issuer}


__all__ = ["Actor", "SecretSource", "current", "describe", "login_client", "login_device", "logout", "require",
           "record_refusal", "service_identity", "service_secret", "validate"]
