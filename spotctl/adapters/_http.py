"""Shared HTTP plumbing of the adapters: one request attempt, and one rule for what a failure means.

Every adapter that speaks HTTP (``contract_http``, ``audit_http``, ``slurm``, ``kubernetes``)
sends through :func:`send` and turns an error answer into a spotctl error with
:func:`status_error`; ``openstack`` (whose SDK raises its own exceptions) maps the HTTP status
those carry with :func:`error_class`. So a status means the same thing, and exits the same, whichever
backend answered it.

The rule::

    answer or failure                              error             exit  meaning
    400, 422                                       RefusedError       6    the service refused the request as
                                                                           invalid (a value it does not accept)
    401, 403, 511                                  AuthError          4    credentials missing, wrong, expired,
                                                                           or not allowed (511: Slurm's "slurmctld
                                                                           rejected the token")
    404                                            NotFoundError      5    the thing (or the base URL) is not there
    408, 409, 410, 425, 429                        TemporaryError     8    not now: a timeout, a conflict, an
                                                                           expired version/continue token (410, as
                                                                           Kubernetes uses it), rate limits
    5xx (except 511)                               TemporaryError     8    the service failed this time
    any other 4xx (405, 406, 413, 415, ...)        UnavailableError   8    the service does not offer this request
                                                                           in this form: a wrong URL or API version
    an unexpected 1xx/2xx/3xx                      UnavailableError   8    e.g. a redirect we do not follow
    no answer within the timeout                   TemporaryError     8
    connection broke off mid-exchange              TemporaryError     8
    connection refused, name not found, no route   UnavailableError   8    nothing to talk to there
    TLS handshake failed                           UnavailableError   8    (a hint names the CA setting)

``TemporaryError`` is an ``UnavailableError`` (same exit code, code ``temporary``): both degrade the
pass's source and the pass goes on. A 400 from a backend is "refused", not "usage": the command line
was valid; the backend refused what it was asked (the contract API's minimum notice, say).

Adapters add what only their API means, before this rule: Slurm's HTTP 500 carrying error 2018
(unknown node) is NotFoundError; OpenStack's 400/403 that say "quota exceeded" or "no valid host" are
CapacityError. Statuses an adapter expects (Kubernetes' 429 from a PodDisruptionBudget: "not now")
are passed as ``ok`` and read by the caller.

One attempt: nothing here retries or sleeps (a pass never waits, CONVENTIONS rule 17). "Retry with
backoff" for a TemporaryError is the caller's next pass (or the watcher's next round), which asks
again; mutating calls carry idempotency keys or tags so that asking again does nothing twice.
``requests`` is imported on first use, never at import time.
"""

from __future__ import annotations

import errno
import re
import socket
from typing import Any

from spotctl.core.errors import (
    AuthError,
    NotFoundError,
    RefusedError,
    SpotctlError,
    TemporaryError,
    UnavailableError,
)

REFUSED = frozenset({400, 422})
AUTH = frozenset({401, 403, 511})
NOT_FOUND = frozenset({404})
TEMPORARY = frozenset({408, 409, 410, 425, 429})


def error_class(status: int) -> type[SpotctlError]:
    """The spotctl error class for an HTTP status that was not expected (the table in the module doc)."""
    if status in AUTH:
        return AuthError
    if status in REFUSED:
        return RefusedError
    if status in NOT_FOUND:
        return NotFoundError
    if status in TEMPORARY or 500 <= status <= 599:
        return TemporaryError
    return UnavailableError


def status_error(status: int, message: str, *, auth_hint: str | None = None, hint: str | None = None,
                 details: dict | None = None) -> SpotctlError:
    """The error for an unexpected HTTP ``status``; ``message`` says what was asked and what came back.
    ``auth_hint`` is the hint of an AuthError (which credential to check), ``hint`` of any other."""
    cls = error_class(status)
    return cls(message, hint=auth_hint if cls is AuthError else hint, details=details)


def send(session: Any, method: str, url: str, *, what: str, peer: str, timeout: float | tuple[float, float],
         unreachable_hint: str | None = None, tls_hint: str | None = None, **kw: Any) -> Any:
    """One HTTP request through a ``requests`` session; the response whatever its status (the caller
    reads it: :func:`status_error` for an unexpected one). A request that got no answer raises
    :func:`transport_error`. ``what`` starts messages (``"slurm: GET /jobs"``); ``peer`` names the
    service (``"slurmrestd at http://ctl:6820"``)."""
    import requests

    try:
        return session.request(method, url, timeout=timeout, **kw)
    except requests.RequestException as e:
        raise transport_error(e, what=what, peer=peer, timeout=timeout, unreachable_hint=unreachable_hint,
                              tls_hint=tls_hint) from None


def transport_error(e: BaseException, *, what: str, peer: str, timeout: float | tuple[float, float] | None = None,
                    unreachable_hint: str | None = None, tls_hint: str | None = None) -> SpotctlError:
    """A ``requests`` exception (no answer) as a spotctl error, by the rule in the module doc."""
    import requests

    if isinstance(e, requests.Timeout):
        t = max(timeout) if isinstance(timeout, tuple) else timeout
        within = f" within {t:.3g} s" if t is not None else ""
        return TemporaryError(f"{what}: no answer from {peer}{within}")
    if isinstance(e, requests.exceptions.SSLError):
        return UnavailableError(f"{what}: TLS to {peer} failed: {reason(e)}", hint=tls_hint)
    if isinstance(e, requests.ConnectionError):
        if could_not_connect(e):
            return UnavailableError(f"{what}: cannot connect to {peer} (unreachable: {reason(e)})",
                                    hint=unreachable_hint)
        return TemporaryError(f"{what}: the connection to {peer} broke off ({reason(e)})")
    return UnavailableError(f"{what}: {peer}: {type(e).__name__}: {reason(e)}")


_NO_CONNECTION = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL}


def _chain(e: BaseException):
    """The exception and what it wraps (cause, context, urllib3's ``reason``, a wrapped first argument)."""
    seen: set[int] = set()
    todo = [e]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo.extend(x for x in (cur.__cause__, cur.__context__, getattr(cur, "reason", None))
                    if isinstance(x, BaseException))
        todo.extend(a for a in getattr(cur, "args", ())[:1] if isinstance(a, BaseException))


def could_not_connect(e: BaseException) -> bool:
    """True when no connection was made at all (refused, name not found, no route), as opposed to one
    that broke off after it was made."""
    from urllib3.exceptions import NewConnectionError  # requests' own dependency

    for cur in _chain(e):
        if isinstance(cur, (NewConnectionError, ConnectionRefusedError, socket.gaierror)):
            return True
        if isinstance(cur, OSError) and cur.errno in _NO_CONNECTION:
            return True
        text = str(cur)
        if "Connection refused" in text or "[Errno 111]" in text or "Failed to resolve" in text:
            return True
    return False


def broke_off(e: BaseException) -> bool:
    """True when ``e`` (or what it wraps: an SDK's own exception raised while handling one of requests')
    is a connection that was made and then broke off — a TemporaryError by the rule, unlike one that
    could not be made."""
    import requests

    return any(isinstance(c, requests.ConnectionError) for c in _chain(e)) and not could_not_connect(e) \
        and not any(isinstance(c, requests.exceptions.SSLError) for c in _chain(e))


def reason(e: BaseException) -> str:
    """A short reason for a transport failure: ``connection refused``, ``Name or service not known``…"""
    for cur in _chain(e):
        if isinstance(cur, ConnectionRefusedError) or "Connection refused" in str(cur):
            return "connection refused"
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^')\]]+)", text)
    if m:
        return m.group(1).strip()
    return text[:200] or type(e).__name__
