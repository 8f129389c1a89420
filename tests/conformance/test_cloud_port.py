"""CloudPort conformance: the same checks on the simulator and on the OpenStack adapter against the
real test cloud (scripts/testenv/openstack: Keystone, Placement, Nova, Ironic and Blazar, fake drivers).

What a pass relies on, whoever implements the port:

* ``create_instance`` returns at once (BUILD or ACTIVE, no wait for the cloud's scheduler) and the
  instance is adopted by its tag: ``find_instance(action_id)`` finds it, ``instances()`` lists it with
  its pool and action id, an unknown action is None;
* once the cloud has placed it, ``hosts()`` counts it as ours on its host and the pool's headroom has
  one node less; after delete and release both come back;
* ``advance`` of an instance without a step returns it as it is;
* ``delete_instance`` is idempotent (twice, or an id the cloud never had); ``released`` is a pure read
  that turns True once the capacity is back;
* a pool without room is said, at once (CapacityError) or later (an ERROR instance with ``no_room`` and
  the cloud's fault), never left as a BUILD; past the quota, create is a CapacityError and leaves nothing.

The sides differ in how time passes: the simulator's clock moves only when the test advances the world
(``Side.wait`` steps it one virtual second at a time); on OpenStack the test polls the real cloud with
``wait_until``. Neither is a wait inside spotctl.

Below the shared checks: error translation at the OpenStack adapter's boundary, with real answers
where the test cloud can be made to give them (401 bad password, 403 a tenant without admin rights,
404 an unknown Ironic node, 409 a conflicting Ironic allocation, 403 over quota in the shared check
above). 429 and 5xx cannot be provoked from the real services; they are produced by a loopback HTTP
server in place of Keystone, so that keystoneauth raises its own exceptions from real responses through
the adapter (the exception classes alone are covered by tests/unit/test_openstack_translate.py).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from spotctl.core.capacity import headroom
from spotctl.core.errors import (
    AuthError,
    CapacityError,
    ExitCode,
    NotFoundError,
    TemporaryError,
    UnavailableError,
)
from spotctl.core.models import HostCapacity, Instance, PoolSpec
from spotctl.core.ports import CloudPort

from ..integration import conftest as harness

START = 1_767_261_600.0
T = TypeVar("T")


@dataclass
class Side:
    port: CloudPort
    pools: dict[str, PoolSpec]
    pool: str  # a VM pool with room for a few nodes
    now: Callable[[], float]
    #: let time pass (virtual or real) until ``pred`` is truthy; returns its value
    wait: Callable[[Callable[[], Any], str], Any]
    #: run ``fn``; what it changed in the cloud (empty: a pure read)
    mutations: Callable[[Callable[[], object]], list[str]]
    #: arrange a pool that has no room for one more node; its name
    full_pool: Callable[[], str]
    #: let the spot project's instance quota allow ``n`` more instances than it holds now
    cap_instances: Callable[[int], None]
    #: arrange a pool where a reservation takes some hosts in about an hour and others stay free of it:
    #: (a port of the same cloud that applies host choices, the pool's name, the soon-reserved hosts)
    soon_reserved: Callable[[], tuple[CloudPort, str, set[str]]] = lambda: (_ for _ in ()).throw(NotImplementedError)
    cleanup: Callable[[], None] = lambda: None


def _ids() -> tuple[str, str]:
    aid = "conf-" + uuid.uuid4().hex[:10]
    return aid, "spot-" + aid


# --- the simulator ------------------------------------------------------------------------------------


def _sim_side() -> Side:
    from spotctl.sim import SimWorld, demo_region

    region = demo_region()
    world = SimWorld.new(region, START, 5)

    def wait(pred, what, timeout=600):
        for _ in range(timeout):
            v = pred()
            if v:
                return v
            world.advance(world.now + 1)  # one virtual second
        raise AssertionError(f"simulated world: {what} not reached in {timeout} virtual seconds")

    def mutations(fn):
        before = json.dumps(world.dump(), sort_keys=True, default=str)
        fn()
        return [] if json.dumps(world.dump(), sort_keys=True, default=str) == before else ["the world's state"]

    def full_pool():
        pool = region.pools["bm-gpu-az2"]  # a few bare-metal machines: filled through the port itself
        for i in range(100):
            try:
                world.cloud.create_instance(pool, f"spot-fill-{i}", f"fill-{i}")
            except CapacityError:
                return pool.name
        raise AssertionError(f"pool {pool.name} never filled")

    def cap_instances(n):
        limit, left = world.knobs.quota_instances, world.cloud.quota().instances
        assert limit is not None and left is not None
        world.knobs = replace(world.knobs, quota_instances=limit - left + n)  # the admin's quota, in the sim

    def soon_reserved():
        from spotctl.sim.cloud import Lease

        pool = region.pools["gp-az1"]
        hosts = [h.name for h in world.fleet.hosts_by_pool[pool.name]]
        soon = set(hosts[:-1])  # every host but the last in name order, which the sim's first fit would use last
        start = world.now + 3600 + pool.cleaning_seconds
        world.fleet.add_lease(Lease("conf-lease", pool.name, tuple(sorted(soon)), start, start + 7200, world.now,
                                    pool.cleaning_seconds))  # the simulated cloud's admin books a lease
        return world.cloud, pool.name, soon

    return Side(world.cloud, region.pools, "gp-az1", lambda: world.now, wait, mutations, full_pool, cap_instances,
                soon_reserved)


# --- the OpenStack test cloud ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab():
    """The test cloud's env, an admin connection and the lab region (OS_CLIENT_CONFIG_FILE set for the module)."""
    import openstack

    from spotctl.core.config import load_config

    env = harness.testenv("openstack")
    mp = pytest.MonkeyPatch()
    mp.setenv("OS_CLIENT_CONFIG_FILE", env["OS_CLIENT_CONFIG_FILE"])
    admin = openstack.connect(cloud=env["SPOTCTL_TESTENV_OS_ADMIN_CLOUD"])
    region = load_config(env={"SPOTCTL_CONFIG": env["SPOTCTL_CONFIG"]}).region("lab")
    yield env, admin, region
    mp.undo()


def _openstack_side(lab) -> Side:
    from spotctl.adapters.openstack import OpenStackCloud
    from tests.integration.test_openstack import _cleanup

    env, admin, region = lab
    _cleanup(admin)  # no spot servers, claims, leases or forced-down hosts; the spot quota as the lab sets it
    cloud = OpenStackCloud.from_config(region)

    def wait(pred, what, timeout=30):
        return harness.wait_until(pred, what, timeout)

    def mutations(fn):
        sess = cloud.conn.session
        inner = sess.request
        writes: list[str] = []

        def request(url, method, *a, **kw):
            if method.upper() not in ("GET", "HEAD"):
                writes.append(f"{method} {url}")
            return inner(url, method, *a, **kw)

        sess.request = request
        try:
            fn()
        finally:
            del sess.request
        return writes

    def full_pool():
        # The reserved pools' one host is down for Nova: Placement still shows its headroom, so Nova's
        # scheduler (not the API) refuses the server, after create_instance returned: NoValidHost.
        svc = next(s for s in admin.compute.services(binary="nova-compute") if s.host == "fake-compute-4")
        admin.compute.update_service_forced_down(svc, svc.host, "nova-compute", True)
        return "reserved"

    def cap_instances(n):
        spot = admin.identity.find_project("spot", ignore_missing=False)
        used = admin.compute.get_quota_set(spot, usage=True).usage["instances"]
        admin.compute.update_quota_set(spot, instances=used + n)

    made: list[str] = []

    def soon_reserved():
        import datetime as dt
        import tempfile

        from spotctl.core.config import load_config
        from tests.integration.test_openstack import SOON, _blazar, _blazar_host

        if _blazar_host(admin, SOON) is None:
            _blazar(admin, "POST", "/os-hosts", json={"name": SOON})
        made.append(SOON)
        start = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0) + dt.timedelta(hours=1)
        _blazar(admin, "POST", "/leases", json={
            "name": "conf-hostaware", "start_date": start.strftime("%Y-%m-%d %H:%M"),
            "end_date": (start + dt.timedelta(hours=2)).strftime("%Y-%m-%d %H:%M"), "events": [],
            "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1, "resource_properties": "",
                              "hypervisor_properties": json.dumps(["=", "$hypervisor_hostname", SOON])}]})
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(Path(env["SPOTCTL_CONFIG"]).read_text() + '\n[regions.lab.openstack.pools.general]\n'
                    'host_placement = "target"\n')
        targeted = load_config(env={"SPOTCTL_CONFIG": f.name}).region("lab")
        Path(f.name).unlink()
        return OpenStackCloud.from_config(targeted), "general", {SOON}

    def cleanup():
        from tests.integration.test_openstack import _blazar, _blazar_host

        _cleanup(admin)
        for name in made:  # Blazar gives a host back once nothing is on it and no lease holds it
            hid = _blazar_host(admin, name)
            if hid is not None:
                harness.wait_until(lambda: _blazar(admin, "DELETE", f"/os-hosts/{hid}", check=False).status_code < 400,
                                   f"blazar host {name} released", 30)

    return Side(cloud, region.pools, "small", time.time, wait, mutations, full_pool, cap_instances, soon_reserved,
                cleanup)


@pytest.fixture(params=["sim", pytest.param("openstack", marks=pytest.mark.integration)])
def side(request):
    s = _sim_side() if request.param == "sim" else _openstack_side(request.getfixturevalue("lab"))
    yield s
    s.cleanup()


def _pool_hosts(side: Side, name: str) -> list[HostCapacity]:
    hosts = side.port.hosts({name: side.pools[name]})
    assert hosts and all(h.pool == name for h in hosts)
    return hosts


def _placed(side: Side, name: str, nodes_before: int, action_id: str):
    """Once the cloud has placed the instance: (hosts of the pool, the instance), else None."""
    hosts = _pool_hosts(side, name)
    inst = side.port.find_instance(action_id)
    if sum(h.spot_nodes for h in hosts) == nodes_before + 1 and inst is not None and inst.host:
        return hosts, inst
    return None


# --- the shared checks ----------------------------------------------------------------------------------


def test_it_is_a_cloud_port(side):
    assert isinstance(side.port, CloudPort)
    assert side.port.reads_reservations is True  # both read a calendar (simulated leases, Blazar)


def test_a_launch_returns_at_once_is_adopted_by_its_tag_and_takes_one_node_of_headroom(side):
    pool = side.pools[side.pool]
    before = _pool_hosts(side, pool.name)
    nodes0, free0 = sum(h.spot_nodes for h in before), headroom(pool, before, side.now()).free
    assert free0 >= 1, f"pool {pool.name} has no room to start with"
    aid, name = _ids()

    t0 = time.monotonic()
    inst = side.port.create_instance(pool, name, aid)
    assert time.monotonic() - t0 < 10  # no wait for the cloud's scheduler (a generous bound for slow CI)
    assert inst.status in ("BUILD", "ACTIVE") and inst.action_id == aid and inst.pool == pool.name and inst.id

    # adopted by its tag: what the next pass, or a pass after a crash, looks up before creating anything
    found = side.port.find_instance(aid)
    assert found is not None and found.id == inst.id and found.pool == pool.name and found.action_id == aid
    listed = {i.id: i for i in side.port.instances()}
    assert inst.id in listed and (listed[inst.id].pool, listed[inst.id].action_id) == (pool.name, aid)
    assert side.port.find_instance("conf-never-" + uuid.uuid4().hex[:8]) is None

    # nothing to take a step on: advance gives the instance back as it is
    assert inst.step == "" and side.port.advance(inst) == inst
    assert side.port.advance(listed[inst.id]) == listed[inst.id]

    # once placed: ours on its host, one node less of headroom
    after, placed = side.wait(lambda: _placed(side, pool.name, nodes0, aid), "the instance placed")
    assert headroom(pool, after, side.now()).free == free0 - 1
    rose = [h.name for h, b in zip(after, before) if h.spot_nodes == b.spot_nodes + 1]
    assert [h.name for h in after] == [h.name for h in before] and rose == [placed.host]


def test_a_boot_with_a_host_choice_lands_only_on_hosts_no_reservation_takes_before_it(side):
    """Host-aware placement (issue 18): with the plan's choice (no reservation before boot + 2 h of work + drain),
    every node lands on a host that no reservation takes before then, and the port says which."""
    from spotctl.core.config import Policy
    from spotctl.core.hostaware import not_before, reclaims_by_host
    from spotctl.core.models import HostChoice

    port, name, soon = side.soon_reserved()
    pool = side.pools[name]
    now = side.now()
    reclaims = reclaims_by_host(port.reservations({name: pool}, now, now + 86400), {name: pool}, now)
    assert set(reclaims) == soon
    choice = HostChoice(not_before(now, pool, Policy(), 2 * 3600))
    assert not any(choice.acceptable(reclaims[h]) for h in soon)
    made = []
    for i in range(2):
        aid, node = _ids()
        made.append(port.create_instance(pool, node, aid, choice).id)
    landed = side.wait(lambda: (lambda hs: hs if len(hs) == len(made) and all(hs.values()) else None)(
        {i.id: i.host for i in port.instances() if i.id in made}), "the instances placed")
    assert not set(landed.values()) & soon, landed
    assert all(choice.acceptable(reclaims.get(h)) for h in landed.values())


def test_released_is_a_pure_read_and_delete_is_idempotent(side):
    pool = side.pools[side.pool]
    before = _pool_hosts(side, pool.name)
    nodes0, free0 = sum(h.spot_nodes for h in before), headroom(pool, before, side.now()).free
    aid, name = _ids()
    inst = side.port.create_instance(pool, name, aid)
    side.wait(lambda: _placed(side, pool.name, nodes0, aid), "the instance placed")

    answers: list[bool] = []
    assert side.mutations(lambda: answers.extend(side.port.released(inst.id) for _ in range(3))) == []
    assert answers == [False] * 3  # still there, still holding its allocation
    assert side.port.find_instance(aid) is not None

    assert side.mutations(lambda: side.port.delete_instance(inst.id))  # (the purity check sees a change)
    side.port.delete_instance(inst.id)  # again: not an error
    ghost = str(uuid.uuid4())
    side.port.delete_instance(ghost)  # an id the cloud never had: not an error either
    assert side.port.released(ghost) is True

    side.wait(lambda: side.port.released(inst.id), "the capacity released")
    assert side.mutations(lambda: answers.append(side.port.released(inst.id))) == [] and answers[-1] is True
    side.port.delete_instance(inst.id)  # gone for good: still not an error
    assert side.port.find_instance(aid) is None and inst.id not in {i.id for i in side.port.instances()}
    after = _pool_hosts(side, pool.name)
    assert sum(h.spot_nodes for h in after) == nodes0 and headroom(pool, after, side.now()).free == free0


def test_a_pool_without_room_is_refused_at_once_or_later_with_no_room(side):
    name = side.full_pool()
    pool = side.pools[name]
    aid, iname = _ids()
    t0 = time.monotonic()
    try:
        inst = side.port.create_instance(pool, iname, aid)
    except CapacityError as e:  # refused now (the simulator's first fit)
        assert e.exit_code == ExitCode.REFUSED and time.monotonic() - t0 < 10
        assert side.port.find_instance(aid) is None  # nothing half-made
        return
    # refused later (Nova's scheduler, after the API accepted the server): an ERROR instance that says so
    assert time.monotonic() - t0 < 10 and inst.status in ("BUILD", "ACTIVE")

    def failed() -> Instance | None:
        return next((i for i in side.port.instances() if i.id == inst.id and i.status != "BUILD"), None)

    got = side.wait(failed, "the cloud's verdict")
    assert got.status == "ERROR" and got.no_room is True and "no valid host" in got.fault.lower(), got
    assert (got.pool, got.action_id) == (name, aid)
    assert side.port.advance(got) == got


def test_past_the_instance_quota_create_is_a_capacity_error_and_leaves_nothing(side):
    pool = side.pools[side.pool]
    nodes0 = sum(h.spot_nodes for h in _pool_hosts(side, pool.name))
    aid, name = _ids()
    side.port.create_instance(pool, name, aid)
    side.wait(lambda: _placed(side, pool.name, nodes0, aid), "the instance placed")  # counted by the quota
    side.cap_instances(0)
    assert side.port.quota().instances == 0
    over, over_name = _ids()
    with pytest.raises(CapacityError, match="(?i)quota") as e:  # Nova: 403 "Quota exceeded for instances"
        side.port.create_instance(pool, over_name, over)
    assert e.value.exit_code == ExitCode.REFUSED
    assert side.port.find_instance(over) is None
    assert [i.action_id for i in side.port.instances() if i.pool == pool.name].count(aid) == 1


# --- error translation at the OpenStack adapter's boundary (real answers) ---------------------------


def _reads(cloud, region) -> dict[str, Callable[[], object]]:
    """The port's reads, each of which must meet the cloud."""
    return {"hosts": lambda: cloud.hosts(region.pools), "quota": cloud.quota, "instances": cloud.instances,
            "find_instance": lambda: cloud.find_instance("conf-x"),
            "released": lambda: cloud.released(str(uuid.uuid4()))}


@pytest.mark.integration
def test_a_bad_password_is_an_auth_error_on_every_call(lab, tmp_path, monkeypatch):
    """401 from Keystone, met on the first call (the adapter built without logging in first)."""
    from spotctl.adapters.openstack import OpenStackCloud
    from spotctl.adapters.openstack.options import _options
    from tests.integration.test_openstack import _broken_config

    env, _, region = lab
    bad = _broken_config(env, tmp_path, password="wrong")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", bad["OS_CLIENT_CONFIG_FILE"])
    cloud = OpenStackCloud(region, region.cloud or "spotctl-lab", _options(region), connect=False)
    calls = dict(_reads(cloud, region), create_instance=lambda: cloud.create_instance(
        region.pools["small"], "spot-conf-401", "conf-401"), delete_instance=lambda: cloud.delete_instance(
        str(uuid.uuid4())))
    for what, call in calls.items():
        with pytest.raises(AuthError, match="401") as e:
            call()
        assert e.value.exit_code == ExitCode.AUTH == 4, what


@pytest.mark.integration
def test_a_project_without_admin_rights_is_an_auth_error(lab, monkeypatch):
    """403: the tenant's user may list its own servers but not read the hosts (Placement, aggregates, Blazar)."""
    from spotctl.adapters.openstack import OpenStackCloud

    env, _, region = lab
    tenant = OpenStackCloud.from_config(replace(region, cloud=env["SPOTCTL_TESTENV_OS_TENANT_CLOUD"]))
    assert tenant.instances() == []  # logged in: the 403 below is about rights, not credentials
    with pytest.raises(AuthError, match="403") as e:
        tenant.hosts(region.pools)
    assert e.value.exit_code == ExitCode.AUTH and "not allowed" in e.value.message


@pytest.mark.integration
def test_an_unknown_object_is_not_found(lab):
    """404 from Ironic and Nova, translated; the port's tolerant calls (delete, released) stay tolerant."""
    from spotctl.adapters.openstack import OpenStackCloud

    _, _, region = lab
    cloud = OpenStackCloud.from_config(region)
    ghost = str(uuid.uuid4())
    claim = Instance(id=f"ironic:{ghost}", name="spot-conf-ghost", pool="metal", status="BUILD",
                     action_id="conf-ghost", step="deploy")
    with pytest.raises(NotFoundError, match="404") as e:
        cloud.advance(claim)  # deploy a claimed node that Ironic does not have
    assert e.value.exit_code == ExitCode.NOT_FOUND == 5
    with pytest.raises(NotFoundError) as e:
        cloud._call("nova get server", lambda: cloud.conn.compute.get_server(ghost))
    assert e.value.exit_code == ExitCode.NOT_FOUND
    cloud.delete_instance(ghost)
    cloud.delete_instance(f"ironic-alloc:{ghost}")  # a claim Ironic no longer has
    assert cloud.released(ghost) and cloud.released(f"ironic:{ghost}") and cloud.released(f"ironic-alloc:{ghost}")


@pytest.mark.integration
def test_deleting_an_ironic_node_that_is_gone_is_no_error(lab):
    """CloudPort.delete_instance: deleting one that is already gone is not an error (else ops fails the delete
    every pass and the node stays deleting)."""
    from spotctl.adapters.openstack import OpenStackCloud

    _, _, region = lab
    cloud = OpenStackCloud.from_config(region)
    ghost = f"ironic:{uuid.uuid4()}"
    assert cloud.released(ghost)  # the adapter itself says it is gone...
    cloud.delete_instance(ghost)  # ...so deleting it is no error


@pytest.mark.integration
def test_a_conflict_is_temporary(lab):
    """409 from Ironic: an allocation named like one that exists. Temporary (exit 8), nothing made."""
    from spotctl.adapters.openstack import OpenStackCloud
    from tests.integration.test_openstack import _cleanup

    env, admin, region = lab
    _cleanup(admin)
    try:
        cloud = OpenStackCloud.from_config(region)
        metal = region.pools["metal"]
        aid, name = _ids()
        first = cloud.create_instance(metal, name, aid)
        assert first.status == "BUILD"
        t0 = time.monotonic()
        with pytest.raises(TemporaryError, match="409") as e:
            cloud.create_instance(metal, name, aid + "-again")
        took = time.monotonic() - t0
        assert e.value.exit_code == ExitCode.UNAVAILABLE and isinstance(e.value, UnavailableError)
        assert cloud.find_instance(aid + "-again") is None
        assert [i.action_id for i in cloud.instances() if i.pool == "metal"] == [aid]
    finally:
        _cleanup(admin)
    # openstacksdk would retry Ironic's 409/503 itself (baremetal_status_code_retries = 5: 0.5+1+2+4+8 s)
    # before the adapter sees the error: a pass would block ~15 s on one call. The adapter turns that off.
    assert took < 5, f"a 409 from Ironic took {took:.1f} s to reach the adapter (SDK retries)"


class _Refusing(BaseHTTPRequestHandler):
    """Keystone's place on loopback, answering every request with the status the test asks for."""

    server: Any

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        status = self.server.status
        body = json.dumps({"error": {"code": status, "title": "refused", "message": f"loopback says {status}"}})
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def refusing_cloud(lab, tmp_path, monkeypatch):
    """The lab region with clouds.yaml's cloud "refusing" pointing at the loopback server: (region, server)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    srv.status = 503  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text(
        "clouds:\n  refusing:\n    auth:\n"
        f"      auth_url: http://127.0.0.1:{srv.server_address[1]}/v3\n"
        "      username: spotctl\n      password: any\n      project_name: spot\n"
        "      user_domain_name: Default\n      project_domain_name: Default\n"
        "    region_name: RegionOne\n    identity_api_version: 3\n")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
    _, _, region = lab
    yield region, srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.integration
@pytest.mark.parametrize("status", [409, 429, 500, 502, 503, 504])
def test_rate_limits_and_server_errors_are_temporary(refusing_cloud, status):
    from spotctl.adapters.openstack import OpenStackCloud
    from spotctl.adapters.openstack.options import _options

    region, srv = refusing_cloud
    srv.status = status
    cloud = OpenStackCloud(region, "refusing", _options(region), connect=False)
    for what, call in _reads(cloud, region).items():
        t0 = time.monotonic()
        with pytest.raises(TemporaryError, match=f"HTTP {status}") as e:
            call()
        assert e.value.exit_code == ExitCode.UNAVAILABLE, what
        assert time.monotonic() - t0 < 5, f"{what}: the adapter waited on a {status}"
    # logging in at construction meets the same answer: a warning, the calls retry later (not an AuthError)
    assert OpenStackCloud.from_config(replace(region, cloud="refusing")).cloud_name == "refusing"


@pytest.mark.integration
def test_an_unreachable_cloud_is_unavailable(lab, tmp_path, monkeypatch):
    import socket

    from spotctl.adapters.openstack import OpenStackCloud
    from spotctl.adapters.openstack.options import _options

    env, _, region = lab
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = Path(env["OS_CLIENT_CONFIG_FILE"]).read_text().replace("127.0.0.1:5000", f"127.0.0.1:{port}")
    (tmp_path / "clouds.yaml").write_text(text)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "clouds.yaml"))
    cloud = OpenStackCloud(region, region.cloud or "spotctl-lab", _options(region), connect=False)
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match="unreachable") as e:
        cloud.instances()
    assert e.value.exit_code == ExitCode.UNAVAILABLE and time.monotonic() - t0 < 5
