"""The OpenStack adapter's pure helpers: error translation at the boundary, timestamps, resource classes.

The SDK's own exception classes are raised and translated (no cloud needed); everything that
talks to a cloud is tested in tests/integration/test_openstack.py against the real services.
"""

from __future__ import annotations

import pytest

from spotctl.adapters.openstack import translate
from spotctl.adapters.openstack.api import _ts
from spotctl.adapters.openstack.nova import _networks
from spotctl.adapters.openstack.placement import _rc
from spotctl.core.config import RegionConfig
from spotctl.core.errors import (
    AuthError,
    CapacityError,
    ConfigError,
    NotFoundError,
    RefusedError,
    TemporaryError,
    UnavailableError,
)


def _http(status: int, message: str):
    from openstack import exceptions as os_exc

    return os_exc.HttpException(message=message, http_status=status)


@pytest.mark.parametrize(("exc", "kind"), [
    (lambda: _http(403, "Quota exceeded for cores: Requested 2, but already used 64 of 64 cores"), CapacityError),
    (lambda: _http(403, "Policy doesn't allow os_compute_api:os-hypervisors to be performed."), AuthError),
    (lambda: _http(401, "The request you have made requires authentication."), AuthError),
    (lambda: _http(404, "Flavor x could not be found."), NotFoundError),
    (lambda: _http(409, "Cannot 'delete' instance while it is in task_state deleting"), TemporaryError),
    (lambda: _http(429, "Too many requests"), TemporaryError),
    (lambda: _http(503, "Service Unavailable"), TemporaryError),
    # a 400 is refused (exit 6), as every adapter's HTTP rule says (spotctl.adapters._http); it was
    # UnavailableError here while the contract feed said RefusedError and Kubernetes exit 1
    (lambda: _http(400, "Invalid input"), RefusedError),
    (lambda: _http(405, "Method not allowed"), UnavailableError),
    (lambda: _http(410, "Gone"), TemporaryError),
])
def test_http_errors_become_spotctl_errors(exc, kind):
    err = translate(exc(), "nova create server")
    assert type(err) is kind
    assert err.message.startswith("nova create server")


def test_keystoneauth_errors():
    from keystoneauth1 import exceptions as ka
    from openstack import exceptions as os_exc

    assert type(translate(ka.Unauthorized("The request you have made requires authentication. (HTTP 401)"),
                          "keystone login")) is AuthError
    down = translate(ka.ConnectFailure("Unable to establish connection to http://127.0.0.1:5000/v3"), "keystone")
    assert type(down) is UnavailableError and "unreachable" in down.message
    assert type(translate(ka.ConnectTimeout("timed out"), "nova")) is TemporaryError
    assert type(translate(os_exc.ConfigException("Cloud nope was not found."), "cloud 'nope'")) is ConfigError
    assert isinstance(translate(RuntimeError("boom"), "x"), UnavailableError)


def test_timestamps_are_utc():
    assert _ts("2026-01-01T00:00:00Z") == 1767225600.0
    assert _ts("2026-01-01T00:00:00.000000") == 1767225600.0
    assert _ts("2026-01-01 00:00") == 1767225600.0
    assert _ts("2026-01-01T00:00:00+00:00") == 1767225600.0
    assert _ts(None) == 0.0
    with pytest.raises(ValueError):
        _ts("yesterday")


def test_resource_class_and_networks():
    assert _rc("baremetal-spot") == "CUSTOM_BAREMETAL_SPOT"
    assert _rc("baremetal.gold") == "CUSTOM_BAREMETAL_GOLD"
    assert _rc("CUSTOM_X") == "CUSTOM_X"
    assert _networks("none") == "none" and _networks("auto") == "auto"
    assert _networks("a, b") == [{"uuid": "a"}, {"uuid": "b"}]


def test_config_errors_before_any_call():
    from spotctl.adapters.openstack import OpenStackCloud
    from spotctl.core.models import PoolClass, PoolKind, PoolSpec, Shape

    vm = PoolSpec(name="p", kind=PoolKind.VM, pool_class=PoolClass.HEADROOM, az="nova", shape=Shape(1, 1024))
    region = RegionConfig(name="r", backend="openstack", pools={"p": vm}, cloud="c")
    with pytest.raises(ConfigError, match="no flavor"):
        OpenStackCloud.from_config(region)
    region = RegionConfig(name="r", backend="openstack", pools={"p": vm}, cloud=None)
    with pytest.raises(ConfigError, match="names no cloud"):
        import os

        saved = os.environ.pop("OS_CLOUD", None)
        try:
            OpenStackCloud.from_config(region)
        finally:
            if saved is not None:
                os.environ["OS_CLOUD"] = saved
    bm = PoolSpec(name="m", kind=PoolKind.BAREMETAL, pool_class=PoolClass.HEADROOM, az="nova", shape=Shape(8, 16384))
    region = RegionConfig(name="r", backend="openstack", pools={"m": bm}, cloud="c",
                          sections={"openstack": {"pools": {"m": {"via": "ironic"}}}})
    with pytest.raises(ConfigError, match="resource_class"):
        OpenStackCloud.from_config(region)
    region = RegionConfig(name="r", backend="openstack", pools={"m": bm}, cloud="c",
                          sections={"openstack": {"pools": {"x": {"via": "ironic"}}}})
    with pytest.raises(ConfigError, match="names no pool"):
        OpenStackCloud.from_config(region)
