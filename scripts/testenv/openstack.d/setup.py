#!/usr/bin/python3
"""Create what spotctl's integration tests expect in the test cloud (idempotent).

Run by ``scripts/testenv/openstack up`` with Debian's python3 and openstacksdk.

  setup.py keystone   projects, users, roles, service catalog
  setup.py cloud      wait for the computes; flavors, image, aggregates/AZs, quotas,
                      Ironic nodes, Blazar host; write the spotctl config (region ``lab``)
  setup.py check      exit 0 when the cloud answers and its 4 computes are up
"""

import os
import sys
import time

import openstack

PW = os.environ.get("PW", "secret")
SERVICE_USERS = ("nova", "placement", "glance", "ironic", "blazar", "neutron")
ENDPOINTS = (
    ("placement", "placement", "http://127.0.0.1:8778"),
    ("nova", "compute", "http://127.0.0.1:8774/v2.1"),
    ("glance", "image", "http://127.0.0.1:9292"),
    ("neutron", "network", "http://127.0.0.1:9696"),
    ("ironic", "baremetal", "http://127.0.0.1:6385"),
    ("blazar", "reservation", "http://127.0.0.1:1234/v1"),
)
COMPUTES = ("fake-compute-1", "fake-compute-2", "fake-compute-3", "fake-compute-4")
# name -> (vcpus, ram_mb, disk_gb)
FLAVORS = {"spot.small": (1, 1024, 1), "spot.medium": (2, 2048, 1), "spot.large": (4, 4096, 1),
           "tenant.odd": (3, 3072, 1)}
# nova aggregate -> (availability zone, hosts)
AGGREGATES = {"agg-general": ("az-general", ("fake-compute-1", "fake-compute-2")),
              "agg-small": ("az-small", ("fake-compute-3",))}
BLAZAR_HOSTS = ("fake-compute-4",)  # Blazar moves them into its "freepool" aggregate
IRONIC_NODES = ("bm-0", "bm-1", "bm-2")
IRONIC_RC = "baremetal-spot"


def log(msg: str) -> None:
    print(f"[setup {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def keystone() -> None:
    c = openstack.connect(cloud="lab-admin")
    idn = c.identity
    dom = idn.find_domain("default")

    def project(name):
        return idn.find_project(name, domain_id=dom.id) or idn.create_project(name=name, domain_id=dom.id)

    def role(name):
        return idn.find_role(name) or idn.create_role(name=name)

    def user(name, proj):
        return idn.find_user(name, domain_id=dom.id) or idn.create_user(
            name=name, password=PW, domain_id=dom.id, default_project_id=proj.id)

    svc, spot, tenant = project("service"), project("spot"), project("tenant")
    admin, member, reader, service = role("admin"), role("member"), role("reader"), role("service")
    for name in SERVICE_USERS:
        u = user(name, svc)
        c.grant_role(admin.id, user=u.id, project=svc.id)
        c.grant_role(service.id, user=u.id, project=svc.id)
    # spotctl's account: admin in the spot project (Placement, Ironic and Blazar host reads need admin)
    u = user("spotctl", spot)
    for r in (admin, member, reader):
        c.grant_role(r.id, user=u.id, project=spot.id)
    # an ordinary tenant whose servers are the "on-demand" usage spotctl must not count as its own
    u = user("tenant", tenant)
    for r in (member, reader):
        c.grant_role(r.id, user=u.id, project=tenant.id)
    for name, stype, url in ENDPOINTS:
        found = [s for s in idn.services() if s.type == stype]
        s = found[0] if found else idn.create_service(name=name, type=stype, is_enabled=True)
        have = {e.interface for e in idn.endpoints(service_id=s.id)}
        for itf in ("public", "internal", "admin"):
            if itf not in have:
                idn.create_endpoint(service_id=s.id, interface=itf, url=url, region_id="RegionOne")
    log("keystone ok")


def wait(desc, fn, timeout=300, interval=1.0):
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # services still starting
            last = e
        time.sleep(interval)
    sys.exit(f"timeout waiting for {desc}: {last!r}")


def cloud() -> None:
    c = openstack.connect(cloud="lab-admin")
    t0 = time.time()

    def computes_ready():
        up = {s.host for s in c.compute.services(binary="nova-compute") if s.state == "up"}
        hv = {h.name for h in c.compute.hypervisors()}
        rps = {r.name for r in c.placement.resource_providers()}
        return set(COMPUTES) <= up and set(COMPUTES) <= hv and set(COMPUTES) <= rps

    wait("nova computes (service up, hypervisor mapped, resource provider)", computes_ready)
    log(f"computes ready after {time.time() - t0:.1f}s")
    for name, (vcpus, ram, disk) in FLAVORS.items():
        if not c.compute.find_flavor(name):
            c.compute.create_flavor(name=name, vcpus=vcpus, ram=ram, disk=disk, is_public=True)
    if not c.image.find_image("spot-image"):
        c.image.create_image(name="spot-image", data=b"\0" * 1024, disk_format="raw", container_format="bare",
                             visibility="public", allow_duplicates=False)
    aggs = {a.name: a for a in c.compute.aggregates()}
    for name, (az, hosts) in AGGREGATES.items():
        agg = aggs.get(name) or c.compute.create_aggregate(name=name, availability_zone=az)
        for h in hosts:
            if h not in (agg.hosts or []):
                agg = c.compute.add_host_to_aggregate(agg, h)
    if "freepool" not in aggs:
        c.compute.create_aggregate(name="freepool")
    spot = c.identity.find_project("spot", ignore_missing=False)
    r = c.compute.put(f"/os-quota-sets/{spot.id}", json={"quota_set": {"instances": 20, "cores": 64, "ram": 65536}})
    r.raise_for_status()
    log("flavors, image, aggregates, quotas ok")

    bm = c.baremetal
    for name in IRONIC_NODES:
        node = bm.find_node(name)
        if node is None:
            node = bm.create_node(name=name, driver="fake-hardware", resource_class=IRONIC_RC,
                                  properties={"cpus": 8, "memory_mb": 16384, "local_gb": 100})
        if node.provision_state == "enroll":
            node = bm.set_node_provision_state(node, "manage", wait=True, timeout=120)
        if node.provision_state == "manageable":
            node = bm.set_node_provision_state(node, "provide", wait=True, timeout=120)
        if bm.get_node(node.id).power_state is None:
            # fake-hardware leaves power_state unset, and Ironic allocations skip nodes without one
            bm.set_node_power_state(node, "power off", wait=True, timeout=60)
    log("ironic nodes ok")

    def blazar_up():
        r = c.session.get("http://127.0.0.1:1234/v1/os-hosts", endpoint_filter=None, raise_exc=False)
        return r.status_code == 200 and r

    r = wait("blazar api", blazar_up, timeout=120, interval=0.5)
    have = {h["hypervisor_hostname"] for h in r.json()["hosts"]}
    for h in BLAZAR_HOSTS:
        if h not in have:
            resp = c.session.post("http://127.0.0.1:1234/v1/os-hosts", json={"name": h}, raise_exc=False)
            if resp.status_code >= 300:
                sys.exit(f"blazar host-create {h}: {resp.status_code} {resp.text[:300]}")
    log("blazar hosts ok")
    config()


def config() -> None:
    """Write spotctl's config for the lab (every `up`: a cloud left running keeps up with the repo's config)."""
    out = os.environ.get("SPOTCTL_CONFIG_OUT")
    if out:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            f.write(CONFIG)
        os.replace(tmp, out)
        log(f"wrote {out}")


def check() -> None:
    c = openstack.connect(cloud="lab-admin")
    up = {s.host for s in c.compute.services(binary="nova-compute") if s.state == "up"}
    if not set(COMPUTES) <= up:
        sys.exit("computes not up")
    c.session.get("http://127.0.0.1:1234/v1/os-hosts")


CONFIG = '''\
# Generated by scripts/testenv/openstack up: region "lab" on the test cloud (Debian Zed, fake drivers).
# Hosts: fake-compute-1/2 (agg-general, AZ az-general, Medium fake: 10 vCPU / 8 GiB, cpu ratio 4.0 and 2.0),
# fake-compute-3 (agg-small, AZ az-small, Small fake: 2 vCPU x 4.0 / 8 GiB), fake-compute-4 (Blazar's freepool,
# AZ nova); Ironic fake-hardware nodes bm-0..2 of resource class baremetal-spot.
# No contract feed: prices are list prices, every pool runs under the no-notice policy.
default_region = "lab"

[regions.lab]
backend = "openstack"
cloud = "spotctl-lab"

[regions.lab.budget]
rate = 5
burst = 60

[regions.lab.policy]
idle_ttl_seconds = 3600
max_launches_per_pass = 10

[regions.lab.openstack]
image = "spot-image"
networks = "none"
wait_active_seconds = 60
delete_verify_seconds = 60
blazar = true
user_data = """#cloud-config
# spot node {name} of pool {pool} in region {region} (action {action_id})
"""

[regions.lab.openstack.pools.metal]
via = "ironic"

[regions.lab.pools.general]
kind = "vm"
az = "az-general"
aggregate = "agg-general"
flavor = "spot.medium"
vcpu = 2
ram_mb = 2048
price = 0.05
max_nodes = 20
slurm = { partition = "spot", features = ["general"] }

[regions.lab.pools.general-large]
kind = "vm"
az = "az-general"
aggregate = "agg-general"
flavor = "spot.large"
vcpu = 4
ram_mb = 4096
price = 0.11
max_nodes = 10
slurm = { partition = "spot", features = ["general"] }

[regions.lab.pools.small]
kind = "vm"
az = "az-small"
aggregate = "agg-small"
flavor = "spot.small"
vcpu = 1
ram_mb = 1024
price = 0.03
max_nodes = 20
slurm = { partition = "spot", features = ["small"] }

[regions.lab.pools.reserved]
kind = "vm"
class = "reserved-idle"
az = "nova"
aggregate = "freepool"
flavor = "spot.medium"
vcpu = 2
ram_mb = 2048
price = 0.02
cleaning_seconds = 300
max_nodes = 10
slurm = { partition = "spot", features = ["reserved"] }

[regions.lab.pools.reserved-large]
kind = "vm"
class = "reserved-idle"
az = "nova"
aggregate = "freepool"
flavor = "spot.large"
vcpu = 4
ram_mb = 4096
price = 0.04
cleaning_seconds = 300
max_nodes = 5
slurm = { partition = "spot", features = ["reserved"] }

[regions.lab.pools.metal]
kind = "baremetal"
az = "nova"
resource_class = "baremetal-spot"
vcpu = 8
ram_mb = 16384
price = 0.40
boot_seconds = 60
cleaning_seconds = 120
max_nodes = 3
slurm = { partition = "spot", features = ["metal"] }
'''

if __name__ == "__main__":
    {"keystone": keystone, "cloud": cloud, "check": check, "config": config}[sys.argv[1]]()
