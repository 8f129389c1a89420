from __future__ import annotations

import pytest

from spotctl.core.config import load_config
from spotctl.core.ports import FixedClock
from spotctl.ops.runtime import Runtime
from spotctl.sim.world import SimWorld
from spotctl.state.store import Store

START = 1767571200.0 + 9 * 3600  # a Monday, 09:00 UTC


class Crash(BaseException):
    """Stands for the process dying (SIGKILL) at an exact point."""


@pytest.fixture
def region():
    return load_config(env={}).region("demo")


@pytest.fixture
def make_rt(tmp_path, region):
    made = []

    def make(world=None, cloud=None, db="state.db", start=START, seed=7):
        world = world or SimWorld.new(region, start, seed)
        store = Store.open(tmp_path / db, region.name)
        rt = Runtime(region=region, store=store, cloud=cloud or world.cloud, contract=world.contract,
                     schedulers=list(world.schedulers), clock=FixedClock(world.now), actor="tester",
                     concurrent_observe=False)
        made.append(store)
        return rt, world

    yield make
    for s in made:
        s.close()


def advance(rt, world, seconds, step=30):
    from spotctl.ops.reconcile import run_pass

    results = []
    end = rt.clock.now() + seconds
    while rt.clock.now() < end:
        rt.clock.advance(step)
        world.advance(rt.clock.now())
        results.append(run_pass(rt))
    return results
