"""``spotctl plan``: observe and plan, change nothing; list and replay recorded plans."""

from __future__ import annotations

from spotctl.core.planner import Plan, PlanInput, plan as make_plan

from . import contract
from .observe import observe, plan_input
from .runtime import Runtime


def show_plan(rt: Runtime) -> tuple[Plan, dict[str, str], list[str]]:
    """The plan, the sources that were unavailable, and those that refused our credentials."""
    snap = observe(rt)
    conformance = contract.evaluate(rt, snap)
    return (make_plan(plan_input(rt, snap, no_notice=contract.degraded_pools(conformance))), snap.degraded,
            snap.auth_failed)


def history(rt: Runtime, limit: int = 20) -> list[dict]:
    """The most recent plans the reconciler executed, newest first."""
    return [{"seq": p["seq"], "plan_id": p["plan_id"], "at": p["at"], "actor": p["actor"],
             "actions": p["summary"].get("actions"), "launches": p["summary"].get("launches")}
            for p in rt.store.plans(limit)]


def replay(rt: Runtime, seq: int) -> dict:
    """Re-run the planner on a recorded input; the plan must come out identical.

    The planner is a pure function of its input, and the input is recorded with
    every executed plan, so a decision can be explained after the fact.
    """
    rec = rt.store.plan_record(seq)
    inp = PlanInput.from_dict(rec["input"])
    p = make_plan(inp)
    return {
        "seq": seq, "recorded_at": rec["at"], "actor": rec["actor"],
        "recorded_plan_id": rec["plan_id"], "replayed_plan_id": p.id,
        "reproduced": p.id == rec["plan_id"] and p.launches() == rec["summary"].get("launches"),
        "plan": p,
    }
