"""Bundles for node agents (issue 16): what a bundle holds, its manifest, and the checks a bundle must pass
before anything serves or uses it. Pure: the tar file, the signatures (Ed25519) and the state of the last
accepted revision are handled in :mod:`spotctl.bundles`; they hand the facts to :func:`check`.

A bundle is a gzip'd tar of ``manifest.json`` (canonical JSON: name, region, revision, created, expires,
schema version, and the SHA-256 and size of every file), ``signatures.json`` (each an Ed25519 signature of
the manifest's bytes, with its key id) and the files under ``files/``. The manifest's JSON Schema is
``docs/bundles/manifest.schema.json``; :data:`MANIFEST_SCHEMA` is the same document.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import RegionConfig
from .contract import TERMS
from .errors import ExitCode, SpotctlError

SCHEMA_VERSION = 1
NAME = "spotctl-bundle"
DEFAULT_TTL_SECONDS = 7 * 86_400
#: The entries a bundle's tar may hold besides ``files/*``.
MANIFEST, SIGNATURES = "manifest.json", "signatures.json"

MANIFEST_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://spotctl.dev/schemas/bundle-manifest-1.json",
    "title": "spotctl bundle manifest",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "region", "revision", "created", "expires", "schema_version", "files"],
    "properties": {
        "name": {"const": NAME},
        "schema_version": {"const": SCHEMA_VERSION},
        "region": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "revision": {"type": "integer", "minimum": 1, "maximum": 9007199254740991},
        "created": {"type": "integer", "minimum": 0},
        "expires": {"type": "integer", "minimum": 0},
        "files": {
            "type": "object", "minProperties": 1, "maxProperties": 64,
            "propertyNames": {"pattern": "^[a-z0-9][a-z0-9_.-]{0,63}\\.json$"},
            "additionalProperties": {
                "type": "object", "additionalProperties": False, "required": ["sha256", "size"],
                "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                               "size": {"type": "integer", "minimum": 0, "maximum": 16777216}},
            },
        },
    },
}


class BundleError(SpotctlError):
    """A bundle that must not be served or used; each kind has its own code and exit code."""

    code = "bundle_invalid"
    exit_code = ExitCode.BUNDLE_INVALID


class BundleInvalid(BundleError):
    """Not a bundle: not a tar, a manifest that breaks its schema, an entry that is not a plain file."""


class BundleUntrusted(BundleError):
    code = "bundle_untrusted"
    exit_code = ExitCode.BUNDLE_UNTRUSTED


class BundleDigest(BundleError):
    code = "bundle_digest"
    exit_code = ExitCode.BUNDLE_DIGEST


class BundleFiles(BundleError):
    code = "bundle_files"
    exit_code = ExitCode.BUNDLE_FILES


class BundleExpired(BundleError):
    code = "bundle_expired"
    exit_code = ExitCode.BUNDLE_EXPIRED


class BundleRollback(BundleError):
    code = "bundle_rollback"
    exit_code = ExitCode.BUNDLE_ROLLBACK


def canonical(obj: Any) -> bytes:
    """The one encoding of a bundle's JSON: sorted keys, no spaces, ASCII, a final newline."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def contents(region: RegionConfig) -> dict[str, Any]:
    """What a region's bundle tells its node agents, from the region's configuration alone (so that the same
    configuration gives the same bytes): the contract's five terms and what each needs, the pools'
    policies, how notices and advisories are handled, checkpoint hints, and the no-notice policy."""
    p = region.policy
    pools = {name: {"kind": str(s.kind), "class": str(s.pool_class), "az": s.az, "shape": s.shape.to_dict(),
                    "max_nodes": s.max_nodes, "boot_seconds": s.boot_seconds, "cleaning_seconds": s.cleaning_seconds,
                    "kubernetes": {"labels": dict(s.kubernetes.labels), "taints": list(s.kubernetes.taints)},
                    "slurm": {"partition": s.slurm.partition, "features": list(s.slurm.features)}}
             for name, s in sorted(region.pools.items())}
    return {
        "contract.json": {"terms": list(TERMS), "restore": {"notices": p.contract_restore_notices,
                                                            "hold_seconds": p.contract_restore_hold_seconds},
                          "meaning": {"notice": "a hard notice before each reclaim, ahead of its deadline",
                                      "advisory": "advisories ahead of planned reclaims",
                                      "rate_card": "a current rate card with a price for the pool",
                                      "reservations": "the reservation calendar is readable",
                                      "reclaim_api": "the provider's reclaim API answers"}},
        "pools.json": {"pools": pools, "disruption_budget_pct": p.disruption_budget_pct,
                       "idle_ttl_seconds": p.idle_ttl_seconds},
        "notices.json": {"drain_seconds": p.drain_seconds,
                         "advisory": {"prespin_seconds": p.advisory_prespin_seconds,
                                      "drain_seconds": p.advisory_drain_seconds,
                                      "timeout_seconds": p.advisory_timeout_seconds,
                                      "prespin_lead_seconds": p.advisory_prespin_lead_seconds,
                                      "drain_margin_seconds": p.advisory_drain_margin_seconds,
                                      "calendar_seconds": p.calendar_advisory_seconds}},
        "checkpoint.json": {"checkpoint_before_seconds": p.drain_seconds, "default_pod_seconds": p.default_pod_seconds,
                            "hint": "checkpoint work when a notice arrives; the drain starts drain_seconds "
                                    "before its deadline"},
        "no-notice.json": {"max_seconds": p.no_notice_max_seconds,
                           "rule": "a pool whose provider breaks a contract term takes only work shorter "
                                   "than max_seconds, and no bare metal for long jobs"},
    }


def manifest(region: str, revision: int, created: int, expires: int, files: Mapping[str, bytes]) -> dict[str, Any]:
    return {"name": NAME, "schema_version": SCHEMA_VERSION, "region": region, "revision": revision,
            "created": created, "expires": expires,
            "files": {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in sorted(files.items())}}


@dataclass(frozen=True)
class Checked:
    """A bundle that passed every check: its manifest, and the key ids whose signatures verified."""

    manifest: dict[str, Any]
    keyids: tuple[str, ...]

    @property
    def revision(self) -> int:
        return int(self.manifest["revision"])


def check(doc: dict[str, Any], files: Mapping[str, bytes], verified_keyids: list[str], signature_keyids: list[str],
          *, now: float, last_revision: int | None, region: str | None = None) -> Checked:
    """Every check a bundle must pass after its manifest conformed to :data:`MANIFEST_SCHEMA` (checked with
    ``jsonschema`` where the bundle is read), each failure its own error (and exit code): some signature
    verified with a trusted key; every file the manifest lists is there with its digest and size, and no
    other; not expired; its revision not older than the last one accepted (rollback protection); of the
    expected region. ``files``: ``files/*`` as the tar holds them (name -> bytes)."""
    if not verified_keyids:
        known = ", ".join(signature_keyids) or "none"
        raise BundleUntrusted(f"the bundle is not signed by a trusted key (its signatures' key ids: {known})",
                              hint="pass the signer's public key with --trust, or sign it with `spotctl bundle sign`")
    listed = doc["files"]
    missing = sorted(set(listed) - set(files))
    if missing:
        raise BundleFiles(f"the bundle lacks {len(missing)} file(s) its manifest lists: {', '.join(missing)}")
    extra = sorted(set(files) - set(listed))
    if extra:
        raise BundleFiles(f"the bundle holds {len(extra)} file(s) its manifest does not list: {', '.join(extra)}")
    for name, entry in sorted(listed.items()):
        data = files[name]
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise BundleDigest(f"files/{name} does not match its digest in the manifest (tampered with)")
    if now >= doc["expires"]:
        raise BundleExpired(f"the bundle expired at {doc['expires']} (revision {doc['revision']})",
                            hint="build and sign a new one (freeze protection)")
    if doc["expires"] <= doc["created"]:
        raise BundleInvalid("not a valid bundle: it expires before it was created")
    if last_revision is not None and doc["revision"] < last_revision:
        raise BundleRollback(f"revision {doc['revision']} is older than the last accepted, {last_revision}",
                             hint="rollback protection: only the same or a newer revision is accepted")
    if region is not None and doc["region"] != region:
        raise BundleInvalid(f"not a valid bundle: it is region {doc['region']!r}'s, not {region!r}'s")
    return Checked(manifest=dict(doc), keyids=tuple(sorted(set(verified_keyids))))
