"""spotctl bundle: signed bundles for node agents (issue 16)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from spotctl.core.errors import UsageError

from . import render
from .context import state

bundle_app = typer.Typer(rich_markup_mode=None, add_completion=False, no_args_is_help=True, help=(
    "Signed bundles for node agents: build, sign, verify; publish, serve and fetch over mutual TLS with SPIFFE "
    "identities.\n\n"
    "A bundle is a reproducible tar of a manifest (revision, created, expires, every file's SHA-256), its "
    "Ed25519 signatures and the files agents act on: the contract terms, pool policies, notice and advisory "
    "handling, checkpoint hints, the no-notice policy. See docs/bundles.md."))


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the bundle {path}: {e.strerror}") from None


def _write(path: str | None, data: bytes) -> str:
    """Write atomically (a temporary file renamed into place); ``None`` or ``-``: refused on a terminal."""
    import os

    if path in (None, "-"):
        if sys.stdout.isatty():
            raise UsageError("a bundle is binary: give --out FILE (or redirect standard output)")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return "-"
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write the bundle {p}: {e.strerror}") from None
    return str(p)


def _summary(console, d: dict) -> None:
    sigs = ", ".join(s["keyid"] for s in d.get("signatures", [])) or "none"
    console.print(f"bundle {d['region']} revision {d['revision']}: created {d['created']}, expires {d['expires']}, "
                  f"{len(d['files'])} files, signatures: {sigs}" + (f" -> {d['out']}" if d.get("out") else ""))


@bundle_app.command("keygen")
def keygen(
    ctx: typer.Context,
    out: Annotated[str, typer.Option("--out", help="Private key file to create (PKCS#8 PEM, mode 0600); the "
                                                   "public key goes to OUT.pub.")],
) -> None:
    """Make an Ed25519 signing key pair for bundles.

    Example: spotctl bundle keygen --out /etc/spotctl/bundle-signing.pem
    """
    from spotctl.bundles.signing import generate

    st = state(ctx)
    priv, pub = Path(out), Path(out + ".pub")
    if priv.exists() or pub.exists():
        raise UsageError(f"{priv if priv.exists() else pub} exists: not overwritten")
    kid = generate(priv, pub)
    render.emit(st.fmt(), "bundle keygen", {"private_key": str(priv), "public_key": str(pub), "keyid": kid},
                table=lambda c, d: c.print(f"key {d['keyid']}: {d['private_key']} (private), {d['public_key']}"))


@bundle_app.command("build")
def build(
    ctx: typer.Context,
    out: Annotated[Optional[str], typer.Option("--out", help="Bundle file to write (default: standard output).",
                                               show_default=False)] = None,
    revision: Annotated[Optional[int], typer.Option(
        "--revision", min=1, max=2**53 - 1, help="The bundle's revision (default: the last accepted + 1).",
        show_default=False)] = None,
    ttl: Annotated[int, typer.Option("--ttl-seconds", min=60, max=366 * 86400,
                                     help="How long the bundle stays valid (freeze protection).")] = 7 * 86400,
) -> None:
    """Build the region's bundle from its configuration (unsigned).

    Reproducible: the same configuration and revision give the same bytes;
    `created` is $SOURCE_DATE_EPOCH when set, else now.

    Example: SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) spotctl bundle build -r east --out east.bundle
    """
    from spotctl.ops.bundle import build as do_build

    st = state(ctx)
    data, info = do_build(st.runtime(), revision=revision, ttl_seconds=ttl)
    info["out"] = _write(out, data)
    if info["out"] != "-":
        render.emit(st.fmt(), "bundle build", info, table=_summary)


@bundle_app.command("sign")
def sign(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="The bundle to sign (rewritten in place unless --out).")],
    key: Annotated[str, typer.Option("--key", help="Ed25519 private key, PKCS#8 PEM (`spotctl bundle keygen`).")],
    out: Annotated[Optional[str], typer.Option("--out", help="Write the signed bundle here instead.",
                                               show_default=False)] = None,
) -> None:
    """Add an Ed25519 signature of the bundle's manifest (several keys may sign: rotation).

    Example: spotctl bundle sign east.bundle --key /etc/spotctl/bundle-signing.pem
    """
    from spotctl.ops.bundle import sign as do_sign

    st = state(ctx)
    data, info = do_sign(_read(file), key)
    info["out"] = _write(out or file, data)
    render.emit(st.fmt(), "bundle sign", info, table=_summary)


@bundle_app.command("verify")
def verify(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="The bundle to verify (- for standard input).")],
    trust: Annotated[list[str], typer.Option("--trust", help="A trusted public key (PEM); repeat for several.")],
    no_accept: Annotated[bool, typer.Option("--no-accept", help="Check only: do not record the revision as "
                                                                 "the region's last accepted.")] = False,
) -> None:
    """Verify a bundle: signed by a trusted key, every digest matching, no file missing or extra, not
    expired, of this region, and its revision not older than the last one accepted.

    Each failure has its own exit code: 20 invalid, 21 untrusted, 22 digest, 23 files missing or extra,
    24 expired, 25 rollback.

    Example: spotctl bundle verify east.bundle --trust /etc/spotctl/bundle-signing.pem.pub
    """
    from spotctl.ops.bundle import verify as do_verify

    st = state(ctx)
    data = do_verify(st.runtime(), _read(file), trust, accept=not no_accept)
    render.emit(st.fmt(), "bundle verify", data, table=lambda c, d: c.print(
        f"bundle {d['region']} revision {d['revision']} verified: signed by {', '.join(d['keyids'])}, "
        f"{len(d['files'])} files, expires {d['expires']}; last accepted revision {d['last_accepted']}"))


Cert = Annotated[Optional[str], typer.Option("--cert", envvar="SPOTCTL_SVID_CERT", show_default=False, help=(
    "X.509 SVID certificate chain (PEM), as a SPIRE agent writes it (or --workload-api)."))]
Key = Annotated[Optional[str], typer.Option("--key", envvar="SPOTCTL_SVID_KEY", show_default=False,
                                            help="The SVID's private key (PEM).")]
TrustBundle = Annotated[Optional[str], typer.Option("--trust-bundle", envvar="SPOTCTL_SVID_BUNDLE", show_default=False,
                                                    help="The SPIFFE trust bundle (PEM CAs) peers are checked against.")]
WorkloadApi = Annotated[Optional[str], typer.Option("--workload-api", envvar="SPIFFE_ENDPOINT_SOCKET", show_default=False,
                                                    help=("The SPIFFE Workload API socket (unix:///run/spire/agent.sock) "
                                                          "to get the SVID and trust bundle from, instead of files."))]
ServerId = Annotated[str, typer.Option("--server-id", help=(
    "SPIFFE ID pattern the server must have (e.g. spiffe://example.org/spotctl/bundle-server)."))]


def _svid(st, cert: str | None, key: str | None, bundle: str | None, workload_api: str | None, *,
          serve: bool = False):
    """The SVID from its three files, else from the Workload API: a command's own copy in a private
    temporary directory (removed when the command ends); the server's kept current under the state dir."""
    from spotctl.bundles.spiffe import SvidFiles

    if cert and key and bundle:
        return SvidFiles(cert, key, bundle)
    if cert or key or bundle:
        raise UsageError("give all three of --cert, --key and --trust-bundle (or --workload-api)")
    if not workload_api:
        raise UsageError("no SVID: give --cert, --key and --trust-bundle, or --workload-api (SPIFFE_ENDPOINT_SOCKET)")
    if serve:
        from spotctl.bundles.spiffe import WorkloadApiFiles

        region = st.config().region(st.region).name
        return WorkloadApiFiles(workload_api, st.config().state_dir() / f"svid-{region}",
                                on_error=lambda m: st.progress(f"SVID refresh failed (keeping the last one): {m}")).files
    import shutil
    import tempfile

    from spotctl.bundles.spiffe import from_workload_api

    tmp = tempfile.mkdtemp(prefix="spotctl-svid-")
    st.cleanups.append(lambda: shutil.rmtree(tmp, ignore_errors=True))
    return from_workload_api(workload_api, Path(tmp))


def _client(st, url: str, svid, region: str, server_id: str):
    from spotctl.bundles.client import BundleClient

    if not url.startswith("https://"):
        raise UsageError(f"the bundle server's URL must be https://, not {url[:80]!r}")
    return BundleClient(url, svid, region, server_id=server_id)


@bundle_app.command("publish")
def publish(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="The signed bundle to publish.")],
    to: Annotated[str, typer.Option("--to", help="The bundle server (https://HOST:PORT).")],
    cert: Cert = None, key: Key = None, trust_bundle: TrustBundle = None, workload_api: WorkloadApi = None,
    server_id: ServerId = "spiffe://**",
) -> None:
    """Publish a signed bundle to the bundle server, with the pipeline's SVID (mutual TLS).

    The server accepts it only when it verifies and its revision is higher than
    the served one, and answers the accepted revision; a rejection says why
    (exit 20-25 as `verify`, 4 when the SVID may not publish).

    Example: spotctl bundle publish east.bundle --to https://bundles.east:8743 --cert svid.pem --key svid.key --trust-bundle bundle.pem
    """
    st = state(ctx)
    region = st.config().region(st.region).name
    svid = _svid(st, cert, key, trust_bundle, workload_api)
    out = _client(st, to, svid, region, server_id).publish(_read(file))
    render.emit(st.fmt(), "bundle publish", out, table=lambda c, d: c.print(
        f"published: {d['region']} revision {d['accepted_revision']} accepted (signed by {', '.join(d['keyids'])})"))


@bundle_app.command("fetch")
def fetch(
    ctx: typer.Context,
    from_: Annotated[str, typer.Option("--from", help="The bundle server (https://HOST:PORT).")],
    out: Annotated[str, typer.Option("--out", help="Where the agent keeps its bundle (written atomically).")],
    trust: Annotated[list[str], typer.Option("--trust", help="A trusted signing key (PEM); repeat for several.")],
    cert: Cert = None, key: Key = None, trust_bundle: TrustBundle = None, workload_api: WorkloadApi = None,
    server_id: ServerId = "spiffe://**",
) -> None:
    """Fetch the region's bundle as an agent does: with an SVID, verified, written atomically.

    Unchanged (304, by ETag) costs nothing; a new one that fails any check is
    not written: the last good bundle stays, and the failure is the exit code.

    Example: spotctl bundle fetch --from https://bundles.east:8743 --out /var/lib/agent/bundle --trust signing.pub --cert svid.pem --key svid.key --trust-bundle bundle.pem
    """
    import time

    from spotctl.ops.bundle import fetch as do_fetch

    st = state(ctx)
    region = st.config().region(st.region).name
    svid = _svid(st, cert, key, trust_bundle, workload_api)
    data = do_fetch(_client(st, from_, svid, region, server_id), Path(out), trust, now=time.time(), region=region)
    render.emit(st.fmt(), "bundle fetch", data, table=lambda c, d: c.print(
        f"bundle revision {d['revision']} {'fetched' if d['changed'] else 'unchanged'} -> {d['out']}"))


@bundle_app.command("status")
def status(
    ctx: typer.Context,
    url: Annotated[Optional[str], typer.Option("--url", help="Ask this bundle server (else: what `bundle serve` "
                                                             "serves from --data-dir).", show_default=False)] = None,
    data_dir: Annotated[Optional[str], typer.Option("--data-dir", help="The serve side's directory (default: "
                                                                       "STATE_DIR/bundles).", show_default=False)] = None,
    cert: Cert = None, key: Key = None, trust_bundle: TrustBundle = None, workload_api: WorkloadApi = None,
) -> None:
    """What is served: revision, expiry, signatures and key ids, who published it and when.

    Example: spotctl bundle status -o json
    """
    st = state(ctx)
    config = st.config()
    region = config.region(st.region).name
    if url:
        data = _client(st, url, _svid(st, cert, key, trust_bundle, workload_api), region, "spiffe://**").status()
    else:
        from spotctl.bundles.server import BundleServer

        data = BundleServer(region, Path(data_dir) if data_dir else config.state_dir() / "bundles", [], [], []).status()

    def table(c, d: dict) -> None:
        if not d.get("served"):
            c.print(f"region {d['region']}: no bundle published yet")
            return
        c.print(f"region {d['region']}: revision {d['revision']}, expires {d['expires']}, {d['size']} bytes, "
                f"ETag {d['etag']}")
        c.print(f"  signatures: {', '.join(s['keyid'] for s in d['signatures']) or 'none'}")
        c.print(f"  published by {d['published_by']} at {d['published_at']}")

    render.emit(st.fmt(), "bundle status", data, table=table)


@bundle_app.command("serve")
def serve(
    ctx: typer.Context,
    trust: Annotated[list[str], typer.Option("--trust", help="A signing key a published bundle must be signed "
                                                             "with (PEM); repeat for several.")],
    allow_get: Annotated[list[str], typer.Option("--allow-get", help=(
        "SPIFFE ID pattern that may fetch, e.g. 'spiffe://example.org/agent/*'; repeat."))] = [],  # noqa: B006
    allow_put: Annotated[list[str], typer.Option("--allow-put", help=(
        "SPIFFE ID pattern that may publish, e.g. spiffe://example.org/ci/contract-pipeline; repeat."))] = [],  # noqa: B006
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on (loopback by default).")]
        = "127.0.0.1:8743",
    data_dir: Annotated[Optional[str], typer.Option("--data-dir", help="Where the served bundle is kept "
                                                                       "(default: STATE_DIR/bundles).",
                                                    show_default=False)] = None,
    cert: Cert = None, key: Key = None, trust_bundle: TrustBundle = None, workload_api: WorkloadApi = None,
    metrics_listen: Annotated[Optional[str], typer.Option(
        "--metrics-listen", help="HOST:PORT to serve Prometheus /metrics on, in plain HTTP (keep it on loopback "
                                 "or a private network); off by default.", show_default=False)] = None,
) -> None:
    """Serve the region's bundle to node agents over mutual TLS, authorised by SPIFFE ID.

    Agents GET it (ETag / If-None-Match: 304 when unchanged); the pipeline PUTs
    a new one, accepted only when it verifies with a higher revision. Rotated
    SVID and trust-bundle files are picked up without a restart. Runs until
    Ctrl-C or SIGTERM. The API: docs/bundles/openapi.yaml.

    Example: spotctl bundle serve --cert svid.pem --key svid.key --trust-bundle bundle.pem --trust signing.pub --allow-get 'spiffe://example.org/agent/*' --allow-put spiffe://example.org/ci/contract-pipeline
    """
    from spotctl.bundles.server import run
    from spotctl.ops.bundle import server_for

    st = state(ctx)
    host, port = _host_port("--listen", listen)
    metrics = _host_port("--metrics-listen", metrics_listen) if metrics_listen is not None else None
    rt = st.runtime()
    server = server_for(rt, Path(data_dir) if data_dir else st.config().state_dir() / "bundles", trust,
                        allow_get, allow_put)
    run(server, _svid(st, cert, key, trust_bundle, workload_api, serve=True), host, port,
        ready=lambda url: print(f"spotctl: serving region {rt.region.name}'s bundle at {url}", file=sys.stderr,
                                flush=True),
        metrics=metrics,
        metrics_ready=lambda url: print(f"spotctl: metrics at {url}", file=sys.stderr, flush=True))


def _host_port(flag: str, text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{flag} must be HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)
