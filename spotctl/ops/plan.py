"""``spotctl plan``: observe and plan, change nothing."""

from __future__ import annotations

from spotctl.core.planner import Plan, plan as make_plan

from .observe import observe, plan_input
from .runtime import Runtime


def show_plan(rt: Runtime) -> tuple[Plan, dict[str, str]]:
    snap = observe(rt)
    return make_plan(plan_input(rt, snap)), snap.degraded
