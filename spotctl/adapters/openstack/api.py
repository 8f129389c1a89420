"""What the parts of the OpenStack adapter share: :class:`Api` (the region, its options, the clock,
one openstacksdk connection and :meth:`Api.call`, which puts every SDK call behind the error
boundary of :mod:`.errors`), the tags we put on what we create, and OpenStack's timestamps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from spotctl.core.config import RegionConfig
from spotctl.core.errors import SpotctlError
from spotctl.core.ports import Clock
from spotctl.core.timefmt import parse_ts

from .errors import translate
from .options import Options

if TYPE_CHECKING:
    import requests
    from openstack.connection import Connection

T = TypeVar("T")

TAG_REGION = "spotctl:region"
TAG_POOL = "spotctl:pool"
TAG_ACTION = "spotctl:action"
IRONIC_PREFIX = "ironic:"  # ironic:<node uuid>: a claim that has its node
ALLOC_PREFIX = "ironic-alloc:"  # ironic-alloc:<allocation uuid>: a claim Ironic has not given a node yet
# One polling interval for the bounded waits of tests and operators (ACTIVE, release): a wait reads a server
# at most once per interval (create_instance itself reads nothing: no pass waits).
POLL_SECONDS = 0.2


def _ts(value: str | None) -> float:
    """An OpenStack timestamp ('2024-05-01T10:00:00Z', '…:00.000000', '2024-05-01 10:00') as epoch seconds;
    without a zone it is UTC (as the APIs document). 0.0 when there is none; ValueError when malformed."""
    if not value:
        return 0.0
    try:
        t = parse_ts(value.strip(), assume_utc=True)
    except ValueError:
        raise ValueError(f"unrecognised timestamp {value!r}") from None
    return t or 0.0


def json_of(r: requests.Response, path: str) -> Any:
    """The JSON of a raw GET's answer (``raise_exc=False``); an error status raised as keystoneauth's
    exception for it, which :func:`.errors.translate` then maps like any other SDK error."""
    if r.status_code >= 400:
        from keystoneauth1 import exceptions as ka

        raise ka.from_response(r, "GET", path)
    return r.json()


class Api:
    """One region's cloud as the parts see it: ``clouds.yaml`` entry ``cloud_name``, one keystone
    session (built on first use) reused by every call."""

    def __init__(self, region: RegionConfig, cloud_name: str, options: Options, clock: Clock):
        self.region = region
        self.cloud_name = cloud_name
        self.options = options
        self.clock = clock  # timestamps the adapter stamps (a server with no created_at yet)
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @property
    def conn(self) -> Connection:
        """The openstacksdk connection (one keystone session, built once)."""
        if self._conn is None:
            with self._lock:
                if self._conn is None:
                    import openstack

                    try:
                        # no retries inside the SDK (Ironic's 409/503 are retried 5 times, ~16 s, by default):
                        # a pass never waits; the next pass tries again
                        self._conn = openstack.connect(cloud=self.cloud_name, api_timeout=self.options.timeout_seconds,
                                                       baremetal_status_code_retries=0,
                                                       image_status_code_retries=0)
                    except Exception as e:
                        raise translate(e, f"cloud {self.cloud_name!r}") from None
        return self._conn

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, with what it raises translated (``what`` starts the message: ``"nova list servers"``)."""
        try:
            return fn()
        except SpotctlError:
            raise
        except Exception as e:
            raise translate(e, what) from None
