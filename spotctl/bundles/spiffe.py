"""SPIFFE identities over TLS (issue 16): X.509 SVIDs from files (as a SPIRE agent writes them: a cert chain,
its key, the trust bundle), the SPIFFE ID of a peer's certificate, authorisation by SPIFFE ID patterns,
and TLS contexts that pick up rotated files without a restart.

A peer's SPIFFE ID is the one ``spiffe://`` URI SAN of its leaf certificate (an SVID has exactly one; a
certificate with two, or none, names nobody). The handshake has checked the chain against the trust
bundle and the validity dates; the ID's trust domain must be one the server trusts.
"""

from __future__ import annotations

import functools
import os
import re
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from spotctl.core.errors import AuthError, ConfigError


def spiffe_id(der: bytes | None) -> str:
    """The SPIFFE ID of a DER certificate; AuthError when it has none, or more than one."""
    if not der:
        raise AuthError("no client certificate (an X.509 SVID is required)")
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise AuthError("the certificate has no URI SAN: not an SVID") from None
    ids = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("spiffe://")]
    if len(ids) != 1:
        raise AuthError(f"the certificate names {len(ids)} SPIFFE IDs: an SVID names exactly one")
    return ids[0]


def trust_domain(sid: str) -> str:
    return sid[len("spiffe://"):].split("/", 1)[0]


def allowed(sid: str, patterns: list[str]) -> bool:
    """Whether a SPIFFE ID matches one of the patterns: ``*`` stands for any characters within one path
    segment (``spiffe://td/agent/*`` matches ``spiffe://td/agent/n1``, not ``.../agent/n1/x``), ``**`` for
    any characters across segments; nothing else is special."""
    return any(_pattern(p).fullmatch(sid) for p in patterns)


@functools.lru_cache(maxsize=256)
def _pattern(p: str) -> re.Pattern[str]:
    parts = [re.escape(piece).replace(r"\*", "[^/]*") for piece in p.split("**")]
    return re.compile(".*".join(parts))


@dataclass
class SvidFiles:
    """An SVID as files: certificate chain (PEM), private key (PEM), trust bundle (PEM CAs)."""

    cert: str
    key: str
    bundle: str
    _seen: tuple = field(default=(), repr=False)

    def check(self) -> None:
        for what, p in (("certificate", self.cert), ("key", self.key), ("trust bundle", self.bundle)):
            if not os.path.isfile(p):
                raise ConfigError(f"SVID {what} {p} does not exist")

    def stamp(self) -> tuple:
        out: list[tuple[int, int, int] | None] = []
        for p in (self.cert, self.key, self.bundle):
            try:
                st = os.stat(p)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def context(self, server: bool) -> ssl.SSLContext:
        """A TLS context of this SVID: TLS 1.2+, the peer's certificate required and checked against the
        trust bundle; host names are not checked (SVIDs name SPIFFE IDs, checked by the caller)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(self.cert, self.key)
            ctx.load_verify_locations(self.bundle)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"SVID files {self.cert}, {self.key}, {self.bundle}: {e}") from None
        return ctx


class RotatingContext:
    """A server context whose certificate and trust bundle follow their files: each handshake's SNI callback
    switches the connection to the newest context, rebuilt when the files changed (checked at most once a
    second). A rotation that cannot be read keeps the last good context (and says so once)."""

    def __init__(self, files: SvidFiles, on_error=None):
        self.files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self._current = files.context(server=True)
        self._checked = 0.0
        self.reloads = 0
        self.on_error = on_error
        self.outer = files.context(server=True)
        self.outer.sni_callback = self._pick

    def _pick(self, sslobj, server_name, ctx) -> None:
        sslobj.context = self.current()

    def current(self) -> ssl.SSLContext:
        import time

        now = time.monotonic()
        with self._lock:
            if now - self._checked >= 1.0:
                self._checked = now
                stamp = self.files.stamp()
                if stamp != self._stamp:
                    try:
                        self._current = self.files.context(server=True)
                        self.reloads += 1
                    except ConfigError as e:
                        if self.on_error:
                            self.on_error(str(e))
                    self._stamp = stamp
            return self._current


def path_of(p: str | None) -> str | None:
    return str(Path(p).expanduser()) if p else None


def from_workload_api(socket: str, out_dir: Path, timeout: float = 10.0) -> SvidFiles:
    """This workload's X.509 SVID from the SPIFFE Workload API (``unix:///run/spire/agent.sock``, as a SPIRE
    agent serves it; the ``spiffe`` package's client), written as files into ``out_dir`` (0700; the key 0600)
    so that the TLS contexts read it as they read a SPIRE agent's files: the default SVID's chain and key,
    and every trust domain's CAs as the trust bundle."""
    from cryptography.hazmat.primitives import serialization

    try:
        from spiffe import WorkloadApiClient
        from spiffe.errors import ArgumentError
        from spiffe.workloadapi.errors import WorkloadApiError
    except ImportError:  # pragma: no cover - a dependency
        raise ConfigError("the SPIFFE Workload API needs the `spiffe` package") from None
    try:
        with WorkloadApiClient(socket, default_timeout=timeout) as client:
            ctx = client.fetch_x509_context()
    except ArgumentError as e:
        raise ConfigError(f"SPIFFE Workload API {socket}: {e}") from None
    except WorkloadApiError as e:
        from spotctl.core.errors import UnavailableError

        raise UnavailableError(f"SPIFFE Workload API {socket}: no X.509 SVID ({e})",
                               hint="is the SPIRE agent running, and is this workload registered?") from None
    svid = ctx.default_svid
    pem = serialization.Encoding.PEM
    chain = b"".join(c.public_bytes(pem) for c in svid.cert_chain)
    key = svid.private_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    cas = b"".join(c.public_bytes(pem) for b in sorted(ctx.x509_bundle_set.bundles, key=lambda b: str(b.trust_domain))
                   for c in sorted(b.x509_authorities, key=lambda c: c.serial_number))
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = SvidFiles(str(out_dir / "svid.pem"), str(out_dir / "svid.key"), str(out_dir / "bundle.pem"))
    for path, data in ((files.key, key), (files.cert, chain), (files.bundle, cas)):
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return files


class WorkloadApiFiles:
    """An SVID from the Workload API kept current: fetched now, and again every ``refresh_seconds`` by a
    daemon thread of the long-running server (SPIRE rotates SVIDs well before they expire); the files it
    rewrites are the ones :class:`RotatingContext` watches."""

    def __init__(self, socket: str, out_dir: Path, refresh_seconds: float = 30.0, on_error=None):
        self.socket, self.dir, self.refresh = socket, out_dir, refresh_seconds
        self.files = from_workload_api(socket, out_dir)
        self.on_error = on_error
        threading.Thread(target=self._loop, name="spiffe-workload-api", daemon=True).start()

    def _loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.refresh):
            try:
                from_workload_api(self.socket, self.dir)
            except Exception as e:  # noqa: BLE001 - keep the last good SVID, say why
                if self.on_error:
                    self.on_error(str(e))
