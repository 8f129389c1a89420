"""The reference audit log service (``spotctl audit serve``): HTTP, append-only SQLite.

Implements ``docs/audit/openapi.yaml`` for small sites and for the tests:

- ``POST /v1/batches`` takes up to 1000 records, each with an idempotency key
  (the record id), and answers one result per record: ``created``,
  ``duplicate`` (that key is already stored with the same hash: the client's
  retry is acknowledged, nothing is stored twice), ``conflict`` (that key is
  stored with a different hash) or ``invalid`` (a missing field, or a hash
  that does not match the record's content); the records after a refused one
  are ``skipped`` (not stored), so that the service keeps the sender's order.
- ``GET /v1/records?region=R&after=SEQ&limit=N`` pages through what is stored,
  in arrival order; ``GET /v1/records/{id}`` fetches one; ``GET /v1/health``.
- Every ``/v1/records`` and ``/v1/batches`` call needs ``Authorization: Bearer <token>``.

The store is append-only: triggers refuse UPDATE and DELETE. The record hash is
recomputed here from the record's content (SHA-256 of the previous hash followed
by the canonical JSON of id, at, actor, action, target, result, inputs:
``spotctl.core.audit``, the one definition the state store writes with), never
taken from the sender, so a record altered on its way is refused.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from spotctl.core.audit import HASHED_FIELDS, canonical, record_hash
from spotctl.core.errors import ConfigError, StateError
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.secrets import SecretFile, secret_value

from ._serving import base_url, bearer_matches

log = logging.getLogger(__name__)

MAX_BATCH = 1000
MAX_BODY = 16 * 1024 * 1024
REQUIRED = HASHED_FIELDS + ("prev_hash", "hash", "region")

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    region TEXT NOT NULL,
    id TEXT NOT NULL,
    hash TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    body TEXT NOT NULL,
    received_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_region ON records(region, seq);
CREATE INDEX IF NOT EXISTS records_id ON records(id);
CREATE TRIGGER IF NOT EXISTS records_no_update BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
CREATE TRIGGER IF NOT EXISTS records_no_delete BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
"""


class Ledger:
    """The receiver's append-only SQLite store."""

    def __init__(self, path: str | Path, clock: Clock | None = None):
        self.clock = clock or SystemClock()  # the receipt time of each record
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")  # an acknowledged record survives a power cut
            self.conn.executescript(SCHEMA)
        except (OSError, sqlite3.DatabaseError) as e:
            raise StateError(f"audit receiver database {path}: {e}") from None
        self.lock = threading.Lock()

    def append(self, items: list[dict]) -> list[dict]:
        """Store a batch in one transaction; one result per item, in order."""
        results = []
        now = self.clock.now()
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                refused = False
                for item in items:
                    if refused:  # keep the service's order: nothing after a refused record is stored
                        key = item.get("idempotency_key") if isinstance(item, dict) else None
                        results.append(_result(key, "skipped", "not processed: an earlier record in this batch "
                                                               "was refused", code="after_refused"))
                        continue
                    results.append(self._append_one(item, now))
                    refused = results[-1]["status"] not in ("created", "duplicate")
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        return results

    def _append_one(self, item: object, now: float) -> dict:
        key = item.get("idempotency_key") if isinstance(item, dict) else None
        rec = item.get("record") if isinstance(item, dict) else None
        if not isinstance(key, str) or not key or not isinstance(rec, dict):
            return _result(key, "invalid", "each item needs an idempotency_key string and a record object")
        missing = [f for f in REQUIRED if f not in rec]
        if missing:
            return _result(key, "invalid", f"record lacks {', '.join(missing)}")
        try:
            computed = record_hash(rec)
        except (TypeError, KeyError, AttributeError) as e:
            return _result(key, "invalid", f"record cannot be hashed: {e}")
        if computed != rec["hash"]:
            return _result(key, "invalid", "hash does not match the record's content", code="hash_mismatch")
        row = self.conn.execute("SELECT seq, hash FROM records WHERE idempotency_key=?", (key,)).fetchone()
        if row is not None:
            if row["hash"] == rec["hash"]:
                return {**_result(key, "duplicate"), "seq": row["seq"]}
            return _result(key, "conflict", "this idempotency key is stored with a different record",
                           code="key_conflict")
        cur = self.conn.execute(
            "INSERT INTO records (idempotency_key, region, id, hash, prev_hash, body, received_at) VALUES (?,?,?,?,?,?,?)",
            (key, str(rec["region"]), str(rec["id"]), rec["hash"], rec["prev_hash"], canonical(rec), now))
        return {**_result(key, "created"), "seq": cur.lastrowid}

    def page(self, region: str | None, after: int, limit: int) -> list[dict]:
        sql = "SELECT seq, body, received_at FROM records WHERE seq > ?"
        args: list[int | str] = [after]
        if region:
            sql, args = sql + " AND region = ?", args + [region]
        with self.lock:
            rows = self.conn.execute(sql + " ORDER BY seq LIMIT ?", args + [limit]).fetchall()
        return [{**json.loads(r["body"]), "seq": r["seq"], "received_at": r["received_at"]} for r in rows]

    def get(self, record_id: str) -> dict | None:
        with self.lock:
            r = self.conn.execute("SELECT seq, body, received_at FROM records WHERE id=? ORDER BY seq LIMIT 1",
                                  (record_id,)).fetchone()
        return None if r is None else {**json.loads(r["body"]), "seq": r["seq"], "received_at": r["received_at"]}

    def close(self) -> None:
        self.conn.close()


def _result(key: object, status: str, message: str | None = None, *, code: str | None = None) -> dict:
    d: dict = {"idempotency_key": key, "status": status}
    if message:
        d["error"] = {"code": code or status, "message": message}
    return d


class _Handler(BaseHTTPRequestHandler):
    server: "AuditServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: object) -> None:  # never log headers (they carry the token)
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="spotctl-audit"')
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        # an unread request body must not be parsed as the next request: close the connection
        self.close_connection = True
        self._send(status, {"error": {"code": code, "message": message}})

    def _authorised(self) -> bool:
        try:
            expected = secret_value(self.server.token)
        except ConfigError as e:  # the token file went missing or empty under a running receiver
            log.error("audit receiver: %s", e.message)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal", "the receiver cannot read its token")
            return False
        if bearer_matches(self.headers.get("Authorization", ""), expected):
            return True
        self._error(HTTPStatus.UNAUTHORIZED, "unauthorized", "a valid bearer token is required")
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        url = urlsplit(self.path)
        if url.path == "/v1/health":
            return self._send(HTTPStatus.OK, {"status": "ok"})
        if not url.path.startswith("/v1/records"):
            return self._error(HTTPStatus.NOT_FOUND, "not_found", f"no such path {url.path}")
        if not self._authorised():
            return None
        if url.path == "/v1/records":
            q = parse_qs(url.query)
            try:
                after = int(q.get("after", ["0"])[0])
                limit = min(1000, max(1, int(q.get("limit", ["500"])[0])))
            except ValueError:
                return self._error(HTTPStatus.BAD_REQUEST, "bad_request", "after and limit must be integers")
            records = self.server.ledger.page(q.get("region", [None])[0], after, limit)
            nxt = records[-1]["seq"] if len(records) == limit else None
            return self._send(HTTPStatus.OK, {"records": records, "next_after": nxt})
        rec = self.server.ledger.get(url.path[len("/v1/records/"):])
        if rec is None:
            return self._error(HTTPStatus.NOT_FOUND, "not_found", "no such record")
        return self._send(HTTPStatus.OK, rec)

    def do_POST(self) -> None:  # noqa: N802
        if urlsplit(self.path).path != "/v1/batches":
            return self._error(HTTPStatus.NOT_FOUND, "not_found", f"no such path {self.path}")
        if not self._authorised():
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large", f"body must be <= {MAX_BODY} bytes")
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except (ValueError, UnicodeDecodeError):
            return self._error(HTTPStatus.BAD_REQUEST, "bad_request", "the body is not JSON")
        items = body.get("records") if isinstance(body, dict) else None
        if not isinstance(items, list):
            return self._error(HTTPStatus.BAD_REQUEST, "bad_request", "the body needs a 'records' array")
        if len(items) > MAX_BATCH:
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large", f"at most {MAX_BATCH} records")
        try:
            results = self.server.ledger.append(items)
        except sqlite3.DatabaseError as e:
            log.error("audit receiver: cannot store a batch: %s", e)
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, "storage", "cannot store the batch now; retry")
        return self._send(HTTPStatus.OK, {"results": results})


class AuditServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], ledger: Ledger, token: str | SecretFile):
        self.ledger = ledger
        self.token = token  # a SecretFile (--token-file) is read on each request: a rotated file takes effect at once
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        return base_url(self)


def make_server(db: str | Path, token: str | SecretFile, host: str = "127.0.0.1", port: int = 8470, *,
                clock: Clock | None = None) -> AuditServer:
    """Build (not start) a receiver; ``serve_forever()`` runs it, ``shutdown()`` stops it."""
    if not token:
        raise ConfigError("the audit receiver needs a bearer token",
                          hint="pass --token-file FILE or set SPOTCTL_AUDIT_TOKEN")
    try:
        return AuditServer((host, port), Ledger(db, clock), token)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def serve(db: str | Path, token: str | SecretFile, host: str = "127.0.0.1", port: int = 8470,
          ready: Callable[[str], None] = lambda url: None) -> None:
    """Run the receiver until interrupted."""
    server = make_server(db, token, host, port)
    ready(server.url)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        server.ledger.close()
