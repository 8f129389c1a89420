"""``spotctl plan``: observe and plan, change nothing; list and replay recorded plans."""

from __future__ import annotations

from spotctl.core.actions import Plan
from spotctl.core.errors import StateError, UsageError
from spotctl.core.plan_input import PlanInput
from spotctl.core.planner import plan as make_plan

from . import contract
from .observe import observe, plan_input, planned
from .runtime import Runtime

#: Plan sequence numbers are SQLite INTEGER PRIMARY KEYs: 1 .. 2**63 - 1.
MAX_SEQ = 2**63 - 1


def show_plan(rt: Runtime) -> tuple[Plan, dict[str, str], list[str]]:
    """The plan, the sources that were unavailable, and those that refused our credentials."""
    snap = observe(rt)
    conformance = contract.evaluate(rt, snap)
    return (planned(plan_input(rt, snap, no_notice=contract.degraded_pools(conformance)), rt.planner), snap.degraded,
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
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ:
        shown = str(seq)
        raise UsageError(f"--replay must be a plan sequence number between 1 and {MAX_SEQ}, got "
                         f"{shown if len(shown) <= 40 else shown[:39] + '…'}",
                         hint="`spotctl plan --history` lists the recorded plans")
    rec = rt.store.plan_record(seq)
    try:
        inp = PlanInput.from_dict(rec["input"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise StateError(f"state database {rt.store.path}: recorded plan #{seq} is corrupt: its input is not a plan "
                         f"input ({type(e).__name__}: {str(e)[:80]})",
                         hint="nothing was changed; the other recorded plans can still be replayed "
                              "(`spotctl plan --history`)",
                         details={"path": str(rt.store.path), "table": "plans", "row": seq}) from None
    p = make_plan(inp)
    # The plan id is derived from the input digest, so it matches by construction: what proves the
    # replay is the action list itself, compared with the digest recorded when the plan ran. A plan
    # recorded before digests were kept cannot be checked: "reproduced" is then null, not true.
    recorded = rec["summary"].get("actions_sha256")
    replayed = p.actions_digest()
    if recorded is None:
        reproduced, why = None, "this plan was recorded without its action digest; nothing to compare"
    elif recorded == replayed:
        reproduced, why = True, f"the replayed action list matches the recorded one ({len(p.actions)} actions)"
    else:
        kinds = rec["summary"].get("kinds")
        reproduced, why = False, (f"the replayed action list differs from the recorded one (recorded "
                                  f"{rec['summary'].get('actions')} actions {kinds}, replayed {len(p.actions)} "
                                  f"{[a.kind for a in p.actions]})")
    return {
        "seq": seq, "recorded_at": rec["at"], "actor": rec["actor"],
        "recorded_plan_id": rec["plan_id"], "replayed_plan_id": p.id,
        "recorded_actions_sha256": recorded, "replayed_actions_sha256": replayed,
        "reproduced": reproduced, "why": why, "plan": p,
    }
