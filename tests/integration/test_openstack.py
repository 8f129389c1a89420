"""The OpenStack adapter against a real cloud (scripts/testenv/openstack: Debian Zed, fake drivers).

Every test talks to the real Keystone/Placement/Nova/Ironic/Blazar started by the testenv
script; the test side uses openstacksdk as an admin to set the scene (another tenant's
server, a Blazar lease, a compute service forced down, a quota) and to check the result
independently of the adapter.

What a fake driver cannot show: real boot times (fake ACTIVE in < 1 s), hardware
cleaning (fake Ironic cleaning is instant), and Nova-managed bare metal (no
nova-compute with the ironic driver runs here; the Ironic-direct path is tested).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotctl.core.capacity import headroom
from spotctl.core.config import load_config
from spotctl.core.errors import AuthError, CapacityError, ConfigError
from spotctl.core.models import Scheduler, Shape, WorkUnit
from spotctl.core.planner import plan as make_plan

from .conftest import testenv as start_env
from .conftest import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REGION_TAG = "spotctl:region=lab"


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def osenv() -> dict[str, str]:
    return start_env("openstack")


@pytest.fixture(scope="module")
def admin(osenv):
    import openstack

    os.environ["OS_CLIENT_CONFIG_FILE"] = osenv["OS_CLIENT_CONFIG_FILE"]
    return openstack.connect(cloud=osenv["SPOTCTL_TESTENV_OS_ADMIN_CLOUD"])


@pytest.fixture
def env(osenv, tmp_path) -> dict[str, str]:
    """Environment for spotctl subprocesses: the lab config, its clouds.yaml, a fresh state dir."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTCTL_", "OS_"))}
    e.update(osenv)
    e["SPOTCTL_STATE_DIR"] = str(tmp_path / "state")
    e["NO_COLOR"] = "1"
    return e


@pytest.fixture
def region(env):
    return load_config(env=env).region("lab")


@pytest.fixture
def cloud(region, env, monkeypatch):
    from spotctl.adapters.openstack import OpenStackCloud

    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", env["OS_CLIENT_CONFIG_FILE"])
    return OpenStackCloud.from_config(region)


@pytest.fixture
def runtime(env, monkeypatch):
    """A real runtime for region lab (wiring → OpenStackCloud, static contract, SQLite state)."""
    from spotctl.wiring import build_runtime

    for k, v in env.items():
        if k.startswith(("SPOTCTL_", "OS_")):
            monkeypatch.setenv(k, v)
    rt = build_runtime(load_config(env=env), "lab")
    yield rt
    rt.store.close()


@pytest.fixture(autouse=True)
def clean_cloud(admin):
    """Start and end every test with no spot servers, tenant servers, leases, Ironic claims or forced-down hosts."""
    _cleanup(admin)
    yield
    _cleanup(admin)


def _cleanup(admin) -> None:
    servers = [s for s in admin.compute.servers(all_projects=True)
               if REGION_TAG in (s.tags or []) or s.name.startswith("tenant-")]
    for s in servers:
        admin.compute.delete_server(s, ignore_missing=True)
    for s in servers:
        admin.compute.wait_for_delete(s, wait=60, interval=0.25)
    for a in admin.baremetal.allocations():
        if (a.extra or {}).get("spotctl:region") == "lab":
            node = admin.baremetal.get_node(a.node_id) if a.node_id else None
            if node is not None and node.provision_state == "active":
                admin.baremetal.set_node_provision_state(node, "deleted", wait=True, timeout=60)
            admin.baremetal.delete_allocation(a, ignore_missing=True)
    for lease in _blazar(admin, "GET", "/leases").json()["leases"]:
        _blazar(admin, "DELETE", f"/leases/{lease['id']}")
    for svc in admin.compute.services(binary="nova-compute"):
        if svc.is_forced_down:
            admin.compute.update_service_forced_down(svc, svc.host, "nova-compute", False)
    spot = admin.identity.find_project("spot", ignore_missing=False)
    admin.compute.update_quota_set(spot, instances=20, cores=64, ram=65536)


def _blazar(admin, method: str, path: str, check: bool = True, **kw):
    r = admin.session.request("http://127.0.0.1:1234/v1" + path, method, raise_exc=False, **kw)
    assert not check or r.status_code < 400, f"blazar {method} {path}: {r.status_code} {r.text[:300]}"
    return r


def _spotctl(env, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "spotctl"), "-o", "json", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _placement_fit(admin, aggregate: str, shape: Shape) -> dict[str, int]:
    """Nodes of ``shape`` that fit on each host of a Nova aggregate, computed straight from Placement."""
    agg = next(a for a in admin.compute.aggregates() if a.name == aggregate)
    rps = admin.placement.get(f"/resource_providers?member_of={agg.uuid}", microversion="1.3").json()
    out = {}
    for rp in rps["resource_providers"]:
        inv = admin.placement.get(f"/resource_providers/{rp['uuid']}/inventories").json()["inventories"]
        if not inv:
            continue
        use = admin.placement.get(f"/resource_providers/{rp['uuid']}/usages").json()["usages"]
        free = {rc: int((i["total"] - i["reserved"]) * i["allocation_ratio"]) - use.get(rc, 0) for rc, i in inv.items()}
        out[rp["name"]] = min(free["VCPU"] // shape.vcpu, free["MEMORY_MB"] // shape.ram_mb)
    return out


def _tenant_server(admin, host: str, flavor: str = "tenant.odd", az: str = "az-general"):
    """An on-demand server of another project, pinned to a host (admin's az:host syntax)."""
    fl = admin.compute.find_flavor(flavor, ignore_missing=False)
    img = admin.image.find_image("spot-image", ignore_missing=False)
    s = admin.compute.create_server(name=f"tenant-{host}", flavor_id=fl.id, image_id=img.id, networks="none",
                                    availability_zone=f"{az}:{host}")
    return admin.compute.wait_for_server(s, wait=60, interval=0.25)


def _units(n: int, seconds: int, features: tuple[str, ...] = (), vcpu: int = 1, ram_mb: int = 1024) -> list[WorkUnit]:
    return [WorkUnit(id=f"job-{seconds}-{i}", scheduler=Scheduler.SLURM, shape=Shape(vcpu, ram_mb),
                     expected_seconds=seconds, partition="spot", features=features) for i in range(n)]


class PendingQueue:
    """A batch scheduler's queue reduced to its pending jobs (the Slurm/Kubernetes adapters are
    other issues): it gives the pass demand, so that the pass launches on the real cloud."""

    name = "slurm"

    def __init__(self, units: list[WorkUnit]):
        self.units = units

    def pending(self, pools):
        return list(self.units), []

    def usage(self):
        return []

    def cordon(self, node, reason):
        return None

    def drain(self, node, reason, deadline):
        return None

    def resume(self, node):
        return None

    def forget(self, node, reason):
        return None

    def protect(self, node, until, closed=False):
        self.protected = {**getattr(self, "protected", {}), node: (until, closed)}


# -- headroom, quota -------------------------------------------------------------------------------


def test_headroom_matches_placement_host_by_host(cloud, region, admin):
    pool = region.pools["general"]
    # a fragmented host: another tenant's 3 vCPU / 3 GiB server leaves RAM for one 2 GiB node less
    _tenant_server(admin, "fake-compute-2")
    want = _placement_fit(admin, "agg-general", pool.shape)
    hosts = [h for h in cloud.hosts(region.pools) if h.pool == "general"]
    assert {h.name: h.capacity.vcpu and (h.capacity - h.used_other) for h in hosts}  # sanity: both hosts seen
    got = {h.name: pool.shape.count_in(h.capacity - h.used_other) - h.spot_nodes for h in hosts}
    assert got == want
    assert {h.name for h in hosts} == {"fake-compute-1", "fake-compute-2"}
    frag = next(h for h in hosts if h.name == "fake-compute-2")
    assert frag.used_other == Shape(3, 3072)  # the tenant's server is foreign usage, not ours
    before = headroom(pool, hosts, time.time()).free
    assert before == sum(want.values())

    # launch N of ours: headroom drops by N, Placement agrees host by host, our usage is not "other"
    n = 3
    made = [cloud.create_instance(pool, f"spot-hr-{i}", f"hr-{i}") for i in range(n)]
    for inst in made:
        cloud.wait_active(inst.id, 60)
    hosts = [h for h in cloud.hosts(region.pools) if h.pool == "general"]
    assert sum(h.spot_nodes for h in hosts) == n
    assert next(h for h in hosts if h.name == "fake-compute-2").used_other == Shape(3, 3072)
    assert headroom(pool, hosts, time.time()).free == before - n
    assert {h.name: pool.shape.count_in(h.capacity - h.used_other) - h.spot_nodes for h in hosts} == \
        _placement_fit(admin, "agg-general", pool.shape)
    # a pool sharing the hosts (general-large) sees our general nodes as foreign usage
    large = [h for h in cloud.hosts(region.pools) if h.pool == "general-large"]
    assert sum(h.spot_nodes for h in large) == 0
    assert {h.name: h.used_other.vcpu for h in large} == {
        h.name: h.used_other.vcpu + 2 * h.spot_nodes for h in hosts}
    # Blazar's blazar_<host> providers (no inventory) are not hosts
    assert not any(h.name.startswith("blazar_") for h in cloud.hosts(region.pools))


def test_quota_caps_headroom(cloud, runtime, admin):
    from spotctl.ops.observe import observe, plan_input

    spot = admin.identity.find_project("spot", ignore_missing=False)
    inst = cloud.create_instance(runtime.region.pools["small"], "spot-q-0", "q-0")
    cloud.wait_active(inst.id, 60)  # Nova counts an instance against the quota once it is scheduled
    admin.compute.update_quota_set(spot, instances=2, cores=64, ram=65536)
    q = cloud.quota()
    assert q.instances == 1 and q.vcpu == 64 - 1 and q.ram_mb == 65536 - 1024
    snap = observe(runtime)
    snap.units.extend(_units(5, 600, features=("small",)))
    p = make_plan(plan_input(runtime, snap))
    launches = [a for a in p.actions if a.kind == "launch"]
    assert sum(a.count for a in launches) == 1, p.explain
    assert any("quota (instances)" in r for r in p.unplaced), p.unplaced
    # and Nova itself refuses past the quota: a CapacityError, not a crash
    cloud.wait_active(cloud.create_instance(runtime.region.pools["small"], "spot-q-1", "q-1").id, 60)
    with pytest.raises(CapacityError, match="(?i)quota"):
        cloud.create_instance(runtime.region.pools["small"], "spot-q-2", "q-2")
    assert inst.id


# -- Blazar: forward calendar ----------------------------------------------------------------------


def test_blazar_lease_drops_calendar_and_planner_keeps_long_work_out(env, runtime, admin, cloud):
    from spotctl.ops.observe import observe, plan_input

    start = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0) + dt.timedelta(hours=2)
    end = start + dt.timedelta(hours=3)
    lease = _blazar(admin, "POST", "/leases", json={
        "name": "itest-lease", "start_date": start.strftime("%Y-%m-%d %H:%M"), "end_date": end.strftime("%Y-%m-%d %H:%M"),
        "events": [], "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1,
                                        "hypervisor_properties": "", "resource_properties": ""}]}).json()["lease"]
    res = cloud.reservations(runtime.region.pools, time.time(), time.time() + 86400)
    assert {(r.pool, r.hosts) for r in res} == {("reserved", ("fake-compute-4",)), ("reserved-large", ("fake-compute-4",))}
    assert all(r.id == lease["id"] and r.start == start.timestamp() and r.end == end.timestamp() for r in res)

    proc = _spotctl(env, "plan")
    assert proc.returncode == 0, proc.stderr
    pools = {p["name"]: p for p in json.loads(proc.stdout)["data"]["pools"]}
    drop = pools["reserved"]["calendar_next_drop"]
    assert drop is not None and drop["capacity"] == 0
    assert drop["at"] == pytest.approx(start.timestamp() - runtime.region.pools["reserved"].cleaning_seconds)
    assert pools["general"]["calendar_next_drop"] is None and pools["small"]["calendar_next_drop"] is None

    # 6800 s of work fits the no-notice limit (7200 s) but not the window before the lease takes the host
    snap = observe(runtime)
    snap.units.extend(_units(2, 6800, features=("reserved",)) + _units(2, 1800, features=("reserved",)))
    p = make_plan(plan_input(runtime, snap))
    launched = sum(a.units for a in p.actions if a.kind == "launch" and a.pool.startswith("reserved"))
    assert launched == 2, p.explain
    assert [r for r in p.unplaced if r.startswith("calendar: reserved")], p.unplaced
    assert sum(p.unplaced.values()) == 2


# -- launch, adopt after a kill, lost, delete --------------------------------------------------------


def test_launch_roundtrip_tags_and_verified_release(cloud, region, admin):
    pool = region.pools["small"]
    t0 = time.monotonic()
    inst = cloud.create_instance(pool, "spot-rt-0", "rt-0")
    assert inst.status in ("BUILD", "ACTIVE") and time.monotonic() - t0 < 10  # does not block on ACTIVE
    inst = cloud.wait_active(inst.id, 60)
    s = admin.compute.get_server(inst.id)
    assert set(s.tags) == {"spotctl:region=lab", "spotctl:pool=small", "spotctl:action=rt-0"}
    assert s.metadata == {"spotctl:region": "lab", "spotctl:pool": "small", "spotctl:action": "rt-0"}
    assert s.addresses == {}  # networks="none"
    assert s.availability_zone == "az-small" and s.compute_host == "fake-compute-3"
    assert cloud.find_instance("rt-0").id == inst.id and cloud.find_instance("rt-x") is None
    allocs = admin.placement.get(f"/allocations/{inst.id}").json()["allocations"]
    assert allocs and not cloud.released(inst.id)
    took = cloud.delete_and_verify(inst.id, 60)
    assert took < 60
    assert admin.placement.get(f"/allocations/{inst.id}").json()["allocations"] == {}
    assert cloud.released(inst.id)
    cloud.delete_instance(inst.id)  # idempotent


def test_round_trip_reads_each_server_at_most_once_per_poll_interval(cloud, region):
    """create → wait_active → delete_and_verify: the same requests as raw openstacksdk waits (issue 9, item 5).

    No server is read twice within one polling interval (the hand-off from the scheduler-verdict wait to
    wait_active reuses the last read), and once Nova no longer lists the server only Placement is polled.
    """
    from spotctl.adapters.openstack import POLL_SECONDS

    assert cloud.released("00000000-0000-4000-8000-000000000000")  # one-off discovery (Nova, Placement) first
    sess = cloud.conn.session
    inner = sess.request
    reads: list[tuple[float, str, str]] = []

    def request(url, method, *a, **kw):
        r = inner(url, method, *a, **kw)
        reads.append((time.monotonic(), method, url))
        return r

    sess.request = request
    try:
        inst = cloud.create_instance(region.pools["small"], "spot-rt-1", "rt-1")
        cloud.wait_active(inst.id, 60)
        cloud.delete_and_verify(inst.id, 60)
    finally:
        del sess.request
    this = [(t, m, u) for t, m, u in reads if u.rstrip("/").endswith(f"servers/{inst.id}")]
    assert [m for _, m, _ in this].count("DELETE") == 1, this
    deleted_at = next(t for t, m, _ in this if m == "DELETE")
    for phase in ([t for t, m, _ in this if m == "GET" and t < deleted_at],   # schedule verdict + wait_active
                  [t for t, m, _ in this if m == "GET" and t > deleted_at]):  # delete_and_verify
        gaps = [b - a for a, b in zip(phase, phase[1:])]
        assert all(g >= 0.9 * POLL_SECONDS for g in gaps), gaps
    # after the read that shows the server gone, only Placement is polled
    last = max(i for i, (_, m, u) in enumerate(reads) if u.rstrip("/").endswith(f"servers/{inst.id}"))
    assert all(f"allocations/{inst.id}" in u for _, _, u in reads[last + 1:]), reads[last + 1:]
    # from the POST on, nothing but this server and its Placement allocations (flavor and image are looked up once)
    post = next(i for i, (_, m, u) in enumerate(reads) if m == "POST" and u.rstrip("/").endswith("servers"))
    assert all(inst.id in u for _, _, u in reads[post + 1:]), [(m, u) for _, m, u in reads[post + 1:]]


def test_testenv_listens_on_loopback_only(osenv):
    """Every socket the OpenStack testenv listens on (MariaDB, RabbitMQ + epmd + Erlang distribution,
    the APIs, the Neutron stub) is on 127.0.0.1 / ::1 (issue 9, item 2)."""
    proc = subprocess.run([str(ROOT / "scripts" / "testenv" / "openstack"), "listeners"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ports = {ln.split()[2].rsplit(":", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("ok ")}
    assert {"3306", "5672", "25672", "4369", "5000", "8778", "8774", "9292", "9696", "6385", "1234"} <= ports, ports


def test_kill_between_intent_and_effect_next_pass_adopts_without_duplicate(env, admin):
    """SIGKILL `spotctl launch` as soon as its first server exists; the next pass finishes the job."""
    from spotctl.state.store import Store

    import sqlite3

    db = Path(env["SPOTCTL_STATE_DIR"]) / "lab.db"
    proc = subprocess.Popen([str(BIN / "spotctl"), "-o", "json", "launch", "--pool", "general", "--count", "3"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Hold the state DB's write lock as soon as the first intended node is committed: the launch creates that
    # node's server, then blocks on recording it (busy timeout 10 s), and is killed there.
    lock = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and lock is None:
        try:
            c = sqlite3.connect(str(db), timeout=0.05, isolation_level=None)
            if c.execute("SELECT 1 FROM sqlite_master WHERE name='nodes'").fetchone() and \
                    c.execute("SELECT 1 FROM nodes WHERE state='intended'").fetchone():
                c.execute("BEGIN IMMEDIATE")
                lock = c
            else:
                c.close()
        except sqlite3.OperationalError:
            pass
        time.sleep(0.01)
    assert lock is not None, "no intended node appeared"
    wait_until(lambda: list(admin.compute.servers(all_projects=True, tags=REGION_TAG)), "the first server", 8)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    lock.execute("ROLLBACK")
    lock.close()
    store = Store.open(db, "lab")
    try:
        before = {n.action_id: n for n in store.nodes()}
    finally:
        store.close()
    servers = list(admin.compute.servers(all_projects=True, tags=REGION_TAG))
    assert servers, "the launch was killed before any server existed"
    # the kill left at least one node whose server exists but whose record does not know it
    intended = [n for n in before.values() if str(n.state) == "intended"]
    tagged = {next(t.split("=", 1)[1] for t in s.tags if t.startswith("spotctl:action=")) for s in servers}
    to_adopt = [n.action_id for n in intended if n.action_id in tagged]
    assert to_adopt, f"the kill missed the window: {len(servers)} servers, {len(intended)} intended nodes"

    r = _spotctl(env, "reconcile")
    assert r.returncode in (0, 7), r.stderr
    servers = list(admin.compute.servers(all_projects=True, tags=REGION_TAG))
    actions = [next(t.split("=", 1)[1] for t in s.tags if t.startswith("spotctl:action=")) for s in servers]
    assert len(actions) == len(set(actions)), f"duplicate servers for one action: {actions}"
    store = Store.open(db, "lab")
    try:
        nodes = store.nodes()
    finally:
        store.close()
    live = [n for n in nodes if n.live]
    assert {n.instance_id for n in live} == {s.id for s in servers}
    assert all(str(n.state) in ("building", "active") for n in live)
    # a second pass does what one pass does: nothing more
    r2 = _spotctl(env, "reconcile")
    assert r2.returncode == 0, r2.stderr
    assert len(list(admin.compute.servers(all_projects=True, tags=REGION_TAG))) == len(servers)


def test_server_deleted_behind_our_back_becomes_lost(env, admin):
    r = _spotctl(env, "launch", "--pool", "small", "--count", "2")
    assert r.returncode == 0, r.stderr
    nodes = json.loads(r.stdout)["data"]["outcome"]["nodes"]
    assert len(nodes) == 2
    r = _spotctl(env, "reconcile")
    assert r.returncode == 0, r.stderr
    servers = list(admin.compute.servers(all_projects=True, tags=REGION_TAG))
    victim = servers[0]
    admin.compute.delete_server(victim)
    admin.compute.wait_for_delete(victim, wait=60, interval=0.25)
    r = _spotctl(env, "reconcile")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["synced"]["lost"] == 1
    st = json.loads(_spotctl(env, "status", "--all").stdout)["data"]
    states = {n["instance_id"]: n["state"] for n in st["nodes"]}
    assert states[victim.id] == "lost"
    assert sorted(states.values()) == ["active", "lost"]
    assert st["pools"][[p["name"] for p in st["pools"]].index("small")]["nodes"] == 1


def test_no_valid_host_is_seen_by_the_next_pass_which_falls_back_without_waiting(runtime, admin):
    """NoValidHost comes from Nova's scheduler after the create returned: the pass that launched does not wait
    for it (rule 2); the next pass sees the ERROR server with its fault, fails the node, remembers the pool as
    full, deletes the server and launches in the next pool."""
    from spotctl.ops.reconcile import run_pass

    # the reserved pools (cheapest per vCPU) keep headroom in Placement, but their only host is down for Nova
    svc = next(s for s in admin.compute.services(binary="nova-compute") if s.host == "fake-compute-4")
    admin.compute.update_service_forced_down(svc, svc.host, "nova-compute", True)
    runtime.schedulers = [PendingQueue(_units(2, 1200))]
    t0 = time.monotonic()
    first = run_pass(runtime)
    took = time.monotonic() - t0
    launched = [o for o in first.outcomes if o.kind == "launch" and o.status == "ok"]
    assert launched and all(o.pool.startswith("reserved") for o in launched), [o.to_dict() for o in first.outcomes]
    assert took < 5, f"the launching pass took {took:.1f}s: it waited for the scheduler"
    ids = {n.instance_id for n in runtime.store.nodes(live_only=True)}
    wait_until(lambda: all(admin.compute.get_server(i).status == "ERROR" for i in ids), "NoValidHost", 60)

    second = run_pass(runtime)
    assert second.synced["failed"] == len(ids), second.to_dict()
    failed = {n.pool for n in runtime.store.nodes() if str(n.state) in ("failed", "deleting", "gone")}
    assert failed and all(p.startswith("reserved") for p in failed)
    assert set(runtime.store.pool_failures(runtime.now())) >= failed
    builds = [r for r in runtime.store.audit_records() if r["action"] == "node.build"]
    assert builds and all(r["result"] == "failed" and "no valid host" in r["inputs"]["fault"].lower()
                          for r in builds), builds
    ok = [o for o in second.outcomes if o.kind == "launch" and o.status == "ok"]
    assert ok and all(not o.pool.startswith("reserved") for o in ok), [o.to_dict() for o in second.outcomes]
    assert second.status == "ok", second.to_dict()
    # the ERROR servers are deleted by the pass that saw them
    deletes = [o for o in second.outcomes if o.kind == "delete"]
    assert len(deletes) == len(ids) and all(o.status == "ok" for o in deletes), [o.to_dict() for o in second.outcomes]
    wait_until(lambda: not [s for s in admin.compute.servers(all_projects=True, tags=REGION_TAG)
                            if s.status == "ERROR"], "ERROR servers deleted", 60)


# -- errors ---------------------------------------------------------------------------------------------


def _broken_config(env, tmp_path, *, cloud: str | None = None, flavor: str | None = None,
                   password: str | None = None) -> dict[str, str]:
    text = Path(env["SPOTCTL_CONFIG"]).read_text()
    if cloud:
        text = text.replace('cloud = "spotctl-lab"', f'cloud = "{cloud}"')
    if flavor:
        text = text.replace('flavor = "spot.small"', f'flavor = "{flavor}"')
    cfg = tmp_path / "spotctl.toml"
    cfg.write_text(text)
    e = dict(env, SPOTCTL_CONFIG=str(cfg))
    if password:
        clouds = Path(env["OS_CLIENT_CONFIG_FILE"]).read_text().replace("password: secret", f"password: {password}")
        (tmp_path / "clouds.yaml").write_text(clouds)
        e["OS_CLIENT_CONFIG_FILE"] = str(tmp_path / "clouds.yaml")
    return e


def test_bad_credentials_unknown_cloud_unknown_flavor_are_distinct_errors(env, tmp_path, admin):
    bad = _broken_config(env, tmp_path, password="wrong")
    r = _spotctl(bad, "launch", "--pool", "general")
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert "refused the credentials" in r.stderr and "401" in r.stderr
    r = _spotctl(bad, "status")
    assert r.returncode == 4, (r.returncode, r.stderr)

    r = _spotctl(_broken_config(env, tmp_path, cloud="no-such-cloud"), "status")
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "no-such-cloud" in r.stderr

    r = _spotctl(_broken_config(env, tmp_path, flavor="no.such.flavor"), "launch", "--pool", "small")
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "no.such.flavor" in r.stderr
    # nothing half-written: no server, no node record
    assert not list(admin.compute.servers(all_projects=True, tags=REGION_TAG))
    st = _spotctl(env, "status", "--all")
    assert json.loads(st.stdout)["data"]["nodes"] == []


def test_adapter_errors_translate(region, env, tmp_path, monkeypatch):
    from spotctl.adapters.openstack import OpenStackCloud

    bad = _broken_config(env, tmp_path, password="wrong")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", bad["OS_CLIENT_CONFIG_FILE"])
    with pytest.raises(AuthError, match="401"):
        OpenStackCloud.from_config(region)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", env["OS_CLIENT_CONFIG_FILE"])
    from dataclasses import replace

    with pytest.raises(ConfigError, match="nope"):
        OpenStackCloud.from_config(replace(region, cloud="nope"))


# -- bare metal through Ironic ------------------------------------------------------------------------------


def test_bare_metal_through_ironic_fake_hardware(cloud, region, admin):
    pool = region.pools["metal"]
    before = [h for h in cloud.hosts(region.pools) if h.pool == "metal"]
    assert len(before) == 3 and headroom(pool, before, time.time()).free == 3
    t0 = time.monotonic()
    inst = cloud.create_instance(pool, "spot-metal-0", "bm-0")
    assert time.monotonic() - t0 < 5 and inst.status == "BUILD"  # a claim, no wait for Ironic to pick a node
    assert inst.id.startswith(("ironic-alloc:", "ironic:"))
    inst = cloud.wait_active(inst.id, 60)  # (a test's wait: it deploys the claimed node, advance())
    assert inst.id.startswith("ironic:")
    state = cloud.ironic_node_state(inst.id)
    assert state["provision_state"] == "active" and state["name"] == inst.host
    node = admin.baremetal.get_node(inst.id.split(":", 1)[1])
    assert node.instance_info.get("display_name") == "spot-metal-0"
    assert cloud.find_instance("bm-0").id == inst.id
    assert [i.id for i in cloud.instances() if i.pool == "metal"] == [inst.id]
    after = [h for h in cloud.hosts(region.pools) if h.pool == "metal"]
    assert headroom(pool, after, time.time()).free == 2 and sum(h.spot_nodes for h in after) == 1
    # all nodes taken → CapacityError (the pass falls back), nothing left claimed
    extra = [cloud.create_instance(pool, f"spot-metal-{i}", f"bm-{i}") for i in (1, 2)]
    with pytest.raises(CapacityError, match="no available"):
        cloud.create_instance(pool, "spot-metal-3", "bm-3")
    assert len(list(admin.baremetal.allocations())) == 3
    for i in [inst, *extra]:
        assert cloud.delete_and_verify(i.id, 60) < 60
    assert not [i for i in cloud.instances() if i.pool == "metal"]
    assert all(n.provision_state == "available" for n in admin.baremetal.nodes(details=True))


def test_bare_metal_passes_claim_then_deploy_without_waiting(runtime, admin):
    """A pass claims an Ironic node and returns; a later pass deploys the claimed node (audited, a token
    spent); a later one sees it active. No pass waits for Ironic."""
    from spotctl.ops.reconcile import run_pass

    runtime.schedulers = [PendingQueue(_units(1, 1200, features=("metal",), vcpu=6, ram_mb=8192))]
    durations, deployed = [], []
    for _ in range(20):
        t0 = time.monotonic()
        result = run_pass(runtime)
        durations.append(time.monotonic() - t0)
        assert result.status == "ok", result.to_dict()
        deployed += [r for r in runtime.store.audit_records() if r["action"] == "node.deploy" and r not in deployed]
        nodes = [n for n in runtime.store.nodes(live_only=True) if n.pool == "metal"]
        if nodes and all(str(n.state) == "active" for n in nodes):
            break
        time.sleep(0.5)
    assert len(nodes) == 1 and str(nodes[0].state) == "active", nodes
    assert nodes[0].instance_id.startswith("ironic:") and nodes[0].host and nodes[0].host.startswith("bm-")
    assert [r["result"] for r in deployed] == ["ok"], deployed
    assert max(durations) < 5, durations
    node = admin.baremetal.get_node(nodes[0].instance_id.split(":", 1)[1])
    assert node.provision_state == "active" and node.instance_info.get("display_name") == nodes[0].id


# -- performance ------------------------------------------------------------------------------------------------


def test_observe_reads_every_pool(runtime):
    """The observe phase sees all pools and hosts (its speed is measured by benchmarks/os_cloud.py)."""
    from spotctl.ops.observe import observe

    snap = observe(runtime)
    assert not snap.degraded, snap.degraded
    assert len(runtime.region.pools) >= 6 and len({h.name for h in snap.hosts}) >= 3


# -- host-aware placement (issue 18): boots kept off a soon-reserved host, and where they landed ------------

SAFE, SOON = "fake-compute-1", "fake-compute-2"  # the pool "general" (agg-general, az-general): 3 medium nodes each


def _blazar_host(admin, name: str) -> str | None:
    return next((h["id"] for h in _blazar(admin, "GET", "/os-hosts").json()["hosts"]
                 if h["hypervisor_hostname"] == name), None)


@pytest.fixture
def soon_reserved(admin, env, tmp_path):
    """Pool "general" on two hosts, one of which a lease takes in 68-69 minutes: fake-compute-2 is handed to
    Blazar for the test (it joins Blazar's freepool, staying in agg-general) and leased by name. Yields a
    function of the pool's ``host_placement`` that returns (the region, the adapter, the lease start)."""
    from spotctl.adapters.openstack import OpenStackCloud

    if _blazar_host(admin, SOON) is None:
        _blazar(admin, "POST", "/os-hosts", json={"name": SOON})
    # 68-69 minutes out: past the calendar advisory (an hour ahead, plus a boot), and a window shorter than an hour
    start = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0) + dt.timedelta(minutes=69)
    lease = _blazar(admin, "POST", "/leases", json={
        "name": "itest-hostaware", "start_date": start.strftime("%Y-%m-%d %H:%M"),
        "end_date": (start + dt.timedelta(hours=2)).strftime("%Y-%m-%d %H:%M"), "events": [],
        "reservations": [{"resource_type": "physical:host", "min": 1, "max": 1, "resource_properties": "",
                          "hypervisor_properties": json.dumps(["=", "$hypervisor_hostname", SOON])}]}).json()["lease"]

    def make(mode: str):
        cfg = tmp_path / f"config-{mode}.toml"
        cfg.write_text(Path(env["SPOTCTL_CONFIG"]).read_text()
                       + f'\n[regions.lab.openstack.pools.general]\nhost_placement = "{mode}"\n')
        region = load_config(env={**env, "SPOTCTL_CONFIG": str(cfg)}).region("lab")
        return region, OpenStackCloud.from_config(region), start.timestamp()

    try:
        yield make
    finally:
        _cleanup(admin)  # servers and leases first: Blazar gives a host back only when nothing is on it
        hid = _blazar_host(admin, SOON)
        if hid is not None:
            wait_until(lambda: not any(lease["id"] == le["id"] for le in _blazar(admin, "GET", "/leases").json()["leases"]),
                       "lease deleted", 30)
            _blazar(admin, "DELETE", f"/os-hosts/{hid}")


@pytest.mark.parametrize("mode", ["target", "hint"])
def test_a_boot_restricted_to_safe_hosts_lands_only_there(soon_reserved, admin, mode, monkeypatch, env):
    """The plan's host choice (no reservation before boot + 2 h of work + drain) keeps every boot off the host a
    lease takes in an hour: ``target`` asks Nova for the safe host by name (microversion 2.74, admin policy),
    ``hint`` excludes the other with a JsonFilter ``query`` (enabled in the testenv's scheduler). The adapter
    reports where each server landed, as the admin's independent view says; when the safe host is full, a
    restricted boot is refused (no safe room) and an unrestricted one lands on the soon-reserved host, which
    the landing rule flags as a calendar risk."""
    from spotctl.core.hostaware import landed_at_risk, not_before, reclaims_by_host
    from spotctl.core.models import HostChoice, NodeState

    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", env["OS_CLIENT_CONFIG_FILE"])
    region, cloud, start = soon_reserved(mode)
    pool = region.pools["general"]
    assert {h.name for h in cloud.hosts({"general": pool})} == {SAFE, SOON}
    now = time.time()
    reclaims = reclaims_by_host(cloud.reservations({"general": pool}, now, now + 86400), {"general": pool}, now)
    assert reclaims == {SOON: pytest.approx(start - pool.cleaning_seconds)}
    choice = HostChoice(not_before(now, pool, region.policy, 2 * 3600))
    assert not choice.acceptable(reclaims[SOON]) and choice.acceptable(None)

    made = [cloud.create_instance(pool, f"spot-ha-{i}", f"ha-{mode}-{i}", choice) for i in range(3)]
    for inst in made:
        cloud.wait_active(inst.id, 60)
    landed = {i.id: i.host for i in cloud.instances() if i.pool == "general"}
    seen = {inst.id: admin.compute.get_server(inst.id).compute_host for inst in made}
    assert seen == {inst.id: SAFE for inst in made}
    assert landed == seen  # the adapter's landing check agrees with the admin's view

    # Nova's hostId (what an account without admin sees) names the same host: the adapter maps it back
    assert cloud.nova.host_ids[admin.compute.get_server(made[0].id).host_id] == SAFE

    if mode == "target":
        with pytest.raises(CapacityError, match="no host with room that no reservation takes before"):
            cloud.create_instance(pool, "spot-ha-3", f"ha-{mode}-3", choice)
    else:
        late = cloud.create_instance(pool, "spot-ha-3", f"ha-{mode}-3", choice)
        with pytest.raises(CapacityError):  # NoValidHost: the only host with room is the excluded one
            cloud.wait_active(late.id, 60)
        cloud.delete_and_verify(late.id)
    # without a choice (host_placement off, or a plan from before) Nova can only use the soon-reserved host
    risky = cloud.wait_active(cloud.create_instance(pool, "spot-ha-4", f"ha-{mode}-4").id, 60)
    assert risky.host == SOON == admin.compute.get_server(risky.id).compute_host
    t = time.time()
    assert landed_at_risk(NodeState.ACTIVE, 0, reclaims.get(risky.host), t, region.policy, 2 * 3600)
    assert not landed_at_risk(NodeState.ACTIVE, 0, reclaims.get(SAFE), t, region.policy, 2 * 3600)


def test_a_node_nova_put_on_a_soon_reserved_host_is_closed_by_the_next_plan_and_explained(soon_reserved, runtime,
                                                                                         admin):
    """The landing check and its correction through real passes (``host_placement`` off, as the lab sets it): the
    safe host is full of another tenant's servers, so Nova puts the pass's node on the host a lease takes in an
    hour; the next pass reads where it landed and protects it as a calendar risk, and its plan says why."""
    from spotctl.ops.reconcile import run_pass

    soon_reserved("off")  # the lease on fake-compute-2
    for i in range(3):  # fake-compute-1: 3 × 2 GiB of another tenant leave less than one medium node's RAM
        s = _tenant_server(admin, SAFE, flavor="spot.medium")
        admin.compute.update_server(s, name=f"tenant-{SAFE}-{i}")
    runtime.schedulers = [PendingQueue(_units(1, 1200, features=("general",), vcpu=2, ram_mb=2048))]
    first = run_pass(runtime)
    launches = [o for o in first.outcomes if o.kind == "launch"]
    assert len(launches) == 1, (first.plan.explain, first.plan.unplaced)
    (launch,) = launches
    assert (launch.pool, launch.status) == ("general", "ok"), [o.to_dict() for o in first.outcomes]
    (act,) = [a for a in first.plan.actions if a.kind == "launch"]
    assert act.inputs["host_choice"]["not_before"]  # recorded, though this region does not apply it
    (node,) = runtime.store.nodes(live_only=True)
    wait_until(lambda: admin.compute.get_server(node.instance_id).compute_host, "the server placed", 60)
    assert admin.compute.get_server(node.instance_id).compute_host == SOON

    second = run_pass(runtime)
    assert runtime.store.find_node(node.id).host == SOON  # the landing, as the adapter reported it
    (prot,) = [a for a in second.plan.actions if a.kind == "protect"]
    assert prot.node == node.id and prot.inputs["landing_risk"] is True and prot.inputs["closed"] is True
    assert prot.reason.startswith("calendar risk: the node landed on a soon-reserved host")
    assert any(f"landed on host {SOON}" in line and "calendar risk" in line for line in second.plan.explain), \
        second.plan.explain
    assert runtime.schedulers[0].protected[node.id][1] is True  # the scheduler was told: closed
