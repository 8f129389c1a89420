"""The use cases of ``spotctl bundle`` (issue 16): build a region's bundle, sign it, verify it with the
region's rollback state (the last accepted revision, kept in its state database)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from spotctl.core.bundle import DEFAULT_TTL_SECONDS, BundleError
from spotctl.core.errors import UsageError
from spotctl.ops.runtime import Runtime

ACCEPTED = "bundle:accepted_revision"


def last_accepted(rt: Runtime) -> int | None:
    v = rt.store.get_value(ACCEPTED)
    return int(v) if v is not None and v.isdigit() else None


def created_at(env: dict[str, str] | None = None, now: float | None = None) -> int:
    """``SOURCE_DATE_EPOCH`` when set (as reproducible-build tools set it), else now."""
    env = dict(os.environ) if env is None else env
    sde = env.get("SOURCE_DATE_EPOCH")
    if sde is not None and sde != "":
        if not sde.isdigit() or len(sde) > 12:
            raise UsageError(f"SOURCE_DATE_EPOCH must be a whole number of seconds, not {sde[:40]!r}")
        return int(sde)
    import time

    return int(now if now is not None else time.time())


def build(rt: Runtime, *, revision: int | None, ttl_seconds: int = DEFAULT_TTL_SECONDS,
          created: int | None = None) -> tuple[bytes, dict[str, Any]]:
    """The region's bundle (unsigned) and what it is: revision (default: the last accepted + 1), created,
    expires, files."""
    from spotctl.bundles.bundle import build as make
    from spotctl.bundles.bundle import describe

    rev = revision if revision is not None else (last_accepted(rt) or 0) + 1
    data = make(rt.region, rev, created if created is not None else created_at(), ttl_seconds)
    return data, describe(data)


def sign(data: bytes, key_path: str | Path) -> tuple[bytes, dict[str, Any]]:
    from spotctl.bundles.bundle import add_signature, describe
    from spotctl.bundles.signing import load_private

    out = add_signature(data, load_private(key_path))
    return out, describe(out)


def verify(rt: Runtime, data: bytes, trust: list[str], *, accept: bool = True) -> dict[str, Any]:
    """Every check (:func:`spotctl.core.bundle.check`) against the region's last accepted revision; a bundle
    that passes becomes the last accepted (``accept``), and the verification is an audit record either
    way."""
    from spotctl.bundles.bundle import verify as check
    from spotctl.bundles.signing import load_public

    if not trust:
        raise UsageError("verify needs at least one trusted key: --trust PUBLIC_KEY_PEM")
    keys = [load_public(t) for t in trust]
    now = rt.now()
    last = last_accepted(rt)
    try:
        ok = check(data, keys, now=now, last_revision=last, region=rt.region.name)
    except BundleError as e:
        rt.store.audit(actor=rt.actor, action="bundle.verify", target=rt.region.name, result="refused",
                       inputs={"code": e.code, "reason": e.message, "last_accepted": last}, at=now)
        raise
    m = ok.manifest
    with rt.store.tx():
        if accept and (last is None or ok.revision > last):
            rt.store.set_value(ACCEPTED, str(ok.revision), now)
        rt.store.audit(actor=rt.actor, action="bundle.verify", target=rt.region.name, result="ok",
                       inputs={"revision": ok.revision, "keyids": list(ok.keyids), "expires": m["expires"]}, at=now)
    return {"region": m["region"], "revision": ok.revision, "created": m["created"], "expires": m["expires"],
            "keyids": list(ok.keyids), "files": sorted(m["files"]), "last_accepted": max(last or 0, ok.revision)
            if accept else last}


def fetch(client: Any, out: Path, trust: list[str], *, now: float, region: str) -> dict[str, Any]:
    """The agent side: fetch the served bundle (If-None-Match: the kept one's ETag), verify it (rollback
    against the kept one's revision), write it atomically. A bundle that fails is not written: the last good
    one stays, and the failure is raised."""
    import hashlib

    from spotctl.bundles.bundle import verify as check
    from spotctl.bundles.client import write_atomic
    from spotctl.bundles.signing import load_public

    if not trust:
        raise UsageError("fetch needs at least one trusted key: --trust PUBLIC_KEY_PEM")
    keys = [load_public(t) for t in trust]
    kept_rev = kept_etag = None
    if out.exists():
        old = out.read_bytes()
        try:
            kept = check(old, keys, now=now, last_revision=None, region=region)
            kept_rev, kept_etag = kept.revision, f'"{hashlib.sha256(old).hexdigest()}"'
        except BundleError:
            pass  # the kept one no longer verifies (expired, say): fetch whatever is served
    data, etag = client.fetch(kept_etag)
    if data is None:
        return {"changed": False, "revision": kept_rev, "etag": etag, "out": str(out)}
    ok = check(data, keys, now=now, last_revision=kept_rev, region=region)
    write_atomic(out, data)
    return {"changed": True, "revision": ok.revision, "previous_revision": kept_rev, "etag": etag,
            "keyids": list(ok.keyids), "expires": ok.manifest["expires"], "out": str(out)}


def server_for(rt: Runtime, data_dir: Path, trust: list[str], get: list[str], put: list[str]) -> Any:
    """The region's bundle server; its publishes, rejections and refusals are audit records of the region
    (the actor: the peer's SPIFFE ID)."""
    from spotctl.bundles.server import BundleServer
    from spotctl.bundles.signing import load_public

    if not trust:
        raise UsageError("serve needs at least one trusted signing key: --trust PUBLIC_KEY_PEM")
    if not get and not put:
        raise UsageError("serve allows nobody: give --allow-get and --allow-put SPIFFE ID patterns")

    def audit(**kw: Any) -> None:
        rt.store.audit(at=rt.now(), **kw)

    return BundleServer(rt.region.name, data_dir, [load_public(t) for t in trust], get, put, audit=audit)
