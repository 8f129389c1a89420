"""When the work on a node started, as each scheduler reports it (consolidation's minimum run time): a time
that is not one is not known, never "long ago"."""

from __future__ import annotations

from dataclasses import replace

from spotctl.adapters.kubernetes.pods import digest
from spotctl.adapters.kubernetes.settings import Settings
from spotctl.adapters.slurm.scheduler import _job_start
from spotctl.core.config import Policy
from spotctl.core.models import NodeState, NodeUsage, Scheduler, Shape
from tests.factories import NOW, hosts, node, plan_input, pool


def test_a_slurm_job_start_is_a_positive_finite_time_in_either_shape():
    assert _job_start({"start_time": 1_700_000_000}) == 1_700_000_000.0
    assert _job_start({"start_time": {"set": True, "infinite": False, "number": 1_700_000_000}}) == 1_700_000_000.0
    for bad in ({}, {"start_time": 0}, {"start_time": "soon"}, {"start_time": {"set": False, "number": 5}},
                {"start_time": float("nan")}, {"start_time": True}):
        assert _job_start(bad) is None, bad


def test_a_pod_start_is_its_status_start_time_or_not_known():
    pod = {"metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-12-01T10:00:00Z"},
           "spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Running"}}
    assert digest(pod, Settings()).started is None
    pod["status"]["startTime"] = "2026-12-01T10:00:05Z"
    assert digest(pod, Settings()).started == digest(pod, Settings()).created + 5
    for bad in ("yesterday", 12, None):
        pod["status"]["startTime"] = bad
        assert digest(pod, Settings()).started is None, bad


def test_a_node_whose_work_one_scheduler_does_not_date_has_an_unknown_run_time():
    both = [NodeUsage("n1", Scheduler.SLURM, Shape(2, 1024), 1, work_started_at=NOW - 900),
            NodeUsage("n1", Scheduler.KUBERNETES, Shape(1, 512), 1, work_started_at=None)]
    on = Policy(spend_cap_per_hour=None, consolidation_min_saving_pct=20)
    i = plan_input([pool()], hosts("p1", 1), [], nodes=[node(1)], usage=both, policy=on)
    assert i.nodes[0].work_started_at is None and i.nodes[0].launched_at == NOW - 7200
    dated = [both[0], replace(both[1], work_started_at=NOW - 60)]
    i = plan_input([pool()], hosts("p1", 1), [], nodes=[node(1)], usage=dated, policy=on)
    assert i.nodes[0].work_started_at == NOW - 60  # the youngest
    # consolidation off: neither is in the input (nothing it did not decide on)
    i = plan_input([pool()], hosts("p1", 1), [], nodes=[node(1)], usage=dated)
    assert i.nodes[0].work_started_at is None and i.nodes[0].launched_at is None
    assert i.nodes[0].state is NodeState.ACTIVE
