"""Bundles (issue 16): reproducible bytes, Ed25519 signatures, and every way a bundle is refused, each with
its own error and exit code; the CLI's build -> sign -> verify with the region's rollback state."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from spotctl.bundles.archive import pack, unpack
from spotctl.bundles.bundle import add_signature, build, verify
from spotctl.bundles.signing import generate, load_private, load_public
from spotctl.core.bundle import (
    BundleDigest,
    BundleExpired,
    BundleFiles,
    BundleInvalid,
    BundleRollback,
    BundleUntrusted,
    canonical,
)
from spotctl.core.config import load_config
from spotctl.core.errors import ExitCode

CREATED = 1_780_000_000
NOW = CREATED + 60


@pytest.fixture
def region():
    return load_config(env={}).region("demo")


@pytest.fixture
def keys(tmp_path):
    out = {}
    for name in ("k1", "k2", "rogue"):
        generate(tmp_path / f"{name}.pem", tmp_path / f"{name}.pem.pub")
        out[name] = (load_private(tmp_path / f"{name}.pem"), load_public(tmp_path / f"{name}.pem.pub"))
    return out


def signed(region, keys, *names, revision=3, created=CREATED, ttl=86400):
    data = build(region, revision, created, ttl)
    for n in names:
        data = add_signature(data, keys[n][0])
    return data


def rewrite(data: bytes, change) -> bytes:
    """The bundle's entries, changed by ``change(entries)``, packed again (signatures kept as they are)."""
    parts = unpack(data)
    entries = {"manifest.json": parts.manifest_bytes, **{f"files/{k}": v for k, v in parts.files.items()}}
    change(entries)
    files = {k[len("files/"):]: v for k, v in entries.items() if k.startswith("files/")}
    return pack(entries["manifest.json"], parts.signatures, files, CREATED)


def test_the_same_input_gives_the_same_bytes(region, keys):
    assert build(region, 3, CREATED) == build(region, 3, CREATED)
    assert signed(region, keys, "k1") == signed(region, keys, "k1"), "Ed25519 signatures are deterministic"
    assert build(region, 3, CREATED) != build(region, 4, CREATED)
    with tarfile.open(fileobj=io.BytesIO(build(region, 3, CREATED))) as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {(CREATED, 0, 0, "", "", 0o644)}


def test_a_signed_bundle_verifies_and_names_its_keys(region, keys):
    ok = verify(signed(region, keys, "k1"), [keys["k1"][1]], now=NOW, last_revision=2, region="demo")
    assert ok.revision == 3 and len(ok.keyids) == 1
    assert set(ok.manifest["files"]) == {"contract.json", "pools.json", "notices.json", "checkpoint.json",
                                         "no-notice.json"}


def test_key_rotation_two_signatures_either_trusted_key(region, keys):
    data = signed(region, keys, "k1", "k2")
    assert len(unpack(data).signatures) == 2
    for trusted in ([keys["k1"][1]], [keys["k2"][1]], [keys["k1"][1], keys["k2"][1]]):
        verify(data, trusted, now=NOW, last_revision=None)
    assert add_signature(data, keys["k1"][0]) == data, "signing again with the same key replaces its signature"


def refused(data, keys, kind, trusted=("k1",), **kw):
    kw = {"now": NOW, "last_revision": None, **kw}
    with pytest.raises(kind) as e:
        verify(data, [keys[t][1] for t in trusted], **kw)
    return e.value


def test_each_failure_has_its_own_error_and_exit_code(region, keys):
    good = signed(region, keys, "k1")
    errors = [
        refused(build(region, 3, CREATED), keys, BundleUntrusted),  # unsigned
        refused(signed(region, keys, "rogue"), keys, BundleUntrusted),  # a wrong key
        refused(rewrite(good, lambda e: e.update({"files/pools.json": e["files/pools.json"] + b" "})), keys,
                BundleDigest),  # a tampered file
        refused(rewrite(good, lambda e: e.update({"files/extra.json": b"{}"})), keys, BundleFiles),
        refused(rewrite(good, lambda e: e.pop("files/notices.json")), keys, BundleFiles),
        refused(signed(region, keys, "k1", created=CREATED - 90_000), keys, BundleExpired),
        refused(good, keys, BundleRollback, last_revision=4),
        refused(b"not a bundle", keys, BundleInvalid),
    ]
    codes = {type(e): (e.code, e.exit_code) for e in errors}
    assert len({c for c, _ in codes.values()}) == len(codes) == 6
    assert {x for _, x in codes.values()} == {ExitCode.BUNDLE_UNTRUSTED, ExitCode.BUNDLE_DIGEST,
                                              ExitCode.BUNDLE_FILES, ExitCode.BUNDLE_EXPIRED,
                                              ExitCode.BUNDLE_ROLLBACK, ExitCode.BUNDLE_INVALID}
    verify(good, [keys["k1"][1]], now=NOW, last_revision=3)  # the same revision again is not a rollback


def test_a_manifest_that_lies_about_a_digest_is_refused(region, keys):
    """The signer signed a manifest whose digest is not the file's: signed, and still refused."""
    def lie(entries):
        m = json.loads(entries["manifest.json"])
        m["files"]["pools.json"]["sha256"] = hashlib.sha256(b"something else").hexdigest()
        entries["manifest.json"] = canonical(m)
    data = rewrite(build(region, 3, CREATED), lie)
    data = add_signature(data, keys["k1"][0])
    assert "files/pools.json does not match its digest" in refused(data, keys, BundleDigest).message


def test_a_manifest_changed_after_signing_breaks_its_signature(region, keys):
    def bump(entries):
        m = json.loads(entries["manifest.json"])
        m["revision"] = 99
        entries["manifest.json"] = canonical(m)
    refused(rewrite(signed(region, keys, "k1"), bump), keys, BundleUntrusted)


@pytest.mark.parametrize("change, why", [
    (lambda m: m.update(schema_version=2), "schema_version"),
    (lambda m: m.update(revision=0), "revision"),
    (lambda m: m.update(extra=1), "Additional properties"),
    (lambda m: m["files"].update({"../evil.json": {"sha256": "0" * 64, "size": 1}}), "files"),
    (lambda m: m.pop("expires"), "expires"),
])
def test_a_manifest_that_breaks_its_schema_is_invalid(region, keys, change, why):
    def edit(entries):
        m = json.loads(entries["manifest.json"])
        change(m)
        entries["manifest.json"] = canonical(m)
    e = refused(rewrite(signed(region, keys, "k1"), edit), keys, BundleInvalid)
    assert why in e.message


def test_entries_that_are_not_plain_files_are_refused(keys):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        link = tarfile.TarInfo("manifest.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    import gzip

    e = refused(gzip.compress(raw.getvalue()), keys, BundleInvalid)
    assert "not a plain file" in e.message


def test_the_manifest_schema_in_docs_is_the_one_the_code_checks():
    from pathlib import Path

    from spotctl.core.bundle import MANIFEST_SCHEMA

    doc = Path(__file__).resolve().parents[2] / "docs" / "bundles" / "manifest.schema.json"
    assert json.loads(doc.read_text()) == MANIFEST_SCHEMA


def test_the_cli_builds_signs_verifies_and_keeps_the_last_revision(tmp_path, monkeypatch):
    import time

    from typer.testing import CliRunner

    from spotctl.cli.main import app

    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(int(time.time()) - 10))
    runner = CliRunner()

    def go(*args):
        return runner.invoke(app, [*args, "-o", "json"], catch_exceptions=False)

    key = str(tmp_path / "k.pem")
    assert go("bundle", "keygen", "--out", key).exit_code == 0
    b1, b2 = str(tmp_path / "b1"), str(tmp_path / "b2")
    r = go("bundle", "build", "--out", b1)
    assert r.exit_code == 0 and json.loads(r.stdout)["data"]["revision"] == 1
    assert go("bundle", "build", "--out", str(tmp_path / "again")).exit_code == 0
    assert (tmp_path / "again").read_bytes() == (tmp_path / b1).read_bytes(), "SOURCE_DATE_EPOCH: the same bytes"
    assert go("bundle", "verify", b1, "--trust", key + ".pub").exit_code == ExitCode.BUNDLE_UNTRUSTED
    assert go("bundle", "sign", b1, "--key", key).exit_code == 0
    r = go("bundle", "verify", b1, "--trust", key + ".pub")
    assert r.exit_code == 0 and json.loads(r.stdout)["data"]["last_accepted"] == 1
    r = go("bundle", "build", "--out", b2)
    assert json.loads(r.stdout)["data"]["revision"] == 2, "the next revision follows the last accepted"
    go("bundle", "sign", b2, "--key", key)
    assert go("bundle", "verify", b2, "--trust", key + ".pub").exit_code == 0
    r = go("bundle", "verify", b1, "--trust", key + ".pub")
    assert r.exit_code == ExitCode.BUNDLE_ROLLBACK and json.loads(r.stdout)["errors"][0]["code"] == "bundle_rollback"
    recs = json.loads(go("audit", "list", "--action", "bundle.verify").stdout)["data"]["records"]
    assert [x["result"] for x in recs][-4:] == ["refused", "ok", "ok", "refused"]


def test_spiffe_id_patterns_match_within_a_path_segment():
    from spotctl.bundles.spiffe import allowed

    p = ["spiffe://example.org/agent/*"]
    assert allowed("spiffe://example.org/agent/n1", p)
    assert not allowed("spiffe://example.org/agent/n1/x", p) and not allowed("spiffe://example.org/agentx/n1", p)
    assert not allowed("spiffe://evil.org/agent/n1", p)
    assert allowed("spiffe://example.org/agent/n1/x", ["spiffe://example.org/agent/**"])
    assert not allowed("spiffe://example.org/agent/n?", ["spiffe://example.org/agent/n[1]"])
    assert allowed("spiffe://example.org/agent/n[1]", ["spiffe://example.org/agent/n[1]"]), "[ ] are literal"
