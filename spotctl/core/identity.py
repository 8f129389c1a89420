"""Who is acting, and what they may do (issue 15): a region's identity settings, the checks a token's
claims must pass, Keycloak's roles, and which roles allow which verb. Pure: the signature is checked by
the identity adapter (``spotctl.adapters.keycloak``) before these claims are read.

A *verb* is a command path as the CLI names it (``drain``, ``audit list``, ``exercise-reclaim``); the
reconciler's pass is ``reconcile`` and the watcher's ``watch``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import AuthError, ConfigError, RefusedError

#: Signature algorithms a token may use: asymmetric only (no ``none``, no HS* shared secrets).
ALLOWED_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")

VIEWER_VERBS = ("plan", "status", "audit list", "audit show", "audit verify", "audit export", "contract check",
                "exercise-reclaim list", "exercise-reclaim status", "exercise-reclaim report", "whoami",
                "config show", "state check", "sim status", "bundle verify", "bundle status", "bundle fetch")
OPERATOR_VERBS = ("launch", "drain", "reconcile", "watch", "simulate")
ADMIN_VERBS = ("exercise-reclaim", "exercise-reclaim abort", "bundle build", "bundle sign", "bundle keygen",
               "bundle publish", "bundle serve", "state prune", "audit serve", "sim serve", "policy set", "budget set")
#: Keycloak roles (realm or client) -> the verbs they allow; a region's ``[identity.roles]`` replaces it.
DEFAULT_ROLES: dict[str, tuple[str, ...]] = {
    "spot-viewer": VIEWER_VERBS,
    "spot-operator": VIEWER_VERBS + OPERATOR_VERBS,
    "spot-admin": VIEWER_VERBS + OPERATOR_VERBS + ADMIN_VERBS,
}
#: Verbs that need no role: logging in and out, the version, and `doctor` (it must diagnose a broken identity too).
UNGATED = frozenset({"login", "logout", "version", "doctor", ""})


@dataclass(frozen=True)
class IdentitySettings:
    """``[regions.R.identity]``: the Keycloak realm whose tokens the region accepts."""

    server_url: str  # Keycloak's base URL (``https://sso.example.org/``; ``/realms/REALM`` follows)
    realm: str
    client_id: str = "spotctl"  # the public client of operators' logins (device flow)
    audience: str = ""  # what ``aud`` (or ``azp``) must name; empty: the client id
    required: bool = True  # False: an operator who has not logged in acts as the OS user
    ca_file: str | None = None
    leeway_seconds: int = 30  # clock skew allowed on exp/nbf/iat
    service_client_id: str = "spot-reconciler"  # the timer's and the watcher's service account
    service_secret_file: str | None = None  # its secret (else $CREDENTIALS_DIRECTORY/<client id>, or env)
    timeout_seconds: float = 10.0
    roles: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_ROLES))

    @property
    def issuer(self) -> str:
        return f"{self.server_url.rstrip('/')}/realms/{self.realm}"

    @property
    def wanted_audience(self) -> str:
        return self.audience or self.client_id

    @classmethod
    def of(cls, table: Mapping[str, Any] | None) -> IdentitySettings | None:
        """The settings of a schema-checked ``[identity]`` table; None when the region has none."""
        if not table:
            return None
        for k in ("server_url", "realm"):
            if not table.get(k):
                raise ConfigError(f"[identity] needs {k!r}", hint="server_url = Keycloak's base URL, realm = its realm")
        roles = dict(DEFAULT_ROLES)
        for role, verbs in (table.get("roles") or {}).items():
            roles[str(role)] = tuple(str(v) for v in verbs)
        return cls(server_url=str(table["server_url"]), realm=str(table["realm"]),
                   client_id=str(table.get("client_id", "spotctl")), audience=str(table.get("audience", "")),
                   required=bool(table.get("required", True)), ca_file=table.get("ca_file"),
                   leeway_seconds=int(table.get("leeway_seconds", 30)),
                   service_client_id=str(table.get("service_client_id", "spot-reconciler")),
                   service_secret_file=table.get("service_secret_file"),
                   timeout_seconds=float(table.get("timeout_seconds", 10.0)), roles=roles)


@dataclass(frozen=True)
class Actor:
    """Who did it: an OIDC identity (its ``preferred_username``, ``sub`` and client), a service account,
    or, in a region without identity, the OS user (``name`` only)."""

    name: str
    sub: str | None = None
    client: str | None = None
    service: bool = False

    def __str__(self) -> str:
        """As audit records and plans write it: ``alice [sub=..., client=spotctl]``; the OS user as it is."""
        if self.sub is None:
            return self.name
        return f"{self.name} [sub={self.sub}, client={self.client or '-'}]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sub": self.sub, "client": self.client, "service": self.service}


@dataclass(frozen=True)
class Identity:
    """A validated token's meaning: the actor, its roles (realm and client), and when it expires."""

    actor: Actor
    roles: frozenset[str]
    expires_at: float
    issuer: str
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    token: str = field(default="", compare=False, repr=False)  # the access token itself: never shown
    entry: str = ""  # which cached login it is (``user``, ``client-ID``)


def check_claims(header: Mapping[str, Any], claims: Mapping[str, Any], s: IdentitySettings, now: float) -> Identity:
    """The token's claims checked against the region's realm (``alg``, ``iss``, ``aud``/``azp``, ``exp``,
    ``nbf``, ``iat`` with the leeway, ``sub``); an :class:`AuthError` naming the check that failed. The
    message never holds the token or any of its values but the issuer and audience the region expects."""
    alg = header.get("alg")
    if alg not in ALLOWED_ALGS:
        raise AuthError(f"token refused: algorithm {alg!r} is not allowed",
                        hint=f"allowed: {', '.join(ALLOWED_ALGS)}", details={"check": "alg"})
    if claims.get("iss") != s.issuer:
        raise AuthError("token refused: issued by another realm (iss)", hint=f"this region accepts {s.issuer}",
                        details={"check": "iss"})
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else list(aud) if isinstance(aud, list) else []
    want = s.wanted_audience
    if want not in auds and claims.get("azp") != want:
        raise AuthError("token refused: not meant for this region (aud)",
                        hint=f"a token whose audience or azp is {want!r}: add an audience mapper in Keycloak",
                        details={"check": "aud"})
    lee = s.leeway_seconds
    exp = _number(claims.get("exp"), "exp")
    if exp is None:
        raise AuthError("token refused: it has no expiry (exp)", details={"check": "exp"})
    if now > exp + lee:
        raise AuthError("token refused: expired (exp)", hint="run `spotctl login` again", details={"check": "exp"})
    nbf = _number(claims.get("nbf"), "nbf")
    if nbf is not None and now + lee < nbf:
        raise AuthError("token refused: not valid yet (nbf)", hint="check this host's clock",
                        details={"check": "nbf"})
    iat = _number(claims.get("iat"), "iat")
    if iat is not None and iat > now + lee:
        raise AuthError("token refused: issued in the future (iat)", hint="check this host's clock",
                        details={"check": "iat"})
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise AuthError("token refused: it names no subject (sub)", details={"check": "sub"})
    client = claims.get("azp") if isinstance(claims.get("azp"), str) else None
    name = claims.get("preferred_username")
    name = name if isinstance(name, str) and name else sub
    actor = Actor(name=name, sub=sub, client=client, service=name.startswith("service-account-"))
    return Identity(actor=actor, roles=frozenset(roles_of(claims)), expires_at=exp, issuer=s.issuer, claims=claims)


class Bearer:
    """A bearer token that stays current (``value()``: what :func:`spotctl.core.secrets.secret_value` reads):
    the identity's token, renewed through ``renew`` once it is within a minute of expiry (the relay of a
    long-running watcher outlives a token)."""

    def __init__(self, identity: Identity, renew: Any):
        self._identity, self._renew = identity, renew

    def __repr__(self) -> str:
        return f"Bearer({self._identity.actor.name!r})"

    def value(self) -> str:
        import time

        if time.time() >= self._identity.expires_at - 60:
            self._identity = self._renew(self._identity.entry)
        return self._identity.token


def _number(v: Any, name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise AuthError(f"token refused: its {name} is not a number ({name})", details={"check": name})
    return float(v)


def roles_of(claims: Mapping[str, Any]) -> set[str]:
    """Keycloak's roles in a token: realm roles (``realm_access.roles``) and every client's roles
    (``resource_access.CLIENT.roles``); both count."""
    out: set[str] = set()
    realm = claims.get("realm_access")
    if isinstance(realm, Mapping):
        out.update(r for r in realm.get("roles") or () if isinstance(r, str))
    res = claims.get("resource_access")
    if isinstance(res, Mapping):
        for entry in res.values():
            if isinstance(entry, Mapping):
                out.update(r for r in entry.get("roles") or () if isinstance(r, str))
    return out


def roles_for(verb: str, roles: Mapping[str, Iterable[str]]) -> list[str]:
    """The roles that allow ``verb`` (sorted)."""
    return sorted(r for r, verbs in roles.items() if verb in verbs)


def authorize(verb: str, identity: Identity, roles: Mapping[str, Iterable[str]]) -> None:
    """Nothing when one of the identity's roles allows ``verb``; else a :class:`Forbidden` naming the
    roles that would."""
    if verb in UNGATED:
        return
    allowing = roles_for(verb, roles)
    if identity.roles.intersection(allowing):
        return
    raise Forbidden(verb, identity.actor, allowing)


class Forbidden(RefusedError):
    """The actor's roles do not allow the verb (exit 6, code ``forbidden``)."""

    code = "forbidden"

    def __init__(self, verb: str, actor: Actor, allowing: list[str]):
        need = " or ".join(allowing) if allowing else "a role that the region's [identity.roles] gives it"
        super().__init__(f"{actor.name} may not run `{verb}`: it needs the role {need}",
                         hint="ask a realm admin for the role in Keycloak (realm or client role)",
                         details={"verb": verb, "missing_role": allowing, "actor": actor.name})
        self.verb, self.actor, self.allowing = verb, actor, allowing
