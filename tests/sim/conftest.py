"""Shared helpers for the simulator tests: the demo region and a naive operator."""

from __future__ import annotations

import math

import pytest

from spotctl.core.errors import CapacityError
from spotctl.core.models import NoticeKind
from spotctl.sim import SimWorld, demo_region

START = 1_767_261_600.0  # 2026-01-01T10:00:00Z


@pytest.fixture(scope="session")
def region():
    return demo_region()


@pytest.fixture
def world(region):
    return SimWorld.new(region, START)


class NaiveOperator:
    """A crude stand-in for the orchestrator: launches for demand, drains on notices,
    deletes idle nodes. Enough to exercise every path of the world deterministically."""

    def __init__(self, world: SimWorld, per_pass: int = 3):
        self.w = world
        self.per_pass = per_pass
        self.n = 0

    def run(self, hours: float, every: float = 60.0) -> None:
        end = self.w.now + hours * 3600.0
        while self.w.now < end:
            self.w.advance(min(end, self.w.now + every))
            self.step()

    def step(self) -> None:
        w = self.w
        pools = w.region.pools
        by_id = {i.id: i for i in w.cloud.instances()}
        for notice in w.contract.notices():
            inst = by_id.get(notice.instance_id)
            if notice.kind is NoticeKind.HARD and inst is not None:
                if inst.status == "ACTIVE":
                    for s in w.schedulers:
                        s.drain(inst.name, "hard notice", notice.deadline)
                w.cloud.delete_instance(inst.id)
                by_id.pop(inst.id)
        demand: dict[str, int] = {}
        for s in w.schedulers:
            units, _ = s.pending(pools)
            for u in units:
                for name in sorted(pools):
                    if pools[name].serves(u):
                        demand[name] = demand.get(name, 0) + 1
                        break
        live: dict[str, int] = {}
        for i in by_id.values():
            live[i.pool] = live.get(i.pool, 0) + 1
        for name, count in sorted(demand.items()):
            for _ in range(min(self.per_pass, math.ceil(count / 4))):
                if live.get(name, 0) >= pools[name].max_nodes:
                    break
                self.n += 1
                try:
                    w.cloud.create_instance(pools[name], f"spot-{name}-{self.n:04d}", f"act-{self.n:04d}")
                except CapacityError:
                    break
                live[name] = live.get(name, 0) + 1
        busy: dict[str, list] = {}
        for s in w.schedulers:
            for u in s.usage():
                e = busy.setdefault(u.node, [0, 0.0])
                e[0] += u.running
                e[1] = max(e[1], u.last_busy_at or 0.0)
        for i in by_id.values():
            e = busy.get(i.name)
            if i.status == "ACTIVE" and e and e[0] == 0 and w.now - e[1] > 600:
                w.cloud.delete_instance(i.id)
                for s in w.schedulers:
                    s.forget(i.name, "idle")
