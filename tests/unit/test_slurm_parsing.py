"""The Slurm adapter's parsing of slurmrestd objects (v0.0.38 and v0.0.40+ shapes) and its token checks.

Talking to a real slurmrestd is covered by tests/integration/test_slurm.py; these pin the
translation rules on job/node objects of the shapes newer Slurm versions send (not runnable here).
"""

from __future__ import annotations

import base64
import json

import pytest

from spotctl.adapters.slurm import SlurmScheduler, array_tasks, expand_hostlist, partition_max_nodes
from spotctl.adapters.slurm.parsing import _error_numbers, _flags, _gpus, _mem_mb, _num
from spotctl.adapters.slurm.rest import _Token
from spotctl.core.errors import AuthError, ConfigError, NotFoundError, TemporaryError, UnavailableError
from spotctl.core.models import PoolClass, PoolKind, PoolSpec, Shape, SlurmBinding
from spotctl.core.ports import FixedClock
from spotctl.core.secrets import SecretFile

POOLS = {
    "vm": PoolSpec(name="vm", kind=PoolKind.VM, pool_class=PoolClass.HEADROOM, az="az1", shape=Shape(8, 32000),
                   slurm=SlurmBinding(partition="spot", features=("spot",))),
    "gpu": PoolSpec(name="gpu", kind=PoolKind.BAREMETAL, pool_class=PoolClass.HEADROOM, az="az1",
                    shape=Shape(32, 256000, 4), slurm=SlurmBinding(partition="spot", features=("spot", "a100"))),
}


def jwt(claims: dict) -> str:
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
    return f"{enc({'alg': 'HS256', 'typ': 'JWT'})}.{enc(claims)}.c2lnbmF0dXJl"


def sched(token: str = "", **kw) -> SlurmScheduler:
    return SlurmScheduler("http://127.0.0.1:1", "alice", _Token(source="test", value=token or jwt({"sun": "alice"})),
                          scontrol=None, clock=FixedClock(1_000_000.0), **kw)


def units(job: dict, partitions=None, short=frozenset({"spot"})):
    return sched()._job_units(job, POOLS, partitions or {}, set(short))


def test_hostlists_and_arrays():
    assert expand_hostlist("spot-a-n[1-3,7],b[01-02],c") == ["spot-a-n1", "spot-a-n2", "spot-a-n3", "spot-a-n7",
                                                             "b01", "b02", "c"]
    assert expand_hostlist("") == []
    assert array_tasks("3-5%2") == ["3", "4", "5"]
    assert array_tasks("1,4,10-14:2") == ["1", "4", "10", "12", "14"]


def test_numbers_and_states_of_both_api_generations():
    assert _num(30) == 30
    assert _num({"set": True, "infinite": False, "number": 30}) == 30
    assert _num({"set": False, "infinite": False, "number": 0}, 7) == 7
    assert _num({"set": True, "infinite": True, "number": 0}) is None
    with pytest.raises(ValueError):
        _num("thirty")
    assert _flags("idle") == {"IDLE"}
    assert _flags(["IDLE", "DRAIN"]) == {"IDLE", "DRAIN"}
    assert _flags("IDLE+DRAIN") == {"IDLE", "DRAIN"}
    assert _gpus("gres/gpu:a100:2") == 2 and _gpus("gres:gpu:1") == 1 and _gpus("", "gpu=3") == 3 and _gpus("") == 0
    assert _mem_mb("cpu=4,mem=2G,node=1") == 2048 and _mem_mb("cpu=4,mem=1000M") == 1000 and _mem_mb("cpu=1") is None


V38_RESOURCES = {"job_id": 11, "job_state": "PENDING", "state_reason": "Resources", "partition": "spot",
                 "node_count": 1, "cpus": 4, "memory_per_node": 1000, "memory_per_cpu": None, "time_limit": 30,
                 "priority": 100, "submit_time": 1700, "features": "", "required_nodes": "", "tres_per_node": "",
                 "array_task_string": ""}

V40_GPU_MULTI = {"job_id": 12, "job_state": ["PENDING"], "state_reason": "Resources", "partition": "spot",
                 "node_count": {"set": True, "infinite": False, "number": 2},
                 "cpus": {"set": True, "infinite": False, "number": 16},
                 "memory_per_node": {"set": False, "infinite": False, "number": 0},
                 "memory_per_cpu": {"set": True, "infinite": False, "number": 2000},
                 "time_limit": {"set": True, "infinite": False, "number": 120},
                 "priority": {"set": True, "infinite": False, "number": 5},
                 "submit_time": {"set": True, "infinite": False, "number": 1800},
                 "features": "spot&a100", "required_nodes": "", "tres_per_node": "gres/gpu:a100:2"}


def test_a_v38_job_is_one_unit_with_its_shape_and_duration():
    us, ex = units(V38_RESOURCES)
    assert ex is None
    (u,) = us
    assert u.id == "slurm/11" and u.shape == Shape(4, 1000, 0) and u.expected_seconds == 1800
    assert u.priority == 100 and u.submitted_at == 1700 and u.partition == "spot"


def test_a_v40_multi_node_gpu_job_is_one_unit_per_node():
    us, ex = units(V40_GPU_MULTI)
    assert ex is None
    assert [u.id for u in us] == ["slurm/12/1", "slurm/12/2"]
    assert us[0].shape == Shape(8, 16000, 2) and us[0].expected_seconds == 7200
    assert us[0].features == ("a100", "spot")
    assert POOLS["gpu"].serves(us[0]) and not POOLS["vm"].serves(us[0])


def test_array_jobs_are_one_unit_per_task():
    us, _ = units({**V38_RESOURCES, "array_task_string": "0-2%1"})
    assert [u.id for u in us] == ["slurm/11_0", "slurm/11_1", "slurm/11_2"]


@pytest.mark.parametrize("change, reason", [
    ({"state_reason": "JobHeldUser"}, "held by its user (JobHeldUser)"),
    ({"state_reason": "JobHeldAdmin"}, "held by an administrator (JobHeldAdmin)"),
    ({"state_reason": "Dependency"}, "waits for a dependency"),
    ({"state_reason": "BeginTime"}, "begin time is in the future"),
    ({"state_reason": "None"}, "not yet evaluated by the Slurm scheduler"),
    ({"state_reason": "QOSMaxCpuPerUserLimit"}, "pending for QOSMaxCpuPerUserLimit: more nodes would not start it"),
    ({"state_reason": "ReqNodeNotAvail", "required_nodes": "n1"}, "pinned to specific nodes that are unavailable"),
    ({"required_nodes": "n1"}, "pinned to specific nodes (--nodelist)"),
    ({"partition": "ondemand"}, "partition ondemand is not served by any spot pool"),
    ({"features": "bigmem"}, "no spot pool has the requested features"),
    ({"features": "a100|h100"}, "feature expression with OR/counts is not mapped to pools"),
])
def test_jobs_more_nodes_would_not_start_are_excluded_with_a_reason(change, reason):
    us, ex = units({**V38_RESOURCES, **change})
    assert us == [] and ex is not None
    assert ex.unit_id == "slurm/11" and ex.reason == reason


def test_priority_counts_only_behind_jobs_short_of_nodes():
    job = {**V38_RESOURCES, "state_reason": "Priority"}
    assert units(job, short={"spot"})[1] is None
    assert units(job, short=set())[1].reason == "waits for priority behind jobs that are not short of nodes"


def test_partition_node_limit_is_demand_unless_over_the_partitions_max_nodes():
    job = {**V38_RESOURCES, "state_reason": "PartitionNodeLimit", "node_count": 3, "cpus": 3}
    assert units(job, {"spot": {"maximum_nodes_per_job": -1}})[1] is None  # partition too small: nodes help
    ex = units(job, {"spot": {"maximum_nodes_per_job": 2}})[1]
    assert ex.reason == "asks more nodes than its partition allows per job (MaxNodes)"


# v0.0.42 objects as Slurm 24.11's slurmrestd sent them (scripts/testenv/slurm24), trimmed
V42 = lambda n: {"set": True, "infinite": False, "number": n}  # noqa: E731
V42_UNSET = {"set": False, "infinite": False, "number": 0}
V42_PARTITION_SPOT = {"name": "spot", "maximums": {"cpus_per_node": {"set": False, "infinite": True, "number": 0},
                                                   "nodes": V42(2), "shares": 1}, "minimums": {"nodes": 0}}
V42_PARTITION_ONDEMAND = {"name": "ondemand", "maximums": {"nodes": {"set": False, "infinite": True, "number": 0}}}
V42_PENDING = {"job_id": 36, "job_state": ["PENDING"], "state_reason": "PartitionNodeLimit", "partition": "spot",
               "node_count": V42(3), "cpus": V42(3), "minimum_cpus_per_node": V42(1), "memory_per_node": V42_UNSET,
               "memory_per_cpu": V42(500), "tres_req_str": "cpu=3,mem=1500M,node=3,billing=3", "tres_per_node": "",
               "gres_detail": [], "tres_per_job": "", "time_limit": V42(5), "priority": V42(1),
               "submit_time": V42(1796123634), "array_task_string": "", "required_nodes": "", "features": ""}


def test_partition_max_nodes_of_both_api_generations():
    assert partition_max_nodes({"maximum_nodes_per_job": 2}) == 2  # v0.0.38
    assert partition_max_nodes(V42_PARTITION_SPOT) == 2  # v0.0.40+: maximums.nodes
    assert partition_max_nodes(V42_PARTITION_ONDEMAND) is None  # infinite
    assert partition_max_nodes({}) is None


def test_a_v42_job_over_its_partitions_max_nodes_is_excluded_and_within_it_is_demand():
    ex = units(V42_PENDING, {"spot": V42_PARTITION_SPOT})[1]
    assert ex.reason == "asks more nodes than its partition allows per job (MaxNodes)"
    us, ex = units({**V42_PENDING, "node_count": V42(2), "cpus": V42(2)}, {"spot": V42_PARTITION_SPOT})
    assert ex is None and len(us) == 2
    # memory_per_node unset: memory_per_cpu (DefMemPerCPU) x CPUs per node
    assert (us[0].shape.vcpu, us[0].shape.ram_mb, us[0].expected_seconds) == (1, 500, 300)
    assert us[0].submitted_at == 1796123634.0


def test_rest_errors_are_translated_by_status_and_slurm_error_number():
    s = sched()
    # v0.0.42 node update of an unknown node: HTTP 500 with error 2018
    body = {"errors": [{"description": "Failure to update node spot-nope", "error_number": 2018,
                        "error": "Invalid node name specified", "source": "_update_node"}], "warnings": []}
    assert _error_numbers(body) == {2018}
    e = s._http_error(500, body, json.dumps(body), "update node spot-nope to DRAIN")
    assert isinstance(e, NotFoundError) and "Invalid node name specified" in e.message
    # 24.11: a token slurmctld rejects is HTTP 511 with an empty error list; the raw answer is not shown
    e = s._http_error(511, {"errors": [], "warnings": [], "meta": {"client": {"user": "alice"}}}, "{...}", "GET x")
    assert isinstance(e, AuthError) and "HTTP 511" in e.message and "meta" not in e.message
    e = s._http_error(401, None, "Authentication failure", "GET x")
    assert isinstance(e, AuthError) and "Authentication failure" in e.message
    e = s._http_error(500, {"errors": [{"error": "Unspecified error", "error_number": 1}]}, "", "GET x")
    assert isinstance(e, TemporaryError) and "Unspecified error" in e.message
    e = s._http_error(405, None, "Requested REST method is not defined at URL", "POST node/x")
    assert type(e) is UnavailableError and "not defined" in e.message
    assert isinstance(s._http_error(404, None, "", "GET job/1"), NotFoundError)


def test_multi_partition_job_maps_to_the_served_partition():
    (u,), _ = units({**V38_RESOURCES, "partition": "ondemand,spot"})
    assert u.partition == "spot"


def test_malformed_job_raises_for_pending_to_count():
    with pytest.raises((KeyError, TypeError, ValueError)):
        units({"job_state": "PENDING"})
    with pytest.raises((KeyError, TypeError, ValueError)):
        units({**V38_RESOURCES, "cpus": "four"})


def test_node_names_map_both_ways_and_only_spot_nodes_are_ours():
    s = sched(node_name="{node}.hpc")
    assert s.slurm_name("spot-vm-1a2b") == "spot-vm-1a2b.hpc"
    assert s.node_id("spot-vm-1a2b.hpc") == "spot-vm-1a2b"
    assert s.node_id("login1.hpc") is None and s.node_id("spot-vm-1a2b") is None
    with pytest.raises(ConfigError):
        sched(node_name="spot")


def test_token_checks_happen_before_any_request():
    with pytest.raises(AuthError, match="not a JWT"):
        sched(token="garbage")._check_token()
    with pytest.raises(AuthError, match="expired at"):
        sched(token=jwt({"sun": "alice", "exp": 999_000}))._check_token()
    with pytest.raises(AuthError, match="belongs to user 'bob'"):
        sched(token=jwt({"sun": "bob", "exp": 2_000_000}))._check_token()
    ok = jwt({"sun": "alice", "exp": 2_000_000})
    assert sched(token=ok)._check_token() == ok


def test_token_file_is_reread_when_it_changes(tmp_path):
    f = tmp_path / "t.jwt"
    f.write_text(jwt({"sun": "alice", "exp": 2_000_000}) + "\n")
    tok = _Token(source="file", file=SecretFile(f, setting="slurm.token_file"))
    first = tok.get()
    f.write_text(jwt({"sun": "alice", "exp": 2_000_001}))
    import os

    os.utime(f, (1, 1))
    assert tok.get() != first
    f.write_text("")
    os.utime(f, (2, 2))
    with pytest.raises(ConfigError, match="empty"):
        tok.get()


def test_no_way_to_update_nodes_is_a_clear_error():
    s = sched()
    s.api_version = "v0.0.38"
    with pytest.raises(ConfigError, match="cannot update nodes.*v0.0.38.*scontrol"):
        s.drain_method()
    s.api_version = "v0.0.40"
    assert s.drain_method() == "rest"
