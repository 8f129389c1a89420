"""Planner v1: a pure, deterministic function (PlanInput) -> Plan.

``plan`` decides on a :class:`~spotctl.core.plan_input.PlanInput` alone (built from an observed
snapshot by :func:`~spotctl.core.plan_input.build_input`), so a recorded input reproduces its plan
exactly. It runs ordered sub-planners over one shared :class:`~spotctl.core.plan_state.PlanState`;
the order of decisions is the order of the budget's claims:

1. housekeeping (:mod:`~spotctl.core.plan_housekeeping`) — hard notices: drain; expired deadlines:
   delete; advisories: cordon → pre-spin → drain, cleared or timed out: uncordon (one rule with the
   watcher: :func:`~spotctl.core.notices.decide_notice`); drains under way: the next round, and
   delete once empty; failed builds: delete;
2. the calendar at run time — nodes whose host a reservation takes: tell their schedulers by when
   work must end;
3. demand (:mod:`~spotctl.core.plan_demand`) — fill free room on our nodes first, then pack the
   rest into new nodes of the cheapest, least risky pool whose forward calendar leaves time for the
   work to finish and drain; respecting headroom (host by host), quota, pool limits, spend cap and
   the token budget;
4. scale down — idle nodes past the idle TTL, within the disruption budget;
5. consolidation (:mod:`~spotctl.core.plan_consolidate`) — retire a busy node whose work fits on our other
   nodes, or move it to one new node of a cheaper pool, when the saving held for two rate-card ticks and
   every guard holds (risk, node age, run time); what is left of the same disruption budget;
6. host-aware placement (:func:`~spotctl.core.hostaware.choose_hosts`) — each launch (of demand or of a
   move) records the earliest host reclaim its nodes can live with, for the cloud to place them by;
7. summary — actions sorted by priority class (stable), with the plan's pools, demand and inputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .actions import Plan
from .budget import Priority
from .models import ActionKind, NodeState
from .plan_demand import fill_existing, next_drop, nodes_by_pool, pack_new, pool_score
from .hostaware import choose_hosts
from .plan_consolidate import consolidate, disruption_allowed
from .plan_housekeeping import housekeeping, protect_windows
from .plan_input import PlanInput
from .plan_state import PlanState


def plan(inp: PlanInput) -> Plan:
    """The plan for ``inp``: the sub-planners in order over one plan state, then its summary."""
    st = PlanState.start(inp)
    for step in (housekeeping, protect_windows, fill_existing, pack_new, scale_down, consolidate, choose_hosts):
        step(st)
    return summary(st)


def scale_down(st: PlanState) -> None:
    """Delete idle nodes (active, nothing running, no work planned onto them, idle past the TTL), the
    dearest and longest idle first, at most the disruption budget's share of the nodes that stay."""
    inp, now, policy = st.inp, st.now, st.inp.policy
    idle = [n for n in inp.nodes if n.id not in st.leaving and n.id not in st.used_nodes
            and n.state is NodeState.ACTIVE and n.running == 0 and n.idle_since is not None
            and now - n.idle_since >= policy.idle_ttl_seconds]
    if not idle:
        return
    allowed = disruption_allowed(len([n for n in inp.nodes if n.id not in st.leaving]), policy.disruption_budget_pct)
    idle.sort(key=lambda n: (-st.prices.get(n.pool, n.price), n.idle_since, n.id))
    for n in idle[:allowed]:
        assert n.idle_since is not None  # the filter above
        if not st.tokens(Priority.CONSOLIDATION, 1):
            st.explain.append("scale-down held: token budget")
            break
        st.add(ActionKind.DELETE, Priority.CONSOLIDATION,
               f"idle for {int(now - n.idle_since)}s (idle TTL {policy.idle_ttl_seconds}s)", node=n.id, pool=n.pool)
    if len(idle) > allowed:
        st.explain.append(f"scale-down: {len(idle) - allowed} more idle nodes held by the disruption budget "
                          f"({policy.disruption_budget_pct}%)")


def summary(st: PlanState) -> Plan:
    """The plan: actions sorted by priority class (in decision order within a class, ids renumbered
    in that order), what was left unplaced, per-pool and demand summaries and the plan's inputs."""
    inp = st.inp
    by_sched: dict[str, int] = {}
    for d in inp.demand:
        by_sched[d.scheduler] = by_sched.get(d.scheduler, 0) + d.count
    demand_summary = {
        "pending": sum(d.count for d in inp.demand), "by_scheduler": dict(sorted(by_sched.items())),
        "covered_by_existing_nodes": st.covered,
        "placed_on_new_nodes": sum(a.units for a in st.actions if a.kind is ActionKind.LAUNCH),
        "unplaced": sum(st.unplaced.values()), "excluded": sum(inp.excluded.values()),
        "excluded_reasons": dict(sorted(inp.excluded.items())), "pending_after_plan": sum(st.remaining.values()),
        "classes": [d.to_dict() for d in inp.demand[:50]],  # in the plan's order (demand_order), with up to 20 unit ids each
    }
    inputs = {**st.base_inputs, "plan_input_digest": inp.digest(), "budget": inp.budget.to_dict(),
              "no_notice_pools": sorted(inp.no_notice_pools),
              "currency": inp.rate_card.currency if inp.rate_card else None}  # of every price in the plan
    ordered = sorted(enumerate(st.actions), key=lambda ia: (ia[1].priority, ia[0]))
    actions = tuple(replace(a, id=f"{st.plan_id}-{i:03d}") for i, (_, a) in enumerate(ordered))
    return Plan(id=st.plan_id, region=inp.region, now=inp.now, actions=actions,
                unplaced=dict(sorted(st.unplaced.items())), pools=pool_summaries(st), demand=demand_summary,
                inputs=inputs, explain=tuple(st.explain),
                excluded=tuple({"unit": u, "scheduler": sch, "reason": r} for u, sch, r in inp.exclusions))


def pool_summaries(st: PlanState) -> list[dict[str, Any]]:
    """Per pool: shape, price and score, headroom (``headroom``: new nodes of its shape that fit now, host by
    host; ``capacity``: spot nodes it can hold in all, ours included), our nodes (``nodes``, against its
    ``max_nodes``), risk, whether it plans under the no-notice policy, and the calendar's next drop."""
    inp, now = st.inp, st.now
    nodes = nodes_by_pool(inp)
    out = []
    for name, pool in inp.pools.items():
        hr = inp.headroom.get(name)
        cal = inp.calendars.get(name)
        drop = next_drop(cal, now) if cal else None
        # when the forward calendar next lowers the pool's spot capacity (ours included), from what to what
        nxt = None if drop is None else {"at": drop[0], "capacity": drop[2], "capacity_before": drop[1]}
        price = st.prices.get(name)
        advisories, reclaims = inp.advisories.get(name, 0), inp.recent_reclaims.get(name, 0)
        out.append({
            "name": name, "kind": str(pool.kind), "class": str(pool.pool_class), "az": pool.az,
            "shape": pool.shape.to_dict(), "price": price,
            "score": None if price is None else round(pool_score(pool, price, advisories, reclaims), 6),
            "headroom": hr.free if hr else 0, "capacity": hr.capacity if hr else 0,
            "nodes": nodes.get(name, 0), "max_nodes": pool.max_nodes,
            "advisories": advisories, "recent_reclaims": reclaims,
            "failed_until": inp.pool_failures.get(name), "no_notice": name in inp.no_notice_pools,
            "calendar_next_drop": nxt,
        })
    return out
