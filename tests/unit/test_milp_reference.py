"""The MILP reference of the planner-quality benchmark (benchmarks/milp.py): its value bounds spotctl's decision,
and as a planner it returns a normal plan. highspy comes with the test extra (and the bench extra)."""

from __future__ import annotations

from benchmarks import milp
from spotctl.core.config import Policy
from spotctl.core.planner import plan

from ..factories import NOW, hosts, job, plan_input, pool, reservation



def _input():
    # a 2 h job the cheap pool's calendar cuts (its host is reserved in 2 h), and small jobs that fit anywhere
    cheap, dear = pool("cheap", boot=60), pool("dear", boot=60)
    hs = hosts("cheap", 1) + hosts("dear", 2)
    res = [reservation("cheap", ["cheap-h0"], NOW + 7200, NOW + 9 * 3600)]
    units = [job(1, seconds=7200)] + [job(i, seconds=600) for i in range(2, 8)]
    return plan_input([cheap, dear], hs, units, reservations=res, prices={"cheap": 1.0, "dear": 1.5},
                      policy=Policy(drain_seconds=120, calendar_advisory_seconds=3600))


def test_the_bound_is_at_most_spotctls_cost_and_keeps_the_calendar():
    inp = _input()
    d = milp.decision(inp)
    launched = {a.pool: a.count for a in plan(inp).actions if a.kind == "launch"}
    assert d.launches == launched and d.units == 7
    s = milp.solve(d, "min_cost")
    assert s.exact and s.value <= d.risk_cost + 1e-9
    cheap = [seg for seg in d.segments if seg.pool == "cheap"]
    assert cheap and all(seg.window < 7200 for seg in cheap)  # the long job cannot go there: the calendar
    m = milp.solve(d, "max_units", euro_per_hour=d.cost)
    assert m.value >= d.units


def test_the_milp_as_a_planner_returns_a_plan_of_launches():
    inp = _input()
    p = milp.plan(inp)
    launches = [a for a in p.actions if a.kind == "launch"]
    assert sum(a.units for a in launches) == 7
    assert all(a.id.startswith(p.id) for a in p.actions)
    assert {a.pool for a in launches} <= {"cheap", "dear"}
