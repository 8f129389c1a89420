"""Ed25519 signatures of a bundle's manifest (issue 16), with ``cryptography``: PKCS#8 PEM private keys,
SubjectPublicKeyInfo PEM public keys (``spotctl bundle keygen`` writes both), a key id in each signature
(the first 16 hex digits of the SHA-256 of the raw public key), several signatures per bundle (rotation)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

from spotctl.core.errors import ConfigError

ALG = "ed25519"


def keyid(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private(path: str | Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as e:
        raise ConfigError(f"signing key {path}: cannot read it ({e.strerror})") from None
    except (ValueError, TypeError):
        raise ConfigError(f"signing key {path}: not an unencrypted PKCS#8 PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"signing key {path}: not an Ed25519 key")
    return key


def load_public(path: str | Path) -> Any:
    """A trusted key: a public key PEM, or a private key PEM (its public half)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"trusted key {path}: cannot read it ({e.strerror})") from None
    try:
        key: Any = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise ConfigError(f"trusted key {path}: not a PEM public key") from None
        if isinstance(key, Ed25519PrivateKey):
            key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"trusted key {path}: not an Ed25519 key")
    return key


def generate(private_path: Path, public_path: Path) -> str:
    """A new Ed25519 key pair: the private key PKCS#8 PEM (0600), the public key PEM; its key id."""
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                               serialization.PublicFormat.SubjectPublicKeyInfo))
    except OSError as e:
        raise ConfigError(f"cannot write the key pair {private_path}: {e.strerror}") from None
    return keyid(key.public_key())


def sign(manifest_bytes: bytes, private_key: Any) -> dict[str, str]:
    return {"alg": ALG, "keyid": keyid(private_key.public_key()),
            "sig": base64.b64encode(private_key.sign(manifest_bytes)).decode()}


def verified(manifest_bytes: bytes, signatures: list[dict[str, Any]], trusted: list[Any]) -> list[str]:
    """The key ids of the signatures that verify with a trusted key."""
    from cryptography.exceptions import InvalidSignature

    by_id = {keyid(k): k for k in trusted}
    out = []
    for s in signatures:
        key = by_id.get(str(s.get("keyid"))) if s.get("alg") == ALG else None
        if key is None or not isinstance(s.get("sig"), str):
            continue
        try:
            key.verify(base64.b64decode(s["sig"], validate=True), manifest_bytes)
        except (InvalidSignature, ValueError):
            continue
        out.append(str(s["keyid"]))
    return out
