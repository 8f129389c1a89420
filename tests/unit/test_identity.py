"""Tokens checked before use (issue 15): signature against the realm's keys, then the claims; roles -> verbs.

Tokens are signed here with real keys (``cryptography``); the realm's JWKS is served by a real HTTP server
on loopback, so that the refetch on an unknown ``kid`` (a key rotation) goes over the wire.
"""

from __future__ import annotations

import base64
import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from spotctl.adapters.keycloak import KeycloakIdentity, TokenCache
from spotctl.core.errors import AuthError, ExitCode
from spotctl.core.identity import Forbidden, IdentitySettings, authorize, check_claims, roles_of

NOW = 1_780_000_000.0


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def num(n: int) -> str:
    return b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


class Key:
    def __init__(self, kid: str, kind: str = "RSA"):
        self.kid, self.kind = kid, kind
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "RSA" else \
            ec.generate_private_key(ec.SECP256R1())

    def jwk(self) -> dict:
        pub = self.private.public_key().public_numbers()
        if self.kind == "RSA":
            return {"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256", "n": num(pub.n), "e": num(pub.e)}
        return {"kty": "EC", "kid": self.kid, "use": "sig", "alg": "ES256", "crv": "P-256", "x": num(pub.x),
                "y": num(pub.y)}

    def sign(self, claims: dict, header: dict | None = None) -> str:
        h = {"alg": "RS256" if self.kind == "RSA" else "ES256", "typ": "JWT", "kid": self.kid, **(header or {})}
        signing = f"{b64(json.dumps(h).encode())}.{b64(json.dumps(claims).encode())}".encode()
        if self.kind == "RSA":
            sig = self.private.sign(signing, padding.PKCS1v15(), hashes.SHA256())
        else:
            r, s = decode_dss_signature(self.private.sign(signing, ec.ECDSA(hashes.SHA256())))
            sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        return f"{signing.decode()}.{b64(sig)}"


class Realm(ThreadingHTTPServer):
    """The realm's JWKS endpoint (``/realms/spot/protocol/openid-connect/certs``), keys changeable."""

    def __init__(self) -> None:
        self.keys: list[dict] = []
        self.fetches = 0
        realm = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/realms/spot/protocol/openid-connect/certs":
                    self.send_error(404)
                    return
                realm.fetches += 1
                body = json.dumps({"keys": realm.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


@pytest.fixture
def realm():
    r = Realm()
    yield r
    r.shutdown()
    r.server_close()


@pytest.fixture
def key():
    return Key("k1")


def settings_of(realm: Realm, **kw) -> IdentitySettings:
    return IdentitySettings.of({"server_url": realm.url, "realm": "spot", **kw})  # type: ignore[return-value]


def claims_for(s: IdentitySettings, **kw) -> dict:
    c = {"iss": s.issuer, "aud": ["spotctl", "account"], "azp": "spotctl", "sub": "5f1c-alice", "exp": NOW + 300,
         "iat": NOW - 5, "nbf": NOW - 5, "preferred_username": "alice",
         "realm_access": {"roles": ["spot-operator", "offline_access"]},
         "resource_access": {"spotctl": {"roles": ["spot-viewer"]}}}
    c.update(kw)
    return {k: v for k, v in c.items() if v is not None}


def check(port: KeycloakIdentity, token: str, now: float = NOW):
    header, claims = port.verify(token)
    return check_claims(header, claims, port.settings, now)


def refused(port: KeycloakIdentity, token: str, check_name: str, now: float = NOW) -> AuthError:
    with pytest.raises(AuthError) as e:
        check(port, token, now)
    assert e.value.details.get("check") == check_name, e.value.message
    assert e.value.exit_code == ExitCode.AUTH
    text = e.value.message + (e.value.hint or "")
    for part in token.split("."):
        assert not part or part[:12] not in text, "a message holds a piece of the token"
    return e.value


def test_a_token_signed_by_the_realm_names_its_actor_and_roles(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    ident = check(port, key.sign(claims_for(port.settings)))
    assert str(ident.actor) == "alice [sub=5f1c-alice, client=spotctl]"
    assert ident.roles == {"spot-operator", "offline_access", "spot-viewer"}  # realm and client roles both count
    assert realm.fetches == 1
    check(port, key.sign(claims_for(port.settings)))
    assert realm.fetches == 1, "the JWKS is cached: no network call while the key is known"


def test_an_ec_key_verifies_too(realm, tmp_path):
    k = Key("ec1", "EC")
    realm.keys = [k.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    assert check(port, k.sign(claims_for(port.settings))).actor.name == "alice"


def test_a_forged_signature_is_refused(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    forger = Key("k1")  # same kid, another private key
    refused(port, forger.sign(claims_for(port.settings)), "signature")
    good = key.sign(claims_for(port.settings))
    h, _, s = good.split(".")
    altered = f"{h}.{b64(json.dumps(claims_for(port.settings, preferred_username='root')).encode())}.{s}"
    refused(port, altered, "signature")


def test_alg_none_and_hs256_are_refused_before_any_key_is_used(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    claims = b64(json.dumps(claims_for(port.settings)).encode())
    none = f"{b64(json.dumps({'alg': 'none', 'kid': 'k1'}).encode())}.{claims}."
    assert "'none' is not allowed" in refused(port, none, "alg").message
    # HS256 "signed" with the public key's bytes as the shared secret: the classic confusion attack
    head = b64(json.dumps({"alg": "HS256", "kid": "k1"}).encode())
    mac = hmac.HMAC(json.dumps(key.jwk()).encode(), hashes.SHA256())
    mac.update(f"{head}.{claims}".encode())
    refused(port, f"{head}.{claims}.{b64(mac.finalize())}", "alg")
    assert realm.fetches == 0


def test_the_claims_are_checked_each_with_its_own_message(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    s = port.settings
    assert "another realm" in refused(port, key.sign(claims_for(s, iss="http://evil/realms/spot")), "iss").message
    assert "not meant for this region" in refused(port, key.sign(claims_for(s, aud="other-app", azp="other-app")),
                                                  "aud").message
    assert "expired" in refused(port, key.sign(claims_for(s, exp=NOW - 31)), "exp").message
    check(port, key.sign(claims_for(s, exp=NOW - 29)))  # within the leeway (30 s)
    assert "not valid yet" in refused(port, key.sign(claims_for(s, nbf=NOW + 120)), "nbf").message
    assert "in the future" in refused(port, key.sign(claims_for(s, iat=NOW + 120)), "iat").message
    refused(port, key.sign(claims_for(s, exp=None)), "exp")
    refused(port, key.sign(claims_for(s, exp="soon")), "exp")
    refused(port, key.sign(claims_for(s, sub=None)), "sub")
    refused(port, "not-a-jwt", "format")


def test_an_unknown_kid_refetches_the_keys_once_then_a_rotated_key_is_accepted(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    check(port, key.sign(claims_for(port.settings)))
    new = Key("k2")
    realm.keys = [key.jwk(), new.jwk()]  # the realm rotated its keys
    assert check(port, new.sign(claims_for(port.settings))).actor.name == "alice"
    assert realm.fetches == 2
    stranger = Key("k-unknown")
    refused(port, stranger.sign(claims_for(port.settings)), "kid")
    assert realm.fetches == 3, "an unknown kid costs one fetch, not a loop"


def test_the_caches_are_private_files(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path / "identity")
    check(port, key.sign(claims_for(port.settings)))
    cache = TokenCache(tmp_path / "identity" / "tokens")
    p = cache.save("east", "user", {"access_token": "x"})
    for f in (p, next((tmp_path / "identity").glob("jwks-*.json"))):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o700
    assert cache.load("east", "user") == {"access_token": "x"}
    assert cache.names("east") == ["user"]
    assert not list(p.parent.glob(".*.tmp")), "written through a temporary file, renamed into place"
    assert cache.delete("east", "user") and cache.load("east", "user") is None


def test_roles_decide_the_verbs(realm, key, tmp_path):
    realm.keys = [key.jwk()]
    port = KeycloakIdentity(settings_of(realm), tmp_path)
    s = port.settings
    viewer = check(port, key.sign(claims_for(s, realm_access={"roles": ["spot-viewer"]}, resource_access={})))
    authorize("status", viewer, s.roles)
    authorize("audit verify", viewer, s.roles)
    with pytest.raises(Forbidden) as e:
        authorize("drain", viewer, s.roles)
    assert e.value.code == "forbidden" and e.value.exit_code == ExitCode.REFUSED
    assert e.value.details["missing_role"] == ["spot-admin", "spot-operator"]
    client_op = check(port, key.sign(claims_for(s, realm_access={"roles": []},
                                                resource_access={"spotctl": {"roles": ["spot-operator"]}})))
    authorize("drain", client_op, s.roles)  # a client role counts as a realm role does
    with pytest.raises(Forbidden):
        authorize("exercise-reclaim", client_op, s.roles)
    custom = settings_of(realm, roles={"night-shift": ["drain", "status"]})
    night = check(port, key.sign(claims_for(s, realm_access={"roles": ["night-shift"]}, resource_access={})))
    authorize("drain", night, custom.roles)
    with pytest.raises(Forbidden):
        authorize("launch", night, custom.roles)


def test_roles_of_ignores_what_is_not_a_role_list():
    assert roles_of({"realm_access": {"roles": ["a", 3]}, "resource_access": {"c": "x", "d": {"roles": ["b"]}}}) == {"a", "b"}
    assert roles_of({"realm_access": "admin"}) == set()


def test_a_region_without_server_or_realm_is_a_config_error():
    from spotctl.core.errors import ConfigError

    with pytest.raises(ConfigError):
        IdentitySettings.of({"realm": "spot"})
    assert IdentitySettings.of(None) is None


def test_audit_list_actor_matches_a_name_sub_or_client(tmp_path):
    from spotctl.state.audit import AuditFilter
    from spotctl.state.store import Store

    store = Store.open(tmp_path / "r.db", "r")
    actors = ["alice [sub=s-1, client=spotctl]", "bob [sub=s-2, client=spotctl]", "root@vm",
              "service-account-spot-reconciler [sub=s-3, client=spot-reconciler]"]
    for i, a in enumerate(actors):
        store.audit(actor=a, action="node.launch", target=f"n{i}", result="ok", inputs={}, at=NOW + i)

    def by(actor: str) -> list[str]:
        return [r["actor"] for r in store.iter_audit(AuditFilter(actor=actor))]

    assert by("alice") == [actors[0]]
    assert by("s-2") == [actors[1]]
    assert by("spotctl") == actors[:2]
    assert by("spot-reconciler") == [actors[3]]
    assert by("root@vm") == [actors[2]]
    assert by(actors[1]) == [actors[1]]
    assert by("spot%") == [] and by("s_1") == [] and by("ali") == []
    store.close()
