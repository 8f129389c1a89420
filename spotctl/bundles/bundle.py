"""Build, sign and verify a bundle's bytes (issue 16); the decisions are :func:`spotctl.core.bundle.check`'s."""

from __future__ import annotations

from typing import Any

from spotctl.core.bundle import DEFAULT_TTL_SECONDS, Checked, canonical, check, contents, manifest
from spotctl.core.config import RegionConfig

from .archive import Parts, pack, schema_check, unpack
from .signing import sign, verified


def build(region: RegionConfig, revision: int, created: int, ttl_seconds: int = DEFAULT_TTL_SECONDS) -> bytes:
    """The region's bundle, unsigned: the same configuration, revision and ``created`` give the same bytes."""
    files = {name: canonical(doc) for name, doc in contents(region).items()}
    m = manifest(region.name, revision, created, created + ttl_seconds, files)
    schema_check(m)  # what verify checks, checked before anything is written
    return pack(canonical(m), [], files, created)


def add_signature(data: bytes, private_key: Any) -> bytes:
    """``data`` with one more signature of its manifest (a signature by the same key replaces its old one)."""
    parts = unpack(data)
    new = sign(parts.manifest_bytes, private_key)
    sigs = [s for s in parts.signatures if s.get("keyid") != new["keyid"]] + [new]
    return pack(parts.manifest_bytes, sorted(sigs, key=lambda s: str(s.get("keyid"))), parts.files,
                int(parts.manifest["created"]))


def verify(data: bytes | Parts, trusted: list[Any], *, now: float, last_revision: int | None,
           region: str | None = None) -> Checked:
    parts = data if isinstance(data, Parts) else unpack(data)
    ok = verified(parts.manifest_bytes, parts.signatures, trusted)
    return check(parts.manifest, parts.files, ok, [str(s.get("keyid")) for s in parts.signatures], now=now,
                 last_revision=last_revision, region=region)


def describe(data: bytes | Parts) -> dict[str, Any]:
    """What a bundle says of itself (nothing verified): its manifest and its signatures' key ids."""
    parts = data if isinstance(data, Parts) else unpack(data)
    return {**parts.manifest, "signatures": [{"alg": s.get("alg"), "keyid": s.get("keyid")} for s in parts.signatures]}
