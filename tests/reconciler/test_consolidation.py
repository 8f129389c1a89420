"""Consolidation through real passes on the simulated demo region: the rate-card history goes through the
state DB into the plan input; oscillating prices move nothing; a steady drop moves each node once, and the
recorded input of a pass that moved replays to the same plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spotctl.core.plan_input import PlanInput
from spotctl.core.planner import plan as make_plan
from tests.reconciler.conftest import START, advance

GP = ("gp-az1", "gp-az2", "gp-rsv-az2")  # one binding: work moves between them


@pytest.fixture
def region(region):
    return replace(region, policy=replace(region.policy, consolidation_min_saving_pct=20,
                                          consolidation_min_node_age_seconds=600, consolidation_min_run_seconds=300))


def _pin(world, prices_of, hours):
    length = world.knobs.rate_card_seconds
    first = int(START // length)
    for slot in range(first, first + int(hours * 3600 // length) + 2):
        for pool, price in prices_of(slot - first).items():
            world.provider.pin_price(pool, slot, price)


def _moves(results, kind="move"):
    """Consolidation's drains of ``kind`` (move: to a new node of a cheaper pool; retire: onto our free room):
    (plan id, node, from, to)."""
    out = []
    for r in results:
        for a in r.plan.actions if r.plan else ():
            info = a.inputs.get("consolidation")
            if info and str(a.kind) == "drain" and info["kind"] == kind:
                out.append((r.plan.id, a.node, a.pool, info.get("to", info.get("onto"))))
    return out


def _said(results):
    return [line for r in results if r.plan for line in r.plan.explain if line.startswith("consolidation")]


def test_prices_that_oscillate_every_tick_never_move_work(make_rt):
    rt, world = make_rt()
    # gp-az1 and gp-az2 swap places every tick (each 33 % cheaper than the other in turn); the reserved pool dear
    _pin(world, lambda t: {"gp-az1": 0.2 if t % 2 else 0.3, "gp-az2": 0.3 if t % 2 else 0.2, "gp-rsv-az2": 0.6}, 3)
    results = advance(rt, world, 3 * 3600, step=60)
    said = _said(results)
    assert any("held 1 of 2 ticks (on rate card" in line for line in said)  # candidates were there, and waited
    assert _moves(results) == []


def test_a_steady_drop_moves_each_node_once_and_then_nothing(make_rt):
    rt, world = make_rt()
    # an hour with gp-az1 the cheapest, then gp-az2 40 % below it for good
    _pin(world, lambda t: {"gp-az1": 0.2, "gp-az2": 0.3 if t < 12 else 0.12, "gp-rsv-az2": 0.6}, 4)
    results = advance(rt, world, 4 * 3600, step=60)
    moves = _moves(results)
    assert moves, _said(results)[-5:]
    assert all(m[2:] == ("gp-az1", "gp-az2") for m in moves)  # downhill only, never back
    nodes = [m[1] for m in moves]
    assert len(nodes) == len(set(nodes))  # no node moved twice
    drop = START + 12 * world.knobs.rate_card_seconds
    first = next(r for r in results if r.plan and any(a.inputs.get("consolidation", {}).get("kind") == "move"
                                                      for a in r.plan.actions))
    assert first.plan.now >= drop + world.knobs.rate_card_seconds  # not before the second cheap tick
    # no churn: a node a move launched is never moved on (it is on the cheapest pool, and young)
    launched_for_moves = {r.plan.id for r in results if r.plan and any(
        a.inputs.get("consolidation", {}).get("kind") == "move" and str(a.kind) == "launch" for a in r.plan.actions)}
    made = {n.id for n in rt.store.nodes() if n.action_id.split(".")[0].rsplit("-", 1)[0] in launched_for_moves
            and n.pool == "gp-az2"}
    assert made and not made & set(nodes)
    # the recorded input of the first pass that moved replays to the same plan
    seq = rt.store.conn.execute("SELECT seq FROM plans WHERE plan_id = ?", (first.plan.id,)).fetchone()[0]
    again = make_plan(PlanInput.from_dict(rt.store.plan_input(seq)))
    assert again.id == first.plan.id
    assert [a.to_dict() for a in again.actions] == [a.to_dict() for a in first.plan.actions]


def test_a_move_whose_new_node_fails_to_launch_leaves_the_old_node_and_its_work_alone(make_rt):
    from spotctl.ops.reconcile import run_pass

    rt, world = make_rt()
    _pin(world, lambda t: {"gp-az1": 0.2, "gp-az2": 0.3 if t < 12 else 0.12, "gp-rsv-az2": 0.6}, 3)
    for _ in range(3 * 60):
        rt.clock.advance(60)
        world.advance(rt.clock.now())
        dry = run_pass(rt, dry_run=True)
        move = [a for a in dry.plan.actions if a.inputs.get("consolidation", {}).get("kind") == "move"]
        if move:
            break
        run_pass(rt)
    else:
        raise AssertionError("no move planned in 3 hours")
    world.inject_launch_failures("gp-az2", rt.clock.now() + 3600)
    r = run_pass(rt)
    drains = {a.node for a in move if str(a.kind) == "drain"}
    skipped = [o for o in r.outcomes if o.kind == "drain" and o.node in drains]
    assert skipped and all(o.status == "skipped" and "not launched" in o.detail for o in skipped)
    states = {n.id: n.state for n in rt.store.nodes(live_only=True)}
    assert all(states[n] == "active" for n in drains)  # not draining: its work goes on where it is
