"""Kubernetes and Slurm over one cluster model: pending work, placement, cordon/drain."""

from __future__ import annotations

import pytest

from spotctl.core.errors import NotFoundError
from spotctl.core.models import Scheduler
from spotctl.sim import SimWorld

from .conftest import START

K8S, SLURM = 0, 1


def test_pending_pods_and_jobs_with_exclusions(region):
    w = SimWorld.new(region, START)
    reasons = {K8S: set(), SLURM: set()}
    for _ in range(8):  # no nodes: work piles up
        w.advance(w.now + 3600)
        for s in (K8S, SLURM):
            reasons[s] |= {e.reason for e in w.schedulers[s].pending(region.pools)[1]}
    pods, pod_excl = w.schedulers[K8S].pending(region.pools)
    jobs, job_excl = w.schedulers[SLURM].pending(region.pools)
    assert pods and jobs
    assert all(u.scheduler is Scheduler.KUBERNETES and u.id.startswith("pod/") for u in pods)
    assert all(u.scheduler is Scheduler.SLURM and u.id.startswith("slurm/") for u in jobs)
    ids = [u.id for u in pods + jobs]
    assert len(ids) == len(set(ids))
    for u in pods:
        assert "spot" in u.tolerations
        assert u.expected_seconds == region.policy.default_pod_seconds
        assert any(p.serves(u) for p in region.pools.values())
    assert any(u.node_selector == (("spot.pool", "gp"),) and u.tolerations == ("spot",) for u in pods)
    assert any(u.shape.gpus and set(u.tolerations) == {"spot", "nvidia.com/gpu"} for u in pods + jobs)
    for u in jobs:
        assert u.partition in {"spot", "spot-bm", "spot-gpu"}
        assert 1200 <= u.expected_seconds <= 8 * 3600
        assert 4 <= u.shape.vcpu <= 64
    # sorted as the schedulers place them: priority, then submit time
    for lst in (pods, jobs):
        keys = [(-u.priority, u.submitted_at) for u in lst]
        assert keys == sorted(keys)
    assert reasons[K8S] == {"does not tolerate the spot taint"}
    assert reasons[SLURM] == {"held (JobHeldUser)", "waiting on dependency", "begin time in the future"}
    assert all(e.scheduler is Scheduler.SLURM for e in job_excl)
    assert {e.unit_id for e in pod_excl}.isdisjoint(u.id for u in pods)
    # a unit that no given pool serves is an exclusion, not demand
    only_gp = {"gp-az1": region.pools["gp-az1"]}
    sub, excl = w.schedulers[SLURM].pending(only_gp)
    assert all(region.pools["gp-az1"].serves(u) for u in sub)
    assert any(e.reason.startswith("partition spot-") for e in excl)


def test_arrival_rate_on_the_demo_region(region):
    w = SimWorld.new(region, START)
    before = w.report()["demand"]["arrived"]
    w.advance(START + 24 * 3600)
    per_hour = (w.report()["demand"]["arrived"] - before) / 24
    assert 20 <= per_hour <= 60


def _active_node(w, region, pool="gp-az1", name="n1"):
    inst = w.cloud.create_instance(region.pools[pool], name, name)
    w.advance(w.now + region.pools[pool].boot_seconds + 60)
    return inst


def test_work_is_placed_on_active_nodes_and_completes(world, region):
    _active_node(world, region)
    usage = {s.name: [u for u in s.usage() if u.node == "n1"][0] for s in world.schedulers}
    total = sum(u.running for u in usage.values())
    assert total > 0
    used = sum(u.used.vcpu for u in usage.values())
    assert used <= region.pools["gp-az1"].shape.vcpu
    world.advance(world.now + 3 * 3600)
    rep = world.report()
    assert rep["demand"]["completed"] > 0 and rep["demand"]["started"] >= rep["demand"]["completed"]


def test_drain_requeues_running_work(world, region):
    _active_node(world, region)
    k8s, slurm = world.schedulers
    running = {s.name: [u for u in s.usage() if u.node == "n1"][0].running for s in world.schedulers}
    assert sum(running.values()) > 0
    pending_before = {u.id for s in world.schedulers for u in s.pending(region.pools)[0]}
    for s in world.schedulers:
        s.drain("n1", "test", world.now + 300)
    for s in world.schedulers:
        [u] = [u for u in s.usage() if u.node == "n1"]
        assert u.running == 0 and u.cordoned
    pending_after = {u.id: u for s in world.schedulers for u in s.pending(region.pools)[0]}
    back = set(pending_after) - pending_before
    assert len(back) == sum(running.values())
    assert all(pending_after[i].submitted_at < world.now for i in back)  # original submit time kept
    rep = world.report()
    assert rep["interruptions"]["requeued_units"] == len(back) and rep["interruptions"]["lost_units"] == 0
    world.advance(world.now + 600)
    assert all(u.running == 0 for s in world.schedulers for u in s.usage() if u.node == "n1")
    for s in world.schedulers:
        s.resume("n1")
    world.advance(world.now + 120)
    assert sum(u.running for s in world.schedulers for u in s.usage() if u.node == "n1") > 0


def test_cordon_in_one_scheduler_only_stops_that_schedulers_work(world, region):
    _active_node(world, region)
    k8s, slurm = world.schedulers
    k8s.drain("n1", "test", None)
    world.advance(world.now + 3600)
    [ku] = [u for u in k8s.usage() if u.node == "n1"]
    [su] = [u for u in slurm.usage() if u.node == "n1"]
    assert ku.running == 0 and ku.cordoned
    assert su.running > 0 and not su.cordoned
    slurm.cordon("n1", "test")
    assert [u for u in slurm.usage() if u.node == "n1"][0].cordoned


def test_forget_and_unknown_nodes(world, region):
    inst = _active_node(world, region)
    k8s, slurm = world.schedulers
    for s in world.schedulers:
        with pytest.raises(NotFoundError):
            s.cordon("nope", "x")
        with pytest.raises(NotFoundError):
            s.drain("nope", "x", None)
        with pytest.raises(NotFoundError):
            s.resume("nope")
        s.forget("nope", "x")  # forgetting a node never known is no error, as with the real adapters
    world.cloud.delete_instance(inst.id)
    assert world.report()["interruptions"]["lost_units"] > 0  # a deleted node's work is lost
    k8s.forget("n1", "gone")
    assert all(u.node != "n1" for u in k8s.usage())
    assert any(u.node == "n1" for u in slurm.usage())  # slurm still lists it until forgotten there
    k8s.forget("n1", "gone")  # forgetting twice is fine
    with pytest.raises(NotFoundError):
        k8s.cordon("n1", "x")
    slurm.forget("n1", "gone")
    assert all(u.node != "n1" for s in world.schedulers for u in s.usage())


def test_node_name_reuse_registers_the_new_instance(world, region):
    inst = _active_node(world, region)
    world.cloud.delete_instance(inst.id)
    inst2 = _active_node(world, region)
    assert inst2.id != inst.id
    assert sum(u.running for s in world.schedulers for u in s.usage() if u.node == "n1") > 0


def test_usage_follows_every_run_that_starts_or_ends_though_each_node_is_summed_once():
    """``usage()`` sums a node's runs again only when one came or went (``Node.sums``): what it reports after
    work starts, completes, is drained and is requeued is what summing every run afresh gives."""
    from spotctl.core.models import Shape
    from spotctl.sim.generate import generated_region

    region, w = generated_region(200, 2000)
    cl = w.cluster

    def afresh(s: int) -> dict[str, tuple]:
        out = {}
        for node in cl.node_list():
            if node.reg >> s & 1:
                runs = [r for r in node.runs if r.s == s]
                used = Shape(sum(r.unit.shape.vcpu for r in runs), sum(r.unit.shape.ram_mb for r in runs),
                             sum(r.unit.shape.gpus for r in runs))
                out[node.name] = (used, len(runs), max((r.started_at for r in runs), default=None))
        return out

    seen = 0
    for step in range(8):
        w.advance(w.now + 600)
        if step == 3:  # a drain in both schedulers: its runs leave at once
            busy = next(n.name for n in cl.node_list() if n.runs)
            for sched in w.schedulers:
                sched.drain(busy, "test", w.now + 300)
        for s, sched in enumerate(w.schedulers):
            got = {u.node: (u.used, u.running, u.work_started_at) for u in sched.usage()}
            assert got == afresh(s)
            seen += sum(1 for used, n, _ in got.values() if n)
    assert seen  # work ran: the sums were tested on busy nodes, not only on empty ones
