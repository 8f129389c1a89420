"""Smoke test of the Keycloak-compatible OIDC test peer itself (scripts/testenv/oidc), with `requests` only.

It checks what the integration tests rely on: Keycloak's endpoint layout, Keycloak's claims in the tokens
(realm_access, resource_access, preferred_username, azp, aud), the device flow finished through the
peer's TEST-ONLY approval endpoint, key rotation and revocation. Start the peer with
`scripts/testenv/oidc up` (then `eval "$(scripts/testenv/oidc env)"`).
"""

from __future__ import annotations

import base64
import json
import time

import pytest
import requests

from .conftest import oidc_peer

pytestmark = pytest.mark.integration

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


@pytest.fixture(scope="module")
def realm() -> str:
    """The realm's base URL (skips or fails when the peer is down)."""
    url, name = oidc_peer()
    return url.rstrip("/") + f"/realms/{name}"


def claims(jwt: str) -> tuple[dict, dict]:
    def part(s: str) -> dict:
        return json.loads(base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)))
    h, p, _ = jwt.split(".")
    return part(h), part(p)


def auds(payload: dict) -> list[str]:
    aud = payload["aud"]
    return [aud] if isinstance(aud, str) else aud


def oidc(realm: str, what: str) -> str:
    return f"{realm}/protocol/openid-connect/{what}"


def client_credentials(realm: str, client: str, secret: str) -> dict:
    r = requests.post(oidc(realm, "token"), data={"grant_type": "client_credentials"}, auth=(client, secret), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def device_start(realm: str) -> dict:
    r = requests.post(oidc(realm, "auth/device"), data={"client_id": "spotctl", "scope": "openid"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def device_poll(realm: str, d: dict) -> requests.Response:
    return requests.post(oidc(realm, "token"), timeout=10,
                         data={"grant_type": DEVICE_GRANT, "client_id": "spotctl", "device_code": d["device_code"]})


def approve(realm: str, d: dict, user: str, deny: bool = False) -> None:
    r = requests.post(f"{realm}/test-support/device/approve", timeout=10,
                      json={"user_code": d["user_code"], "username": user, "password": f"{user}-pw", "deny": deny})
    assert r.status_code == 200, r.text


def test_discovery_uses_keycloak_paths(realm):
    wk = requests.get(realm + "/.well-known/openid-configuration", timeout=10).json()
    assert wk["issuer"] == realm
    for key, suffix in [("token_endpoint", "token"), ("device_authorization_endpoint", "auth/device"),
                        ("jwks_uri", "certs"), ("userinfo_endpoint", "userinfo"),
                        ("introspection_endpoint", "token/introspect"), ("revocation_endpoint", "revoke"),
                        ("end_session_endpoint", "logout")]:
        assert wk[key] == oidc(realm, suffix), key
    assert requests.get(realm, timeout=10).json()["public_key"]


def test_client_credentials_token_has_keycloak_claims(realm):
    header, p = claims(client_credentials(realm, "spot-reconciler", "reconciler-secret")["access_token"])
    assert header["alg"] == "RS256" and header["kid"]
    assert header["kid"] in {k["kid"] for k in requests.get(oidc(realm, "certs"), timeout=10).json()["keys"]}
    assert "spot-operator" in p["realm_access"]["roles"]
    assert "spotctl" in auds(p)
    assert p["azp"] == "spot-reconciler"
    assert p["preferred_username"] == "service-account-spot-reconciler"
    assert p["exp"] - p["iat"] == 300
    _, other = claims(client_credentials(realm, "other-app", "other-secret")["access_token"])
    assert auds(other) == ["other-app"]


def test_device_flow_approved_through_the_test_endpoint(realm):
    d = device_start(realm)
    assert d["interval"] == 5 and d["expires_in"] == 600
    r = device_poll(realm, d)
    assert r.status_code == 400 and r.json()["error"] == "authorization_pending"
    r = device_poll(realm, d)  # sooner than the interval
    assert r.status_code == 400 and r.json()["error"] == "slow_down"
    approve(realm, d, "alice")
    time.sleep(d["interval"])
    r = device_poll(realm, d)
    assert r.status_code == 200, r.text
    tok = r.json()
    _, p = claims(tok["access_token"])
    assert p["preferred_username"] == "alice" and "spot-admin" in p["realm_access"]["roles"]
    assert p["azp"] == "spotctl" and "spotctl" in auds(p)
    assert tok["refresh_token"]

    # erin: approved before the first poll, so that poll answers at once; her role is a client role
    d = device_start(realm)
    approve(realm, d, "erin")
    r = device_poll(realm, d)
    assert r.status_code == 200, r.text
    _, p = claims(r.json()["access_token"])
    assert p["preferred_username"] == "erin"
    assert p["resource_access"]["spotctl"]["roles"] == ["spot-operator"]
    assert not {"spot-admin", "spot-operator", "spot-viewer"} & set(p["realm_access"]["roles"])

    d = device_start(realm)
    approve(realm, d, "bob", deny=True)
    assert device_poll(realm, d).json()["error"] == "access_denied"
    d = device_start(realm)
    requests.post(f"{realm}/test-support/device/expire", json={"user_code": d["user_code"]}, timeout=10).raise_for_status()
    assert device_poll(realm, d).json()["error"] == "expired_token"


def test_rotate_keys_changes_the_kid(realm):
    old, _ = claims(client_credentials(realm, "spot-ci", "ci-secret")["access_token"])
    r = requests.post(f"{realm}/test-support/rotate-keys", timeout=10)
    assert r.status_code == 200, r.text
    kid = r.json()["kid"]
    assert kid != old["kid"]
    new, p = claims(client_credentials(realm, "spot-ci", "ci-secret")["access_token"])
    assert new["kid"] == kid and "spot-viewer" in p["realm_access"]["roles"]
    assert kid in {k["kid"] for k in requests.get(oidc(realm, "certs"), timeout=10).json()["keys"]}


def test_revoked_refresh_token_no_longer_refreshes(realm):
    d = device_start(realm)
    approve(realm, d, "carol")
    tok = device_poll(realm, d).json()
    refresh = {"grant_type": "refresh_token", "client_id": "spotctl", "refresh_token": tok["refresh_token"]}
    assert requests.post(oidc(realm, "token"), data=refresh, timeout=10).status_code == 200
    r = requests.post(oidc(realm, "revoke"), timeout=10, data={
        "client_id": "spotctl", "token": tok["refresh_token"], "token_type_hint": "refresh_token"})
    assert r.status_code == 200, r.text
    r = requests.post(oidc(realm, "token"), data=refresh, timeout=10)
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"

    d = device_start(realm)  # Keycloak's logout with the refresh token ends the session
    approve(realm, d, "dave")
    tok = device_poll(realm, d).json()
    r = requests.post(oidc(realm, "logout"), data={"client_id": "spotctl", "refresh_token": tok["refresh_token"]}, timeout=10)
    assert r.status_code == 204, r.text
    refresh["refresh_token"] = tok["refresh_token"]
    assert requests.post(oidc(realm, "token"), data=refresh, timeout=10).json()["error"] == "invalid_grant"
