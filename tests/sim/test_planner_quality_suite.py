"""The planner-quality benchmark's parts (issue 18): the scenario suite is deterministic for its seeds, the
runtime's planner hook is what every pass plans with (the fallback re-plan included), and the new knobs
keep today's behaviour by default."""

from __future__ import annotations

import json

from benchmarks.scenarios import make_pools, suite, world_factory
from spotctl.core import plan_greedy
from spotctl.core.planner import plan
from spotctl.ops.simulate import simulate
from spotctl.sim import SimWorld, demo_region
from spotctl.sim.knobs import Knobs

from .conftest import START


class Counting:
    """A planner variant behind the planner's interface: spotctl's planner, its calls counted by virtual time."""

    def __init__(self, inner=plan):
        self.inner = inner
        self.at: list[float] = []

    def __call__(self, inp):
        self.at.append(inp.now)
        return self.inner(inp)


def test_the_suite_is_deterministic_for_its_seeds():
    a, b = suite(), suite()
    assert [s.name for s in a] == [s.name for s in b]
    assert a == b  # regions, knobs, failures: all drawn from the seeds
    assert {len(s.region.pools) for s in a} >= {6, 12, 100}
    assert make_pools(30, 5) == make_pools(30, 5) and make_pools(30, 5) != make_pools(30, 6)
    sc = next(s for s in suite(quick=True) if s.name == "mixed-6")
    runs = [simulate(sc.region, world_factory(sc), hours=0.5, seed=sc.seed) for _ in range(2)]
    for r in runs:
        r.pop("wall_seconds")
    assert json.dumps(runs[0], sort_keys=True) == json.dumps(runs[1], sort_keys=True)


def test_simulate_plans_every_pass_with_the_runtime_planner():
    sc = next(s for s in suite(quick=True) if s.name == "mixed-6")
    counting = Counting()
    passes: list[float] = []
    rep = simulate(sc.region, world_factory(sc), hours=0.5, seed=sc.seed, planner=counting,
                   on_pass=lambda t, r: passes.append(t))
    assert rep["reconciler"]["passes"] == len(passes) == 30
    assert sorted(set(counting.at)) == passes  # every pass planned through the hook, at its time
    default = simulate(sc.region, world_factory(sc), hours=0.5, seed=sc.seed)
    assert rep["cost"] == default["cost"] and rep["demand"] == default["demand"]  # the same planner: the same run


def test_the_fallback_replan_uses_the_runtime_planner_too():
    sc = next(s for s in suite(quick=True) if s.name == "failing-12")
    counting = Counting(plan_greedy.plan)
    failed_at: list[float] = []

    def on_pass(t, r):
        if any(o.kind == "launch" and o.status == "failed" for o in r.outcomes):
            failed_at.append(t)

    simulate(sc.region, world_factory(sc), hours=1.0, seed=sc.seed, planner=counting, on_pass=on_pass)
    assert failed_at, "the scenario's cheapest pools fail to launch: the greedy planner goes there first"
    for t in failed_at:  # the pass that saw a launch fail re-planned with the same planner
        assert counting.at.count(t) >= 2


def test_new_knobs_default_to_todays_world():
    k = Knobs()
    assert k.price_swing_ticks == 0 and k.late_notice_pools == () and k.slurm_limits is None
    region = demo_region()
    a, b = SimWorld.new(region, START), SimWorld.new(region, START, knobs=Knobs(price_swing=0.5))
    assert a.contract.rate_card().prices == b.contract.rate_card().prices  # no swing without its period
    c = SimWorld.new(region, START, knobs=Knobs(price_swing=0.5, price_swing_ticks=2))
    assert c.contract.rate_card().prices != a.contract.rate_card().prices
    assert Knobs.from_dict(Knobs(late_notice_pools=("gp-az1",)).to_dict()).late_notice_pools == ("gp-az1",)
