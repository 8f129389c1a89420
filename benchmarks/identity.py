#!/usr/bin/env python3
"""Logged-in commands do not feel slower (issue 15): `spotctl status` with a cached, valid token against
the same command on the demo region without ``[identity]``.

The logged-in region is the demo region with ``[identity]`` whose server is a closed port: a command that
made any network call would fail (the first, untimed run of each command must succeed). Its realm key is
an RSA key made here; its JWKS sits in the identity cache as a first command would have fetched it, and the
token (signed with that key, valid for an hour, with Keycloak's claims) in the token cache as `spotctl
login` leaves it. Every timed call checks the token whole: signature, issuer, audience, expiry, roles.
Both commands run from bytecode, interleaved, same state database; median of n. Target <= 1.1x.

    .venv/bin/python benchmarks/identity.py [--quick]
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = 1.1
SERVER = "http://127.0.0.1:9/"  # the discard port: nothing answers there


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _logged_in(tmp: Path) -> Path:
    """The config of the logged-in region, its JWKS and token cached under ``tmp/cache``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    from spotctl.adapters.keycloak import KeycloakIdentity, write_private
    from spotctl.core.identity import IdentitySettings

    settings = IdentitySettings.of({"server_url": SERVER, "realm": "spot"})
    assert settings is not None
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = key.public_key().public_numbers()
    jwk = {"kty": "RSA", "kid": "bench", "use": "sig", "alg": "RS256",
           "n": _b64(pub.n.to_bytes(256, "big")), "e": _b64(pub.e.to_bytes(3, "big"))}
    port = KeycloakIdentity(settings, tmp / "cache" / "spotctl" / "identity")
    write_private(port._jwks_path, json.dumps({"issuer": settings.issuer, "fetched_at": time.time(), "keys": [jwk]}))
    now = time.time()
    claims = {"iss": settings.issuer, "aud": ["spotctl"], "azp": "spotctl", "sub": "bench-sub", "exp": now + 3600,
              "iat": now, "preferred_username": "alice", "realm_access": {"roles": ["spot-viewer"]}}
    signing = f"{_b64(json.dumps({'alg': 'RS256', 'kid': 'bench', 'typ': 'JWT'}).encode())}." \
              f"{_b64(json.dumps(claims).encode())}"
    sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
    port.tokens.save("demo", "user", {"access_token": f"{signing}.{_b64(sig)}", "refresh_token": "r",
                                      "expires_at": now + 3600, "client_id": "spotctl", "grant": "device",
                                      "obtained_at": now, "secret": None})
    cfg = tmp / "identity.toml"
    cfg.write_text(f'[regions.demo.identity]\nserver_url = "{SERVER}"\nrealm = "spot"\n')
    return cfg


def bench(quick: bool = False) -> list[dict]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run import BIN, _cli_env, _warm, timed_runs

    n = 7 if quick else 21
    with tempfile.TemporaryDirectory(prefix="spotctl-bench-identity-") as tmp:
        cfg = _logged_in(Path(tmp))
        (Path(tmp) / "plain.toml").write_text("")
        env = _cli_env(tmp, XDG_CACHE_HOME=f"{tmp}/cache")
        spotctl = str(BIN / "spotctl")
        cmds = {"status (no identity)": [spotctl, "--config", f"{tmp}/plain.toml", "status", "-o", "json"],
                "status (logged in)": [spotctl, "--config", str(cfg), "status", "-o", "json"]}
        _warm(cmds, env)  # each must succeed: the logged-in one with no network call
        med = timed_runs(cmds, n, env)
    a, b = med["status (logged in)"], med["status (no identity)"]
    ratio = a / b
    return [{"name": "spotctl status logged in (cached valid token) / without identity", "value": round(ratio, 3),
             "unit": "x", "target": f"<= {TARGET}", "pass": ratio <= TARGET,
             "detail": f"{a * 1000:.1f} ms vs {b * 1000:.1f} ms (medians of {n}, interleaved); token signature, "
                       f"claims and roles checked on every call, JWKS from the cache, no network call"}]


if __name__ == "__main__":
    for row in bench("--quick" in sys.argv):
        print(f"{'PASS' if row['pass'] else 'FAIL'}  {row['name']}: {row['value']}{row['unit']} "
              f"(target {row['target']}) — {row['detail']}")
