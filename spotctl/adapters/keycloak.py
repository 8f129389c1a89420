"""Keycloak (issue 15): the OAuth flows through python-keycloak, and the check of a token's signature
against the realm's JWKS. Implements :class:`spotctl.core.ports.IdentityPort`.

Flows (python-keycloak, imported when a flow runs: never for a command whose cached token is valid):
the device authorization grant (RFC 8628) for operators, client credentials for service accounts,
refresh, and logout (the session ends at the server, so its refresh token is revoked).

Signatures are checked here with ``cryptography`` alone (RS*, PS*, ES*; no ``none``, no HS*), against the
realm's JWKS cached in a file of the identity cache: fetched when missing, and once more when a token
names a ``kid`` the cache does not hold (the realm rotated its keys). Every command checks its token, so
this path stays small: no JOSE library is imported for it (jwcrypto alone takes ~150 ms to import).
Messages never hold a token, a secret or a token's values.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from spotctl.core.errors import AuthError, ConfigError, SpotctlError, TemporaryError, UnavailableError
from spotctl.core.identity import ALLOWED_ALGS, IdentitySettings

log = logging.getLogger(__name__)

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
#: RFC 8628 §3.5 answers of a device-code poll that are not a failure of the flow
DEVICE_WAIT = ("authorization_pending", "slow_down")


def _b64(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise AuthError("token refused: it is not a JWT (base64)", details={"check": "format"}) from None


def split_jwt(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
    """A compact JWS's header, claims, signing input and signature (nothing checked but the form)."""
    if not isinstance(token, str) or token.count(".") != 2:
        raise AuthError("token refused: it is not a JWT (three dot-separated parts)", details={"check": "format"})
    h, p, s = token.split(".")
    try:
        header, claims = json.loads(_b64(h)), json.loads(_b64(p))
    except (ValueError, UnicodeDecodeError):
        raise AuthError("token refused: it is not a JWT (JSON)", details={"check": "format"}) from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise AuthError("token refused: it is not a JWT (JSON objects)", details={"check": "format"})
    return header, claims, f"{h}.{p}".encode(), _b64(s)


def _public_key(jwk: dict[str, Any], alg: str) -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    def num(name: str) -> int:
        v = jwk.get(name)
        if not isinstance(v, str):
            raise AuthError(f"token refused: the realm's key has no {name!r}", details={"check": "signature"})
        return int.from_bytes(_b64(v), "big")

    kty = jwk.get("kty")
    if alg[:2] in ("RS", "PS"):
        if kty != "RSA":
            raise AuthError("token refused: its algorithm does not match the realm's key", details={"check": "alg"})
        return rsa.RSAPublicNumbers(num("e"), num("n")).public_key()
    curves = {"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1(), "P-521": ec.SECP521R1()}
    if kty != "EC" or jwk.get("crv") not in curves:
        raise AuthError("token refused: its algorithm does not match the realm's key", details={"check": "alg"})
    return ec.EllipticCurvePublicNumbers(num("x"), num("y"), curves[jwk["crv"]]).public_key()


def verify_signature(header: dict[str, Any], signing_input: bytes, signature: bytes, jwk: dict[str, Any]) -> None:
    """Nothing when ``signature`` is ``jwk``'s over ``signing_input`` with the header's algorithm (one of
    :data:`ALLOWED_ALGS`); an AuthError otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    alg = header.get("alg")
    if alg not in ALLOWED_ALGS:
        raise AuthError(f"token refused: algorithm {alg!r} is not allowed", hint=f"allowed: {', '.join(ALLOWED_ALGS)}",
                        details={"check": "alg"})
    if jwk.get("alg") not in (None, alg) or jwk.get("use") not in (None, "sig"):
        raise AuthError("token refused: its algorithm does not match the realm's key", details={"check": "alg"})
    digest = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[alg[2:]]
    key = _public_key(jwk, alg)
    try:
        if alg.startswith("RS"):
            key.verify(signature, signing_input, padding.PKCS1v15(), digest)
        elif alg.startswith("PS"):
            key.verify(signature, signing_input, padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size),
                       digest)
        else:
            half = len(signature) // 2
            if len(signature) % 2 or not half:
                raise InvalidSignature()
            der = encode_dss_signature(int.from_bytes(signature[:half], "big"), int.from_bytes(signature[half:], "big"))
            key.verify(der, signing_input, ec.ECDSA(digest))
    except InvalidSignature:
        raise AuthError("token refused: its signature does not verify against the realm's keys (signature)",
                        hint="a forged or altered token; run `spotctl login` again", details={"check": "signature"}) from None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (0600, in a 0700 directory): a
    temporary file in the same directory, synced, then renamed over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """The identity cache: ``$XDG_CACHE_HOME/spotctl/identity`` (default ``~/.cache/spotctl/identity``)."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spotctl" / "identity"


class TokenCache:
    """Tokens per region and identity (``user``: the operator's login; ``client-ID``: a service account),
    one JSON file each under the identity cache, mode 0600, written atomically."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, region: str, who: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in who)
        return self.root / region / f"{safe}.json"

    def load(self, region: str, who: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path(region, who).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            log.warning("identity: the cached tokens of %s/%s are unreadable; ignoring them", region, who)
            return None
        return doc if isinstance(doc, dict) else None

    def save(self, region: str, who: str, doc: dict[str, Any]) -> Path:
        p = self.path(region, who)
        write_private(p, json.dumps(doc, sort_keys=True))
        return p

    def delete(self, region: str, who: str) -> bool:
        try:
            self.path(region, who).unlink()
            return True
        except FileNotFoundError:
            return False

    def names(self, region: str) -> list[str]:
        d = self.root / region
        return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


class KeycloakIdentity:
    """One region's Keycloak realm. ``cache_dir``: where the realm's JWKS is kept (the identity cache)."""

    def __init__(self, settings: IdentitySettings, cache_dir: Path):
        self.settings = settings
        self.cache_dir = Path(cache_dir)
        self.jwks_fetches = 0  # network fetches of the JWKS (tests, diagnostics)
        self.tokens = TokenCache(self.cache_dir / "tokens")

    def __repr__(self) -> str:
        return f"KeycloakIdentity({self.settings.issuer!r})"

    @classmethod
    def from_settings(cls, settings: IdentitySettings, cache_dir: Path) -> KeycloakIdentity:
        if settings.ca_file and not os.path.isfile(settings.ca_file):
            raise ConfigError(f"identity: ca_file {settings.ca_file} does not exist")
        return cls(settings, cache_dir)

    # -- the token's signature -----------------------------------------------------------------

    @property
    def _jwks_path(self) -> Path:
        import hashlib

        return self.cache_dir / f"jwks-{hashlib.sha256(self.settings.issuer.encode()).hexdigest()[:16]}.json"

    def _cached_keys(self) -> list[dict[str, Any]]:
        try:
            doc = json.loads(self._jwks_path.read_text())
        except (OSError, ValueError):
            return []
        keys = doc.get("keys") if isinstance(doc, dict) and doc.get("issuer") == self.settings.issuer else None
        return [k for k in keys if isinstance(k, dict)] if isinstance(keys, list) else []

    def _fetch_keys(self) -> list[dict[str, Any]]:
        doc = self._get(f"{self.settings.issuer}/protocol/openid-connect/certs")
        keys = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(keys, list):
            raise TemporaryError(f"identity: {self.settings.issuer} answered its JWKS without keys")
        self.jwks_fetches += 1
        write_private(self._jwks_path, json.dumps({"issuer": self.settings.issuer, "fetched_at": time.time(),
                                                   "keys": keys}))
        return [k for k in keys if isinstance(k, dict)]

    def verify(self, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The token's header and claims once its signature verifies against the realm's key of its ``kid``
        (the JWKS fetched again once when the cache lacks that kid). Claims are not checked here."""
        header, claims, signing_input, signature = split_jwt(token)
        if header.get("alg") not in ALLOWED_ALGS:  # before any key is looked for: alg none, HS256
            raise AuthError(f"token refused: algorithm {header.get('alg')!r} is not allowed",
                            hint=f"allowed: {', '.join(ALLOWED_ALGS)}", details={"check": "alg"})
        kid = header.get("kid")
        keys = self._cached_keys()
        jwk = self._pick(keys, kid)
        if jwk is None:
            jwk = self._pick(self._fetch_keys(), kid)
        if jwk is None:
            raise AuthError("token refused: signed with a key the realm does not publish (kid)",
                            hint="a forged token, or one of another realm", details={"check": "kid"})
        verify_signature(header, signing_input, signature, jwk)
        return header, claims

    @staticmethod
    def _pick(keys: list[dict[str, Any]], kid: Any) -> dict[str, Any] | None:
        if kid is None:
            sig = [k for k in keys if k.get("use") in (None, "sig")]
            return sig[0] if len(sig) == 1 else None
        return next((k for k in keys if k.get("kid") == kid), None)

    def _get(self, url: str) -> Any:
        import requests

        from spotctl.adapters import _http

        with requests.Session() as session:
            r = _http.send(session, "GET", url, what="identity: GET certs", peer=f"Keycloak at {self.settings.issuer}",
                           timeout=self.settings.timeout_seconds, verify=self.settings.ca_file or True,
                           unreachable_hint="check [identity] server_url and the network")
        if r.status_code != 200:
            raise TemporaryError(f"identity: {url} answered HTTP {r.status_code}")
        try:
            return r.json()
        except ValueError:
            raise TemporaryError(f"identity: {url} answered something that is not JSON") from None

    # -- flows (python-keycloak) ---------------------------------------------------------------

    def _oidc(self, client_id: str, secret: str | None = None) -> Any:
        from keycloak import KeycloakOpenID

        s = self.settings
        return KeycloakOpenID(server_url=s.server_url.rstrip("/") + "/", realm_name=s.realm, client_id=client_id,
                              client_secret_key=secret, verify=s.ca_file or True, timeout=int(max(1, s.timeout_seconds)))

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        from keycloak.exceptions import KeycloakConnectionError, KeycloakError

        try:
            return fn(*args, **kw)
        except KeycloakConnectionError:
            raise UnavailableError(f"identity: cannot reach {self.settings.issuer} ({what})",
                                   hint="check [identity] server_url and the network") from None
        except KeycloakError as e:
            raise oauth_error(e, what, self.settings.issuer) from None

    def device_start(self) -> dict[str, Any]:
        """Start a device authorization: the device code, user code, verification URLs, interval, expiry."""
        oidc = self._oidc(self.settings.client_id)
        out = self._call("device authorization", oidc.device)
        if not isinstance(out, dict) or not out.get("device_code") or not out.get("user_code"):
            raise TemporaryError(f"identity: {self.settings.issuer} answered the device authorization without codes")
        return out

    def device_poll(self, device_code: str) -> dict[str, Any] | str:
        """One poll of the token endpoint: the tokens, or ``authorization_pending`` / ``slow_down``. A denied
        or expired authorization is an AuthError."""
        oidc = self._oidc(self.settings.client_id)
        try:
            return self._call("device token", oidc.token, grant_type=DEVICE_GRANT, device_code=device_code)
        except AuthError as e:
            if e.details.get("oauth_error") in DEVICE_WAIT:
                return str(e.details["oauth_error"])
            raise

    def client_credentials(self, client_id: str, secret: str) -> dict[str, Any]:
        oidc = self._oidc(client_id, secret)
        return dict(self._call("client credentials", oidc.token, grant_type="client_credentials"))

    def refresh(self, refresh_token: str, client_id: str) -> dict[str, Any]:
        oidc = self._oidc(client_id)
        return dict(self._call("refresh", oidc.refresh_token, refresh_token))

    def logout(self, refresh_token: str, client_id: str) -> None:
        """End the session at the server: its refresh token is revoked."""
        oidc = self._oidc(client_id)
        self._call("logout", oidc.logout, refresh_token)


def oauth_error(e: Exception, what: str, issuer: str) -> SpotctlError:
    """A python-keycloak error as ours: the OAuth ``error`` of a 400/401 answer (RFC 6749 §5.2, RFC 8628
    §3.5) as an AuthError that names it; 5xx as temporary. Never the answer's body (it may echo a token)."""
    code = getattr(e, "response_code", None)
    body = getattr(e, "response_body", b"") or b""
    try:
        err = json.loads(body).get("error") if body else None
    except (ValueError, AttributeError):
        err = None
    err = err if isinstance(err, str) and err.replace("_", "").isalnum() else None
    if isinstance(code, int) and code >= 500:
        return TemporaryError(f"identity: {issuer} failed the {what} (HTTP {code})")
    meaning = {"authorization_pending": "not approved yet", "slow_down": "polled too fast",
               "expired_token": "the code expired before it was approved: run `spotctl login` again",
               "access_denied": "the login was denied", "invalid_grant": "the session is over (expired or revoked)",
               "invalid_client": "the client id or secret is wrong", "unauthorized_client":
               "this client may not use this grant (enable it in Keycloak)"}.get(err or "", "refused")
    return AuthError(f"identity: {what} refused by {issuer}: {err or f'HTTP {code}'} ({meaning})",
                     details={"oauth_error": err, "status": code})
