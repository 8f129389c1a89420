"""A bundle's bytes (issue 16): a reproducible gzip'd tar, and the safe reading of one.

Reproducible: the same manifest, signatures and files give the same bytes — entries in sorted order, every
mtime the manifest's ``created``, owner and group 0 with no names, mode 0644, and a gzip header without a
name or time. Reading takes plain files only (no links, devices or directories), no path that leaves the
bundle, no name twice, at most 64 entries and 16 MiB each: anything else is :class:`BundleInvalid`.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from dataclasses import dataclass
from typing import Any

from spotctl.core.bundle import MANIFEST, MANIFEST_SCHEMA, SIGNATURES, BundleInvalid, canonical

MAX_ENTRIES = 66  # the manifest, the signatures and at most 64 files
MAX_SIZE = 16 * 1024 * 1024


@dataclass(frozen=True)
class Parts:
    """A bundle read back: the manifest's exact bytes and its JSON, the signatures, the files by name."""

    manifest_bytes: bytes
    manifest: dict[str, Any]
    signatures: list[dict[str, Any]]
    files: dict[str, bytes]


def pack(manifest_bytes: bytes, signatures: list[dict[str, Any]], files: dict[str, bytes], mtime: int) -> bytes:
    entries = {MANIFEST: manifest_bytes, **({SIGNATURES: canonical(signatures)} if signatures else {}),
               **{f"files/{n}": b for n, b in files.items()}}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(entries[name]), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(entries[name]))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def unpack(data: bytes) -> Parts:
    """The parts of a bundle, its manifest checked against its JSON Schema (``jsonschema``)."""
    try:
        raw = gzip.decompress(data)
    except (OSError, EOFError, ValueError):
        raise BundleInvalid("not a valid bundle: not gzip data") from None
    entries: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                if len(entries) >= MAX_ENTRIES:
                    raise BundleInvalid(f"not a valid bundle: more than {MAX_ENTRIES} entries")
                name = info.name
                if not info.isfile():
                    raise BundleInvalid(f"not a valid bundle: {name[:80]!r} is not a plain file")
                if name.startswith("/") or ".." in name.split("/") or name in entries:
                    raise BundleInvalid(f"not a valid bundle: entry {name[:80]!r} (absolute, outside, or twice)")
                if info.size > MAX_SIZE:
                    raise BundleInvalid(f"not a valid bundle: {name[:80]!r} is larger than 16 MiB")
                f = tar.extractfile(info)
                entries[name] = f.read() if f is not None else b""
    except tarfile.TarError:
        raise BundleInvalid("not a valid bundle: not a tar archive") from None
    if MANIFEST not in entries:
        raise BundleInvalid("not a valid bundle: it has no manifest.json")
    try:
        manifest = json.loads(entries[MANIFEST])
    except (ValueError, UnicodeDecodeError):
        raise BundleInvalid("not a valid bundle: manifest.json is not JSON") from None
    schema_check(manifest)
    signatures: list[dict[str, Any]] = []
    if SIGNATURES in entries:
        try:
            signatures = json.loads(entries[SIGNATURES])
        except (ValueError, UnicodeDecodeError):
            raise BundleInvalid("not a valid bundle: signatures.json is not JSON") from None
        if not isinstance(signatures, list) or not all(isinstance(s, dict) for s in signatures):
            raise BundleInvalid("not a valid bundle: signatures.json is not a list of signatures")
    others = sorted(n for n in entries if n not in (MANIFEST, SIGNATURES) and not n.startswith("files/"))
    if others:
        from spotctl.core.bundle import BundleFiles

        raise BundleFiles(f"the bundle holds entries outside files/: {', '.join(o[:80] for o in others)}")
    files = {n[len("files/"):]: b for n, b in entries.items() if n.startswith("files/")}
    return Parts(entries[MANIFEST], manifest, signatures, files)


def schema_check(doc: Any) -> None:
    """``doc`` against the manifest's JSON Schema; the first error as :class:`BundleInvalid`."""
    import jsonschema

    try:
        jsonschema.validate(doc, MANIFEST_SCHEMA, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "the manifest"
        raise BundleInvalid(f"not a valid bundle: {where}: {e.message[:200]}") from None
