"""SchedulerPort conformance: the same checks on the simulator's schedulers and the real adapters
(the Kubernetes API test server, Slurm 22.05 and Slurm 24.11).

What the reconciler relies on, whoever implements the port: an unknown node is NotFoundError for
cordon, drain and resume (so a misnamed node is a finding, never a silent "ok") and forgetting it
is not an error; a drain round returns a DrainProgress named for its scheduler, without waiting; a
drained node shows as cordoned in ``usage()`` and ``resume`` takes that back.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Callable

import pytest

from spotctl.core.errors import NotFoundError
from spotctl.core.models import DrainProgress
from spotctl.core.ports import SchedulerPort

from ..integration import conftest as harness

START = 1_767_261_600.0


@dataclass
class Side:
    port: SchedulerPort
    node: str  # a node this scheduler knows, with no work on it
    cleanup: Callable[[], None] = lambda: None


def _sim(kind: str) -> Side:
    from spotctl.sim import SimWorld, demo_region

    region = demo_region()
    world = SimWorld.new(region, START, 5)
    inst = world.cloud.create_instance(region.pools["gp-az1"], "spot-conf-idle", "conf-idle")
    world.advance(START + 600)  # booted and registered in both schedulers
    assert inst.id
    port = next(s for s in world.schedulers if s.name == kind)
    return Side(port, "spot-conf-idle")


def _kubernetes() -> Side:
    import requests

    from spotctl.core.config import load_config
    from spotctl.wiring import _adapter

    env = harness.testenv("k8s")
    region = load_config(env={"SPOTCTL_CONFIG": env["SPOTCTL_K8S_CONFIG"]}).region("lab")
    name = "spot-conf-" + uuid.uuid4().hex[:6]
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {env['K8S_TOKEN']}"
    http.post(f"{env['K8S_URL']}/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                                       "spec": {}}, timeout=10).raise_for_status()
    return Side(_adapter(region, "kubernetes"), name,
                lambda: http.delete(f"{env['K8S_URL']}/api/v1/nodes/{name}", timeout=10))


def _slurm(service: str) -> Side:
    from spotctl.adapters.slurm import SlurmScheduler
    from spotctl.core.config import load_config

    env = harness.testenv(service)
    cfg = env["SPOTCTL_CONFIG"] if service == "slurm" else env["SLURM24_SPOTCTL_CONFIG"]
    region = load_config(env={"SPOTCTL_CONFIG": cfg}).region("lab")
    port = SlurmScheduler.from_config(region)
    node = "spot-lab-n2" if service == "slurm" else "spot-lab24-n2"
    return Side(port, node, lambda: port.resume(node))


SIDES = {"sim-kubernetes": lambda: _sim("kubernetes"), "sim-slurm": lambda: _sim("slurm"),
         "kubernetes": _kubernetes, "slurm-22.05": lambda: _slurm("slurm"), "slurm-24.11": lambda: _slurm("slurm24")}


@pytest.fixture(params=sorted(SIDES))
def side(request):
    s = SIDES[request.param]()
    yield s
    s.cleanup()


def test_it_is_a_scheduler_port(side):
    assert isinstance(side.port, SchedulerPort)


def test_an_unknown_node_is_not_found_and_forgetting_it_is_no_error(side):
    ghost = "spot-no-such-node-" + uuid.uuid4().hex[:6]
    for call in (lambda: side.port.cordon(ghost, "conformance"), lambda: side.port.resume(ghost),
                 lambda: side.port.drain(ghost, "conformance", None),
                 lambda: side.port.protect(ghost, time.time() + 3600)):
        with pytest.raises(NotFoundError):
            call()
    side.port.forget(ghost, "conformance")


def test_a_drain_round_returns_its_progress_at_once_and_resume_takes_it_back(side):
    t0 = time.monotonic()
    p = side.port.drain(side.node, "conformance drain", None)
    assert isinstance(p, DrainProgress) and p.scheduler == side.port.name
    assert p.empty and p.remaining == 0 and p.forced == ()  # nothing runs there
    assert time.monotonic() - t0 < 10  # one round, no waiting loop (a generous bound for slow CI)
    use = {u.node: u for u in side.port.usage()}
    assert use[side.node].cordoned is True
    side.port.resume(side.node)
    assert {u.node: u for u in side.port.usage()}[side.node].cordoned is False


def test_protect_is_idempotent_moves_and_lifts_without_cordoning(side):
    """The run-time window (SchedulerPort.protect) can be set, set again, moved, closed and lifted, each
    idempotent, and it is not a cordon: the node still takes work that fits its window."""
    until = time.time() + 7200
    for u, closed in ((until, False), (until, False), (until - 600, True), (until - 600, True), (None, False),
                      (None, False)):
        side.port.protect(side.node, u, closed)
        assert {x.node: x for x in side.port.usage()}[side.node].cordoned is False
