"""Small builders of domain objects for unit tests of pure core logic."""

from __future__ import annotations

from spotctl.core.budget import Bucket
from spotctl.core.capacity import forward_calendar, headroom
from spotctl.core.config import Policy
from spotctl.core.models import (
    HostCapacity,
    KubernetesBinding,
    Node,
    NodeState,
    PoolClass,
    PoolKind,
    PoolSpec,
    Quota,
    RateCard,
    Reservation,
    Scheduler,
    Shape,
    SlurmBinding,
    WorkUnit,
)
from spotctl.core.plan_input import build_input

NOW = 1_800_000_000.0


def pool(name="p1", vcpu=8, ram=32768, gpus=0, max_nodes=50, kind=PoolKind.VM, partition="spot", az="az1",
         cleaning=0, boot=60):
    return PoolSpec(name=name, kind=kind, pool_class=PoolClass.HEADROOM, az=az, shape=Shape(vcpu, ram, gpus),
                    max_nodes=max_nodes, kubernetes=KubernetesBinding(labels=(("spot", "yes"),), taints=("spot=true:NoSchedule",)),
                    slurm=SlurmBinding(partition=partition), boot_seconds=boot, cleaning_seconds=cleaning)


def hosts(pool_name, n, vcpu=64, ram=262144, gpus=0, used=Shape(), spot=0):
    return [HostCapacity(name=f"{pool_name}-h{i}", pool=pool_name, capacity=Shape(vcpu, ram, gpus), used_other=used,
                         spot_nodes=spot) for i in range(n)]


def job(i, vcpu=4, ram=8192, seconds=3600, partition="spot", gpus=0, priority=0):
    return WorkUnit(id=f"slurm/{i}", scheduler=Scheduler.SLURM, shape=Shape(vcpu, ram, gpus), priority=priority,
                    expected_seconds=seconds, submitted_at=NOW - 60, partition=partition)


def node(i, pool_name="p1", state=NodeState.ACTIVE, idle_since=None, price=1.0):
    return Node(id=f"n{i}", pool=pool_name, state=state, action_id=f"a{i}", created_at=NOW - 7200,
                updated_at=NOW - 7200, instance_id=f"i{i}", idle_since=idle_since, price=price)


def plan_input(pools, all_hosts, units, *, reservations=(), prices=None, nodes=(), usage=(), notices=(),
               policy=None, quota=None, budget=None, failures=None, now=NOW, previous=None, version="rc-1"):
    pools = {p.name: p for p in pools}
    prices = prices or {name: 1.0 for name in pools}
    return build_input(
        region="t", now=now, pools=pools, policy=policy or Policy(spend_cap_per_hour=None),
        headroom={n: headroom(p, all_hosts, now) for n, p in pools.items()},
        calendars={n: forward_calendar(p, all_hosts, list(reservations), now) for n, p in pools.items()},
        quota=quota or Quota(), rate_card=RateCard(version, "EUR", prices, now, now + 300),
        nodes=list(nodes), usage=list(usage), notices=list(notices), units=list(units), excluded={},
        recent_reclaims={}, pool_failures=failures or {}, budget=budget or Bucket.full(10.0, 1000, now),
        previous_rate_card=previous,
    )


def reservation(pool_name, host_names, start, end, rid="r1"):
    return Reservation(id=rid, pool=pool_name, hosts=tuple(host_names), start=start, end=end)
