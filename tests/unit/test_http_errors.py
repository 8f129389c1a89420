"""Every adapter means the same by the same HTTP answer (the rule in ``spotctl/adapters/_http.py``).

A tiny real ``http.server`` on 127.0.0.1 stands in for every backend: ``/s/<status>/...`` answers that
status (with a JSON error body every adapter can read), ``/slow/...`` answers after the clients' timeout,
``/drop/...`` closes the connection without an answer; a closed port refuses the connection. Each
adapter's own client — the contract feed, the audit client, slurmrestd's, the Kubernetes API's, and the
OpenStack translation over keystoneauth (the SDK's HTTP layer) — is pointed at it, one request per
case, and must raise the class the table says. Nothing of ours is mocked.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spotctl.adapters import _http
from spotctl.core.errors import (
    AuthError,
    ExitCode,
    NotFoundError,
    RefusedError,
    SpotctlError,
    TemporaryError,
    UnavailableError,
)

TIMEOUT = 0.4  # every client's timeout; /slow answers after SLOW
SLOW = 1.5

#: status (or transport case) -> the class every adapter must raise
RULE: dict[int | str, type[SpotctlError]] = {
    400: RefusedError, 422: RefusedError,
    401: AuthError, 403: AuthError, 511: AuthError,
    404: NotFoundError,
    408: TemporaryError, 409: TemporaryError, 410: TemporaryError, 425: TemporaryError, 429: TemporaryError,
    500: TemporaryError, 501: TemporaryError, 502: TemporaryError, 503: TemporaryError, 504: TemporaryError,
    405: UnavailableError, 406: UnavailableError, 413: UnavailableError, 415: UnavailableError,
    "timeout": TemporaryError,
    "broken": TemporaryError,
    "refused": UnavailableError,
}
EXIT = {RefusedError: ExitCode.REFUSED, AuthError: ExitCode.AUTH, NotFoundError: ExitCode.NOT_FOUND,
        TemporaryError: ExitCode.UNAVAILABLE, UnavailableError: ExitCode.UNAVAILABLE}


class _Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        parts = self.path.split("/")
        if parts[1] == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # no status line: the exchange breaks off
            return
        if parts[1] == "slow":
            time.sleep(SLOW)
            status = 200
        else:
            status = int(parts[2])
        body = json.dumps({"error": {"code": "fake", "message": f"the fake answers {status}"},
                           "message": f"the fake answers {status}", "errors": []}).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (the timeout case)
            pass

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base(fake: str, closed_port: int, case) -> str:
    if case == "refused":
        return f"http://127.0.0.1:{closed_port}"
    if case == "timeout":
        return f"{fake}/slow/0"
    if case == "broken":
        return f"{fake}/drop/0"
    return f"{fake}/s/{case}"


def _jwt(user: str) -> str:
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
    return f"{enc({'alg': 'HS256'})}.{enc({'sun': user, 'exp': time.time() + 3600})}.c2ln"


# one request through each adapter's own client, at a base URL that answers as the case says


def contract(base: str) -> None:
    from spotctl.adapters.contract_http import ContractFeed

    ContractFeed(base, token="t", timeout=TIMEOUT).status()


def audit(base: str) -> None:
    from spotctl.adapters.audit_http import AuditClient

    AuditClient(base, "t", timeout_seconds=TIMEOUT).record("r-1")


def slurm(base: str) -> None:
    from spotctl.adapters.slurm import SlurmScheduler
    from spotctl.adapters.slurm.rest import _Token

    SlurmScheduler(base, "alice", _Token(source="test", value=_jwt("alice")), scontrol=None,
                   timeout=TIMEOUT).discover()


def kubernetes(base: str) -> None:
    from spotctl.adapters.kubernetes import Api, Connection

    Api(Connection(server=base, token="t"), timeout=TIMEOUT).request("GET", "/api/v1/nodes")


def openstack(base: str) -> None:
    """The OpenStack adapter's translation of what its SDK's HTTP layer (keystoneauth) raises."""
    from keystoneauth1 import session

    from spotctl.adapters.openstack import translate

    try:
        session.Session(timeout=TIMEOUT).get(base + "/placement/resource_providers")
    except Exception as e:  # the SDK's own exceptions: the adapter translates them at its boundary
        raise translate(e, "placement GET /resource_providers") from None


ADAPTERS = [contract, audit, slurm, kubernetes, openstack]


@pytest.mark.parametrize("case", list(RULE), ids=str)
def test_every_adapter_translates_the_same_answer_to_the_same_error(fake, closed_port, case):
    base = _base(fake, closed_port, case)
    got = {}
    for call in ADAPTERS:
        t0 = time.monotonic()
        with pytest.raises(SpotctlError) as e:
            call(base)
        got[call.__name__] = type(e.value)
        assert e.value.exit_code == EXIT[RULE[case]], (call.__name__, e.value.message)
        assert time.monotonic() - t0 < TIMEOUT + 1.0, f"{call.__name__} waited (retried?) on {case}"
        if isinstance(case, int):
            assert str(case) in e.value.message, (call.__name__, e.value.message)
    assert got == {call.__name__: RULE[case] for call in ADAPTERS}


@pytest.mark.parametrize(("status", "cls"), [(s, c) for s, c in RULE.items() if isinstance(s, int)]
                         + [(304, UnavailableError), (302, UnavailableError), (418, UnavailableError),
                            (599, TemporaryError)])
def test_the_rule_itself(status, cls):
    assert _http.error_class(status) is cls
    e = _http.status_error(status, f"x: HTTP {status}", auth_hint="check the token", hint="other")
    assert type(e) is cls and e.hint == ("check the token" if cls is AuthError else "other")


def test_a_temporary_error_is_unavailable_to_callers_that_only_ask_that():
    assert issubclass(TemporaryError, UnavailableError)
