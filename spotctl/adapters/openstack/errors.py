"""The adapter's error boundary: what openstacksdk and keystoneauth raise, as spotctl's errors.

The SDK raises its own exceptions, so this mapping is the adapter's; an HTTP status they carry means
what the one rule of :mod:`spotctl.adapters._http` says, after OpenStack's own addition: a 400 or 403
that says "quota exceeded" or "no valid host" is a CapacityError (no room in that pool).
"""

from __future__ import annotations

from spotctl.core.errors import (
    AuthError,
    CapacityError,
    ConfigError,
    NotFoundError,
    SpotctlError,
    TemporaryError,
    UnavailableError,
)

from .. import _http


def translate(exc: BaseException, what: str) -> SpotctlError:
    """An SDK/HTTP error raised while doing ``what`` (``"nova list servers"``) as one of spotctl's errors."""
    from keystoneauth1 import exceptions as ka
    from openstack import exceptions as os_exc

    if isinstance(exc, SpotctlError):
        return exc
    msg = _message(exc)
    if isinstance(exc, os_exc.ConfigException):
        return ConfigError(f"{what}: {msg}", hint="check the region's `cloud` and clouds.yaml (OS_CLIENT_CONFIG_FILE)")
    if isinstance(exc, ka.Unauthorized):
        return AuthError(f"{what}: the cloud refused the credentials: {msg}",
                         hint="check the user, password and project of the cloud in clouds.yaml")
    if isinstance(exc, (ka.MissingRequiredOptions, ka.AuthorizationFailure, ka.NoMatchingPlugin)):
        return AuthError(f"{what}: cannot authenticate: {msg}")
    if isinstance(exc, (ka.ConnectFailure, ka.ConnectTimeout, ka.DiscoveryFailure, ka.EndpointNotFound,
                        ka.catalog.EndpointNotFound, ka.RetriableConnectionFailure)):
        if isinstance(exc, ka.ConnectTimeout) or "timed out" in msg.lower():
            return TemporaryError(f"{what}: timed out: {msg}")
        if _http.broke_off(exc):  # connected, then the exchange broke off: not now, as the HTTP rule says
            return TemporaryError(f"{what}: the connection broke off: {msg}")
        return UnavailableError(f"{what}: cloud endpoint unreachable: {msg}")
    if isinstance(exc, ka.http.Unauthorized):
        return AuthError(f"{what}: {msg}")
    status = getattr(exc, "status_code", None) or getattr(exc, "http_status", None)
    if isinstance(exc, ka.http.HttpError) and status is None:
        status = exc.http_status
    if status is not None:
        status = int(status)
        low = msg.lower()
        if status == 403 and "quota exceeded" in low:
            return CapacityError(f"{what}: {msg}")
        if status == 400 and ("quota" in low or "no valid host" in low):
            return CapacityError(f"{what}: {msg}")
        cls = _http.error_class(status)
        if cls is AuthError and status == 403:
            return AuthError(f"{what}: not allowed: {msg}", hint="spotctl's account needs the admin role to read "
                             "Placement, Ironic and Blazar")
        if cls is AuthError:
            return AuthError(f"{what}: the cloud refused the credentials: {msg}")
        if cls is NotFoundError:
            return NotFoundError(f"{what}: {msg}")
        return cls(f"{what}: HTTP {status}: {msg}")
    if isinstance(exc, (TimeoutError, os_exc.ResourceTimeout)):
        return TemporaryError(f"{what}: timed out: {msg}")
    if isinstance(exc, (ka.ClientException, os_exc.SDKException, OSError)):
        return UnavailableError(f"{what}: {msg}")
    return UnavailableError(f"{what}: {type(exc).__name__}: {msg}")


def _message(exc: BaseException) -> str:
    """The exception's message with the details the SDK keeps apart (the service's own words)."""
    details = getattr(exc, "details", None)
    base = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    if details and str(details) not in base:
        base = f"{base}: {details}"
    return base.strip()
