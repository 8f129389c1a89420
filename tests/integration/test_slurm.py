"""The Slurm adapter against real Slurms (slurmctld, slurmd ×4, slurmrestd with JWT), two versions:

* ``slurm``: Slurm 22.05 from scripts/testenv/slurm (REST v0.0.38: cannot update nodes, so drain and
  resume go through ``scontrol``); nodes spot-lab-n1/n2 (ours), od-n1/n2;
* ``slurm24``: Slurm 24.11 from scripts/testenv/slurm24, in a Debian 13 root (REST v0.0.40-v0.0.42:
  drain and resume go over REST); nodes spot-lab24-n1/n2 (ours), od24-n1/n2. Its client commands run
  inside that root ($SLURM24_BIN wrappers), the adapter's ``scontrol`` (job requeue) too.

Every adapter check runs on both (the ``env`` fixture is parametrized); the dynamic-node test is about
the 22.05 cluster's layout (its `dyn-add` helper) and runs there only. Jobs are submitted with sbatch as
a user would; spotctl runs as a subprocess on a `lab` region (simulated cloud, real Slurm).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotctl.core.config import load_config
from spotctl.core.errors import ConfigError, NotFoundError

from . import conftest as harness

pytestmark = pytest.mark.integration

SPOTCTL = str(Path(sys.executable).with_name("spotctl"))
TESTENV = harness.ROOT / "scripts" / "testenv"
SCRIPT = str(TESTENV / "slurm")
REASON = "spotctl: hard notice n-42 for instance i-1 (test)"

# per test service: the nodes of its cluster (the first two are ours) and how it updates nodes
CLUSTERS = {
    "slurm": {"nodes": ("spot-lab-n1", "spot-lab-n2", "od-n1", "od-n2"), "drain_method": "scontrol"},
    "slurm24": {"nodes": ("spot-lab24-n1", "spot-lab24-n2", "od24-n1", "od24-n2"), "drain_method": "rest"},
}


@pytest.fixture(scope="module", params=sorted(CLUSTERS))
def env(request):
    """The exports of one Slurm test service, under the names of scripts/testenv/slurm's (SLURM_*)."""
    name = request.param
    e = harness.testenv(name)
    if name == "slurm24":
        e = {k[len("SLURM24_"):] if k.startswith("SLURM24_") else k: v for k, v in e.items()}
        e = {("SLURM_" + k if not k.startswith("SLURM") and k != "SPOTCTL_CONFIG" else k): v for k, v in e.items()}
        e["SCONTROL"] = os.path.join(e["SLURM_BIN"], "scontrol")
    if not e.get("SLURM_REST_URL") or not e.get("SPOTCTL_CONFIG"):
        pytest.fail(f"scripts/testenv/{name} env printed no REST URL or spotctl config: {sorted(e)}")
    e.update(CLUSTERS[name], service=name, script=str(TESTENV / name))
    return e


def slurm_cli(env, *args, check=True, timeout=30) -> str:
    """Run a Slurm client command as a user would (munge auth: SLURM_JWT must not be set)."""
    e = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    e["SLURM_CONF"] = env["SLURM_CONF"]
    if env.get("SLURM_BIN"):  # 24.11: its own clients, inside its root
        args = (os.path.join(env["SLURM_BIN"], args[0]), *args[1:])
    p = subprocess.run(list(args), capture_output=True, text=True, env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p.stdout


def sbatch(env, *opts) -> int:
    out = slurm_cli(env, "sbatch", "--parsable", "-o", "/dev/null", *opts, "--wrap", "sleep 600")
    return int(out.strip().split(";")[0])


def jobs(env) -> dict[int, dict]:
    out = slurm_cli(env, "squeue", "-h", "-o", "%i|%T|%r|%N")
    res = {}
    for line in out.splitlines():
        jid, state, reason, nodes = line.split("|")
        res[int(jid)] = {"state": state, "reason": reason, "nodes": nodes}
    return res


def node_info(env, name) -> dict:
    out = slurm_cli(env, "scontrol", "show", "node", name, "-o", check=False)
    if "not found" in out or not out.strip():
        return {}
    d = dict(re.findall(r"(\w+)=((?:(?! \w+=).)*)", out))
    return d


def wait(pred, timeout=20.0, what="condition"):
    return harness.wait_until(pred, what, timeout)


def reservations(env) -> dict[str, dict]:
    out = slurm_cli(env, "scontrol", "show", "reservation", "-o", check=False)
    found = (dict(re.findall(r"(\w+)=((?:(?! \w+=).)*)", line)) for line in out.splitlines() if "=" in line)
    return {r["ReservationName"]: r for r in found if "ReservationName" in r}


def reset(env):
    for name in reservations(env):
        if name.startswith("spotctl-"):
            slurm_cli(env, "scontrol", "delete", f"ReservationName={name}", check=False)
    ids = list(jobs(env))
    if ids:
        slurm_cli(env, "scancel", *map(str, ids), check=False)
        wait(lambda: not jobs(env), what="jobs cancelled")
    for n in env["nodes"]:
        state = node_info(env, n).get("State", "")
        if "DRAIN" in state or "DOWN" in state:
            slurm_cli(env, "scontrol", "update", f"nodename={n}", "state=resume", check=False)
    wait(lambda: all(node_info(env, n).get("State", "").split("+")[0] == "IDLE"
                     for n in env["nodes"]), what="nodes idle")


@pytest.fixture
def cluster(env):
    reset(env)
    yield env
    reset(env)


def spotctl(env, tmp_path, *args, config: str | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    e.update(SPOTCTL_CONFIG=config or env["SPOTCTL_CONFIG"], SPOTCTL_REGION="lab",
             SPOTCTL_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1")
    return subprocess.run([SPOTCTL, "-o", "json", *args], capture_output=True, text=True, env=e, timeout=60)


def config_with(env, tmp_path, **slurm) -> str:
    """The lab config with its [regions.lab.slurm] table replaced."""
    text = Path(env["SPOTCTL_CONFIG"]).read_text()
    head = text[: text.index("[regions.lab.slurm]")]
    table = {"url": env["SLURM_REST_URL"], "user": env["SLURM_REST_USER"], "token_file": env["SLURM_REST_TOKEN_FILE"],
             "slurm_conf": env["SLURM_CONF"], "scontrol": env.get("SCONTROL"), "timeout_seconds": 10}
    table.update(slurm)
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items() if v is not None]
    path = tmp_path / "spotctl.toml"
    path.write_text(head + "[regions.lab.slurm]\n" + "\n".join(lines) + "\n")
    return str(path)


def adapter(env, tmp_path=None, **slurm):
    from spotctl.adapters.slurm import SlurmScheduler

    if slurm:
        cfg = load_config(env={"SPOTCTL_CONFIG": config_with(env, tmp_path, **slurm)})
    else:
        cfg = load_config(env={"SPOTCTL_CONFIG": env["SPOTCTL_CONFIG"]})
    region = cfg.region("lab")
    return SlurmScheduler.from_config(region), region


# --- demand -------------------------------------------------------------------------------------------


def test_pending_jobs_become_demand_or_are_excluded_with_their_reason(cluster, tmp_path):
    env = cluster
    fill = [sbatch(env, "-p", "spot", "-c4", "-t", "10") for _ in range(2)]  # both spot nodes busy
    fill.append(sbatch(env, "-p", "ondemand", "-N2", "-c4", "-t", "10"))  # both ondemand nodes busy
    wait(lambda: all(jobs(env)[j]["state"] == "RUNNING" for j in fill), what="spot and ondemand nodes filled")
    resources = sbatch(env, "-p", "spot", "-c4", "--mem=1000", "-t", "30")
    priority = sbatch(env, "-p", "spot", "-c1", "-C", "bigmem", "-t", "5")
    multi = sbatch(env, "-p", "spot", "-N2", "-c2", "-t", "20")  # two nodes: two units
    held = sbatch(env, "-p", "spot", "-H", "-t", "5")
    dep = sbatch(env, "-p", "spot", "-t", "5", f"--dependency=afterok:{held}")
    later = sbatch(env, "-p", "spot", "-t", "5", "--begin=now+1hour")
    too_big = sbatch(env, "-p", "spot", "-N3", "-t", "5")  # partition spot: MaxNodes=2
    ondemand = sbatch(env, "-p", "ondemand", "-c4", "-t", "5")  # short of nodes, but not a spot partition
    want = {resources: "Resources", priority: "Priority", held: "JobHeldUser", dep: "Dependency",
            later: "BeginTime", too_big: "PartitionNodeLimit", ondemand: "Resources"}
    wait(lambda: all(jobs(env)[j]["reason"] == r for j, r in want.items()), what=f"pending reasons {want}")
    assert jobs(env)[multi]["reason"] in ("Resources", "Priority")

    p = spotctl(env, tmp_path, "plan")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    data = out["data"]
    assert data["degraded"] == {}
    excluded = {e["unit"]: e["reason"] for e in data["excluded"] if e["scheduler"] == "slurm"}
    assert excluded == {
        f"slurm/{held}": "held by its user (JobHeldUser)",
        f"slurm/{dep}": "waits for a dependency",
        f"slurm/{later}": "begin time is in the future",
        f"slurm/{too_big}": "asks more nodes than its partition allows per job (MaxNodes)",
        f"slurm/{ondemand}": "partition ondemand is not served by any spot pool",
    }
    # resources (1) + priority behind it (1) + the two-node job (2)
    assert data["demand"]["by_scheduler"] == {"slurm": 4}
    assert data["demand"]["excluded"] == 5
    launches = {a["pool"]: a for a in data["actions"] if a["kind"] == "launch"}
    assert set(launches) == {"vm-spot", "bm-spot"}  # the bigmem job only fits the pool with that feature
    assert launches["bm-spot"]["units"] >= 1

    # the units themselves, from the adapter built from the same config
    sched, region = adapter(env)
    units, excl = sched.pending(region.pools)
    by_id = {u.id: u for u in units}
    assert set(by_id) == {f"slurm/{resources}", f"slurm/{priority}", f"slurm/{multi}/1", f"slurm/{multi}/2"}
    u = by_id[f"slurm/{resources}"]
    assert (u.shape.vcpu, u.shape.ram_mb, u.shape.gpus) == (4, 1000, 0)
    assert u.expected_seconds == 1800 and u.partition == "spot" and u.submitted_at > 0
    assert by_id[f"slurm/{priority}"].features == ("bigmem",)
    assert by_id[f"slurm/{multi}/1"].shape.vcpu == 2 and by_id[f"slurm/{multi}/1"].expected_seconds == 1200


# --- nodes: usage, drain, resume, forget ------------------------------------------------------------------


def test_drain_sets_drain_with_our_reason_and_requeues_the_running_job_and_resume_clears_it(cluster):
    env = cluster
    n1, n2 = env["nodes"][:2]
    job = sbatch(env, "-p", "spot", "-c4", "-t", "10", "-w", n1)
    wait(lambda: jobs(env).get(job, {}).get("state") == "RUNNING", what="job running")
    sched, _ = adapter(env)
    assert sched.drain_method() == env["drain_method"]  # 22.05: scontrol; 24.11: REST
    usage = {u.node: u for u in sched.usage()}
    assert set(usage) == {n1, n2}  # od-n* are not ours
    assert usage[n1].running == 1 and usage[n1].used.vcpu == 4
    assert not usage[n1].cordoned and usage[n2].running == 0

    t0 = time.perf_counter()
    sched.drain(n1, REASON, deadline=time.time() + 120)
    took = time.perf_counter() - t0
    info = node_info(env, n1)
    assert "DRAIN" in info["State"]
    assert info["Reason"].startswith(REASON)
    job_info = slurm_cli(env, "scontrol", "show", "job", str(job), "-o")
    assert "Restarts=1" in job_info  # requeued, not killed
    assert wait(lambda: jobs(env)[job]["state"] == "PENDING", what="job requeued")
    assert took < 5
    assert {u.node: u for u in sched.usage()}[n1].cordoned

    sched.resume(n1)
    info = node_info(env, n1)
    assert "DRAIN" not in info["State"]
    assert not {u.node: u for u in sched.usage()}[n1].cordoned
    sched.resume(n1)  # idempotent


def test_cordon_keeps_running_jobs(cluster):
    env = cluster
    n2 = env["nodes"][1]
    job = sbatch(env, "-p", "spot", "-c1", "-t", "10", "-w", n2)
    wait(lambda: jobs(env).get(job, {}).get("state") == "RUNNING", what="job running")
    sched, _ = adapter(env)
    sched.cordon(n2, "spotctl: advisory a-1")
    assert "DRAIN" in node_info(env, n2)["State"]
    assert jobs(env)[job]["state"] == "RUNNING"


def test_protect_keeps_jobs_that_would_cross_the_safe_until_time_off_the_node(cluster):
    """Issue 10, item 4: the calendar holds at run time. protect() puts a maintenance reservation on the node from
    its safe-until time: Slurm starts a 10-minute job there, not a 60-minute one (its time limit crosses it)."""
    env = cluster
    n2 = env["nodes"][1]
    sched, _ = adapter(env)
    until = time.time() + 1800
    sched.protect(n2, until)
    sched.protect(n2, until)  # idempotent
    res = reservations(env)[f"spotctl-{n2}"]
    assert res["Nodes"] == n2 and "MAINT" in res["Flags"]
    short_job = sbatch(env, "-p", "spot", "-c1", "-t", "10", "-w", n2)
    wait(lambda: jobs(env).get(short_job, {}).get("state") == "RUNNING", what="short job running")
    long_job = sbatch(env, "-p", "spot", "-c1", "-t", "60", "-w", n2)  # room for it on n2, not time
    wait(lambda: jobs(env).get(long_job, {}).get("reason") not in (None, "None"), what="long job evaluated")
    assert jobs(env)[long_job]["state"] == "PENDING", jobs(env)
    # without the reservation the same job starts there (the node has room): it was the window that kept it off
    sched.protect(n2, None)
    slurm_cli(env, "scontrol", "update", f"jobid={long_job}", "timelimit=59")  # a change makes Slurm look again
    wait(lambda: jobs(env).get(long_job, {}).get("state") == "RUNNING", what="long job running once lifted", timeout=40)
    sched.protect(n2, until)
    # moved earlier: the same reservation, updated; lifted: gone
    sched.protect(n2, until - 600, closed=True)
    assert list(r for r in reservations(env) if r.startswith("spotctl-")) == [f"spotctl-{n2}"]
    sched.protect(n2, None)
    sched.protect(n2, None)  # idempotent
    assert f"spotctl-{n2}" not in reservations(env)
    with pytest.raises(NotFoundError):
        sched.protect("spot-no-such-node", until)


def test_forget_sets_a_lost_static_node_down_with_a_reason(cluster):
    env = cluster
    n2 = env["nodes"][1]
    sched, _ = adapter(env)
    sched.forget(n2, "instance vanished without notice")
    info = node_info(env, n2)
    assert info["State"].startswith("DOWN")
    assert info["Reason"].startswith("instance vanished without notice")


@pytest.mark.parametrize("env", ["slurm"], indirect=True)  # the 22.05 cluster's dyn-add helper
def test_forget_deletes_a_dynamic_node(cluster):
    env = cluster
    name = "spot-lab-dyn1"
    subprocess.run([SCRIPT, "dyn-add", name], check=True, capture_output=True, timeout=60)
    try:
        sched, _ = adapter(env)
        assert name in {u.node for u in sched.usage()}
        assert "DYNAMIC" in node_info(env, name)["State"]
        subprocess.run([SCRIPT, "dyn-kill", name], check=True, capture_output=True, timeout=60)  # instance gone
        sched.forget(name, "instance deleted")
        assert node_info(env, name) == {}
        assert name not in {n["name"] for n in sched.nodes()}
        sched.forget(name, "instance deleted")  # idempotent
    finally:
        subprocess.run([SCRIPT, "dyn-kill", name], capture_output=True, timeout=60)
        slurm_cli(env, "scontrol", "delete", f"nodename={name}", check=False)


def test_unknown_node_is_not_found(cluster):
    from spotctl.core.errors import NotFoundError

    sched, _ = adapter(cluster)
    with pytest.raises(NotFoundError, match="spot-nope"):
        sched.drain("spot-nope", REASON, None)


# --- API versions, auth, availability ------------------------------------------------------------------


def test_discovery_picks_the_newest_supported_version(env, tmp_path):
    sched, _ = adapter(env)
    sched.discover()  # on first use inside a pass; here, explicitly
    if env["service"] == "slurm":
        assert "v0.0.36" in sched.served_versions  # 22.05 also serves older versions
        assert sched.api_version == "v0.0.38"
    else:
        assert sched.served_versions == ["v0.0.40", "v0.0.41", "v0.0.42"]  # 24.11
        assert sched.api_version == "v0.0.42"
    supported = [v for v in sched.served_versions if v in ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")]
    assert sched.api_version == supported[-1]
    assert sched.drain_method() == env["drain_method"]  # 22.05 cannot update nodes over REST
    pinned, _ = adapter(env, tmp_path, api_version="v0.0.42" if sched.api_version != "v0.0.42" else "v0.0.38")
    with pytest.raises(ConfigError, match="not served"):
        pinned.discover()


def test_unsupported_api_version_is_a_config_error(env, tmp_path):
    p = spotctl(env, tmp_path, "plan", config=config_with(env, tmp_path, api_version="v0.0.37"))
    assert p.returncode == 3, p.stderr
    assert "v0.0.37" in p.stderr and "not supported" in p.stderr


def _token(env, lifespan: int) -> str:
    out = slurm_cli(env, "scontrol", "token", f"username={env['SLURM_REST_USER']}", f"lifespan={lifespan}")
    return out.strip().split("=", 1)[1]


def test_expired_token_exits_4(env, tmp_path):
    tok = tmp_path / "expired.jwt"
    tok.write_text(_token(env, 1))
    time.sleep(2.1)
    p = spotctl(env, tmp_path, "plan", config=config_with(env, tmp_path, token_file=str(tok)))
    assert p.returncode == 4, p.stderr
    assert "expired" in p.stderr
    assert json.loads(p.stdout)["errors"][0]["code"] == "auth"


def test_token_with_a_bad_signature_exits_4_with_the_servers_message(env, tmp_path):
    head, claims, sig = _token(env, 600).split(".")
    forged = f"{head}.{claims}.{sig[:-6]}AAAAAA"
    p = spotctl(env, tmp_path, "plan", config=config_with(env, tmp_path, token_file=None, token=forged))
    assert p.returncode == 4, p.stderr
    assert "refuses the token" in p.stderr
    if env["service"] == "slurm":
        assert "Unspecified error" in p.stderr  # what 22.05's slurmrestd says (HTTP 500)
    else:
        assert "HTTP 511" in p.stderr  # 24.11: Network Authentication Required, no error entry
        assert '"meta"' not in p.stderr  # no raw answer dumped
    assert forged not in p.stderr and forged not in p.stdout  # never print the token


def test_slurmrestd_down_degrades_the_pass(env, tmp_path):
    pid_file = Path(env["SLURM_TESTENV_DIR"]) / "run" / "slurmrestd.pid"
    pid = int(pid_file.read_text())
    os.kill(pid, 15)
    try:
        wait(lambda: not Path(f"/proc/{pid}").exists(), what="slurmrestd stopped")
        p = spotctl(env, tmp_path, "plan")
        assert p.returncode == 7, p.stderr  # a plan made without a source is partial, as a pass is
        assert json.loads(p.stdout)["status"] == "partial"
        data = json.loads(p.stdout)["data"]
        assert "cannot connect to slurmrestd" in data["degraded"]["scheduler:slurm"]
        r = spotctl(env, tmp_path, "reconcile")
        assert r.returncode == 7, r.stderr
        assert "scheduler:slurm" in json.loads(r.stdout)["data"]["degraded"]
    finally:
        subprocess.run([env["script"], "up"], check=True, capture_output=True, timeout=300)
