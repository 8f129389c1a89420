"""The calendar holds at run time (issue 10, item 4), on the demo region: every node whose host a lease takes
is protected in its schedulers, and no Slurm job whose time limit crosses the node's safe-until time starts
there afterwards (the simulated Slurm honours the window as real Slurm honours a maintenance reservation)."""

from __future__ import annotations

from spotctl.core.notices import node_protection
from spotctl.ops.observe import host_reclaims, observe

from .conftest import advance


def test_nodes_on_reserved_hosts_are_protected_and_long_jobs_stay_off_them(make_rt):
    from spotctl.sim.cloud import Lease

    rt, world = make_rt()
    advance(rt, world, 1800, step=60)
    # an owner books two hosts our nodes run on, three hours out (the scenario: a reservation ahead of
    # the work placed there). Without the provider's advisory, so that the nodes take work until the calendar
    # advisory cordons them (an hour before): meanwhile only work that ends in time may start there.
    ours = sorted({n.host: n for n in rt.store.nodes(live_only=True) if n.host and n.state.value == "active"}.values(),
                  key=lambda n: n.id)[:2]
    assert ours, "no active node to book the host of"
    now = rt.now()
    for i, n in enumerate(ours):
        pool = rt.region.pools[n.pool]
        lease = Lease(f"lease-test-{i}", n.pool, (n.host,), now + 3 * 3600, now + 5 * 3600, now, pool.cleaning_seconds)
        world.fleet.add_lease(lease)
    checked = protected_runs = 0
    for _ in range(4):  # two simulated hours, checked every half hour
        advance(rt, world, 1800, step=60)
        reclaims = host_reclaims(rt, observe(rt))
        for node in rt.store.nodes(live_only=True):
            if node.state.value not in ("building", "active") or node.cordoned or not node.host:
                continue
            want, _ = node_protection(reclaims.get(node.host), rt.now(), rt.region.policy, 0)
            if want is None:
                assert node.protected_until is None, node
                continue
            checked += 1
            assert node.protected_until is not None and abs(node.protected_until - want) < 1, (node, want)
            sim = world.cluster.nodes.get(node.id)
            if sim is None:
                continue
            slurm = 1
            assert sim.until[slurm] == node.protected_until
            for run in sim.runs:
                if run.s == slurm and run.started_at >= rt.now() - 1800 and run.started_at > node.updated_at:
                    protected_runs += 1
                    assert run.started_at + run.unit.expected_seconds <= sim.until[slurm], (node.id, run.unit)
    assert checked > 0, "no node sat on a host a lease takes: the scenario did not happen"
    protects = [r for r in rt.store.audit_records() if r["action"] == "node.protect"]
    assert protects and any(r["result"] == "ok" for r in protects)
    for r in protects:
        if r["result"] == "ok":
            continue
        # told before any scheduler knew the node (still building): pending, never ok, and told again once
        # it is active (unless it left first)
        active_at = [x["at"] for x in rt.store.transitions(r["target"]) if x["to_state"] == "active"]
        assert r["result"] == "pending" and (not active_at or r["at"] < active_at[0]), r
        later = [x for x in protects if x["target"] == r["target"] and x["at"] > r["at"]]
        gone = [x["at"] for x in rt.store.transitions(r["target"]) if x["to_state"] in ("deleting", "draining")]
        assert any(x["result"] == "ok" for x in later) or gone, (r, later)


def test_a_building_node_under_a_calendar_advisory_is_cordoned_once(make_rt):
    """Issue 11, item 9: an action that changes nothing is not taken (nor audited) again. A node still
    building when a reservation's advisory comes due is cordoned once, advised once it is active, and the
    advisory's later passes do not cordon it again."""
    from spotctl.sim.cloud import Lease

    rt, world = make_rt()
    advance(rt, world, 60, step=30)
    building = [n for n in rt.store.nodes(live_only=True) if n.state.value == "building" and n.host]
    assert building, "the first passes launched nothing still building"
    n = building[0]
    now = rt.now()
    world.fleet.add_lease(Lease("lease-adv", n.pool, (n.host,), now + 2400, now + 9600, now,
                                rt.region.pools[n.pool].cleaning_seconds))
    advance(rt, world, 600, step=30)  # 20 passes: it boots meanwhile
    cordons = [r for r in rt.store.audit_records() if r["action"] == "node.cordon" and r["target"] == n.id]
    assert len(cordons) == 1, [(r["result"], r["at"] - now) for r in cordons]
    node = rt.store.node(n.id)
    assert node.cordoned and node.state.value in ("advised", "draining", "deleting", "gone"), node
