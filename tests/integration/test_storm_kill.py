"""Kill -9 the watcher in the middle of a reclaim storm; the next passes finish every drain.

Issue 10 ("Tests that must exist"). The storm of ``test_storm.py`` (50 spot nodes in the Kubernetes
test server, two Ready pods each under a PodDisruptionBudget that blocks evictions; two of them also
the Slurm test cluster's spot nodes, each running a job), end to end through processes:

- the cloud is the region's simulator state file (backend "sim") holding the 50 instances; the
  provider's contract API (the reference server, ``spotctl.services.contract_api``) runs in the test
  over a detached copy of that world and sends the 50 hard notices (120 s lead) in one reclaim, so
  they reach the watcher in one poll;
- ``spot-reconciler watch`` runs as a subprocess. The test watches its progress in the state database
  (read-only), freezes it with SIGSTOP the moment half of the chosen phase is recorded, and SIGKILLs
  it there; each step of that phase is stretched to ~20 ms (:func:`slow_steps`), so the kill lands
  mid-phase however loaded the machine is. What the kill left is read back and must be mid-storm:
  ``intents``  — 25 of its 50 drain intents recorded, none carried out (no node cordoned yet);
  ``outcomes`` — every node cordoned in every scheduler (evictions asked once, refused by the PDBs;
  the Slurm jobs requeued), and 25 of the 50 drains recorded as started (node ``draining``,
  first-round audit record): the other 25 are cordoned while the store still says ``active``;
- the PDBs are lifted, and ``spotctl reconcile`` passes (subprocesses) run until every node is drained
  and its capacity returned (node ``deleting`` or ``gone``), well before the deadlines.

Checked at the kill and after every pass: a node recorded as draining is cordoned in every scheduler
its pool is bound to (Kubernetes: unschedulable with the reclaim taint; Slurm: DRAIN), and no node is
cordoned in a scheduler without its drain recorded (after the first pass: none at all). At the end,
for each of the 50 noticed nodes: drained once (below), its notice handled, its capacity returned
before the deadline (node ``deleting``/``gone``, one ``node.delete`` record in which every bound
scheduler accepted to forget the node: the Kubernetes node object is gone; Slurm was set DOWN, which
the test cluster undoes by ReturnToService=2, its slurmd outliving the simulated instance); no pod
left; the Slurm jobs still queued (the same job ids, none lost), each requeued exactly once; a further
pass does nothing more to them; no action left ``intended``, no pass left running; the audit chain
verifies.

"Drained twice", from the store's records: a node that transitions into ``draining`` more than once,
or has more than one first-round ``node.drain`` audit record, or more than one first-round drain
action (a drain whose ``inputs.continue`` is unset: the watcher's action for the notice — finished by
the next pass's resume when the kill left it ``intended`` — or, for a node the watcher never reached,
the planner's), or a Slurm job requeued more than once (``Restarts``). Continue rounds (evicting what
is left) repeat by design and are not second drains. And the split is exact: a node whose drain the
watcher had recorded before the kill keeps the watcher's record; every other node's first round is
the next pass's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from spotctl.core.models import NodeState
from spotctl.services.contract_api import make_server
from spotctl.sim.knobs import Knobs
from spotctl.sim.world import SimWorld
from spotctl.state.store import Store

from . import conftest as harness
from .test_both_schedulers import slurm
from .test_storm import LEAD, N, SLURM_NODES, add_active_nodes, storm_region, storm_scene

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
RECLAIM_TAINT = "spotctl.io/reclaim"  # the Kubernetes adapter's default cordon taint
DRAINED = (NodeState.DRAINING, NodeState.DELETING, NodeState.GONE)  # a drain recorded
RETURNED = (NodeState.DELETING, NodeState.GONE)  # drained, and the instance delete accepted
# Passes return the capacity in one go (a token per delete) and launch nothing: replacements would be
# simulated instances that never join the test schedulers, and this test is about the drains.
POLICY = """
[regions.lab.budget]
rate = 5
burst = 200

[regions.lab.policy]
max_launches_per_pass = 0
"""
# A quiet simulated provider: no on-demand surges or reservations of its own on the spot pools, and
# room for all 50 instances.
QUIET = Knobs(surges_per_day=0, lease_probability_headroom=0.0, ondemand_headroom=(0.05, 0.1))


def _counts(conn: sqlite3.Connection) -> dict:
    """The watcher's progress, as recorded: the nodes with its drain intent, the nodes recorded draining."""
    return {
        "intents": sorted(r[0] for r in conn.execute("SELECT node FROM actions WHERE kind='drain' AND id LIKE 'w-%'")),
        "draining": sorted(r[0] for r in conn.execute("SELECT id FROM nodes WHERE state='draining'")),
    }


# Each of the watcher's steps in the phase the test kills it in: a drain intent (an actions row), or a
# drain recorded as started (a transition into draining).
STEPS = {"intents": "AFTER INSERT ON actions WHEN NEW.kind = 'drain' AND NEW.id LIKE 'w-%'",
         "outcomes": "AFTER INSERT ON transitions WHEN NEW.to_state = 'draining'"}
SLOW_ROWS = 500  # a step then takes ~20 ms (a 250 000-row cross join), 50 of them ~1 s


@contextlib.contextmanager
def slow_steps(db: Path, phase: str):
    """Stretch each of the watcher's steps of ``phase`` to ~20 ms, inside its own write transaction, by
    a trigger in the test's state database that runs an expensive SELECT (it changes nothing). The
    watcher records its 50 intents, and later its 50 outcomes, back to back, a short transaction each:
    50 take ~2-6 ms, so on this loaded two-core machine a test stalled for a few milliseconds would see
    them all done at once (tried: the kill missed the window), and a grab of the write lock almost never
    lands between two of them (tried: it missed all 50 intents). Stretched, the kill lands between two
    steps whatever the scheduling noise. Dropped again before the passes run."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    try:
        conn.execute("CREATE TABLE test_slow (x INTEGER)")
        conn.executemany("INSERT INTO test_slow VALUES (?)", [(i,) for i in range(SLOW_ROWS)])
        conn.execute(f"CREATE TRIGGER test_slow_step {STEPS[phase]} BEGIN "
                     "SELECT sum(a.x * b.x) FROM test_slow a, test_slow b; END")
        yield
    finally:
        conn.execute("DROP TRIGGER IF EXISTS test_slow_step")
        conn.execute("DROP TABLE IF EXISTS test_slow")
        conn.close()


def stop_when(proc: subprocess.Popen, conn: sqlite3.Connection, ready, timeout: float = 60.0) -> None:
    """SIGSTOP the watcher the moment its recorded progress (read through ``conn``, read-only: a read
    never waits in WAL mode) satisfies ``ready(counts)``: it freezes wherever it is (mid-transaction
    too), and is SIGKILLed there."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready(_counts(conn)):
            os.kill(proc.pid, signal.SIGSTOP)
            return
        if proc.poll() is not None:
            break
        time.sleep(0.001)
    raise AssertionError(f"the watcher never reached the point to kill it at (exit {proc.poll()})")


def k8s_nodes(http, url: str, names: list[str]) -> dict[str, dict | None]:
    out = {}
    for name in names:
        r = http.get(f"{url}/api/v1/nodes/{name}", timeout=10)
        out[name] = None if r.status_code == 404 else r.raise_for_status() or r.json()
    return out


def cordoned(obj: dict | None) -> bool:
    spec = (obj or {}).get("spec") or {}
    return bool(spec.get("unschedulable")) and any(
        t.get("key") == RECLAIM_TAINT and t.get("effect") == "NoSchedule" for t in spec.get("taints") or [])


def slurm_node_state(s_env, name: str) -> str:
    return re.search(r"\bState=(\S+)", slurm(s_env, "scontrol", "show", "node", "-o", name)).group(1)


def slurm_job(s_env, job: int) -> dict:
    line = slurm(s_env, "scontrol", "show", "job", "-o", str(job))
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def reconcile(env: dict, where: list[str]) -> dict:
    """One `spotctl reconcile` pass; it must end ok (exit 0). Its result's data."""
    p = subprocess.run([str(BIN / "spotctl"), "-o", "json", *where, "reconcile"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)["data"]


def drains_as_seen(db: Path, http, url: str, s_env, names: list[str]) -> SimpleNamespace:
    """The store against the schedulers: the nodes as recorded, the Kubernetes node objects, whether Slurm
    holds each of its nodes drained, the nodes cordoned in a scheduler whose drain the store does not
    record (``stray``), and the nodes recorded as draining that a scheduler their pool is bound to does
    not hold cordoned (``loose``)."""
    store = Store.open(db, "lab")
    try:
        nodes = {n: store.node(n) for n in names}
    finally:
        store.close()
    k8s = k8s_nodes(http, url, names)
    in_slurm = {n: "DRAIN" in slurm_node_state(s_env, n) for n in SLURM_NODES}
    stray = {n for n in names if cordoned(k8s[n]) or in_slurm.get(n)} - {n for n in names if nodes[n].state in DRAINED}
    loose = {n for n in names if nodes[n].state is NodeState.DRAINING
             and not (cordoned(k8s[n]) and in_slurm.get(n, True))}
    return SimpleNamespace(nodes=nodes, k8s=k8s, slurm=in_slurm, stray=sorted(stray), loose=sorted(loose))


@pytest.mark.parametrize("kill_at", ["intents", "outcomes"])
def test_sigkill_mid_storm_then_passes_finish_every_drain_once(tmp_path, kill_at):
    s_env, k_env = harness.testenv("slurm"), harness.testenv("k8s")
    state = tmp_path / "state"
    state.mkdir()
    cfg, region = storm_region(tmp_path, s_env, k_env, POLICY)
    with contextlib.ExitStack() as stack:
        http, url, ns, names, jobs = stack.enter_context(storm_scene(region, s_env, k_env))
        # The cloud: the 50 instances, active, in the simulator state file the processes open ...
        now = time.time()
        world = SimWorld.new(region, now - region.pools["storm-spot"].boot_seconds - 60, knobs=QUIET)
        iids = {n: world.cloud.create_instance(region.pools["vm-spot" if n in SLURM_NODES else "storm-spot"], n,
                                               f"a-{n}").id for n in names}
        world.advance(now)
        assert sum(i.status == "ACTIVE" for i in world.cloud.instances()) == N
        world.path = state / "lab.sim.db"
        world.save()
        world.path = None  # ... and the provider's own copy of it, which serves the contract API
        server = make_server(world, port=0, max_wait=5)
        threading.Thread(target=server.serve, daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        cfg.write_text(cfg.read_text() + f'\n[regions.lab.contract]\nurl = "{server.url}"\ntimeout_seconds = 5\n')
        db = state / "lab.db"
        store = Store.open(db, "lab")
        add_active_nodes(store, names, now, iids)
        store.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")} | {"NO_COLOR": "1"}
        where = ["--config", str(cfg), "--state-dir", str(state), "-r", "lab"]
        log = (tmp_path / "watch.out").open("w"), (tmp_path / "watch.err").open("w")
        with slow_steps(db, kill_at):
            watcher = subprocess.Popen([str(BIN / "spot-reconciler"), "watch", "--wait", "2", "-v", *where],
                                       env=env, stdout=log[0], stderr=log[1])
            ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
            try:
                harness.wait_until(lambda: "watching notices" in (tmp_path / "watch.err").read_text()
                                   or watcher.poll() is not None, "the watcher to start", 30)
                assert watcher.poll() is None, (tmp_path / "watch.err").read_text()
                # The storm: 50 hard notices in one reclaim, so in the watcher's next poll.
                receipt = server.api.reclaim({"instance_ids": [iids[n] for n in names],
                                              "notice_seconds": int(LEAD), "reason": "reclaim storm"})
                assert [r["state"] for r in receipt["instances"]] == ["noticed"] * N, receipt
                received = time.time()
                # half-way through the phase: freeze it, kill it there
                stop_when(watcher, ro, (lambda c: len(c["intents"]) >= N // 2) if kill_at == "intents"
                          else (lambda c: len(c["draining"]) >= N // 2))
                watcher.send_signal(signal.SIGKILL)
                assert watcher.wait(10) == -signal.SIGKILL
                killed_at = time.time()
                at_kill = _counts(ro)  # what the kill left, as the next pass finds it
            finally:
                ro.close()
                if watcher.poll() is None:
                    watcher.kill()
                    watcher.wait(10)
                log[0].close()
                log[1].close()

        # The kill landed mid-storm: some drains started, not all finished (the PDBs still block every
        # eviction, so no node is empty either).
        seen = drains_as_seen(db, http, url, s_env, names)
        assert not seen.loose, f"recorded as draining but not cordoned: {seen.loose}"
        if kill_at == "intents":
            assert 1 <= len(at_kill["intents"]) < N and at_kill["draining"] == [], at_kill
            assert not seen.stray  # the cordons come after all 50 intents
        else:
            assert at_kill["intents"] == sorted(names) and 1 <= len(at_kill["draining"]) < N, at_kill
            assert all(map(cordoned, seen.k8s.values())) and all(seen.slurm.values())  # every node cordoned ...
            # ... so the hazard: cordoned in the schedulers while the store says the node is active
            assert seen.stray == sorted(set(names) - set(at_kill["draining"])), seen.stray
        for name in names:
            http.delete(f"{url}/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}", timeout=10)

        # The next passes finish every drain and return the capacity.
        passes = 0
        while True:
            reconcile(env, where)
            passes += 1
            seen = drains_as_seen(db, http, url, s_env, names)
            assert not seen.stray, f"after pass {passes}: cordoned, but no drain recorded: {seen.stray}"
            assert not seen.loose, f"after pass {passes}: recorded as draining, but not cordoned: {seen.loose}"
            if all(v.state in RETURNED for v in seen.nodes.values()):
                break
            assert time.time() < received + LEAD - 30 and passes < 20, \
                f"not every node returned after {passes} passes: " \
                f"{sorted((n, str(v.state)) for n, v in seen.nodes.items() if v.state not in RETURNED)[:5]}"
            time.sleep(0.5)  # the timer's next pass, sooner
        returned_at = time.time()
        # and one more pass does nothing more to them: two passes do what one does
        again = [o for o in reconcile(env, where)["outcomes"] if o.get("node") in names]
        assert not [o for o in again if o["kind"] in ("drain", "cordon", "delete")], again

        store = Store.open(db, "lab")
        try:
            drains = store.audit_query(action="node.drain")
            deletes = [r for r in store.audit_query(action="node.delete") if r["result"] != "intended"]
            actions = [a for a in store.actions(limit=None) if a["kind"] == "drain"]
            into_draining = dict(store.conn.execute(
                "SELECT node_id, COUNT(*) FROM transitions WHERE to_state='draining' GROUP BY node_id").fetchall())
            unfinished = [dict(r) for r in store.conn.execute(
                "SELECT id, kind, node, status FROM actions WHERE status IN ('intended', 'running')")]
            running_passes = store.conn.execute("SELECT COUNT(*) FROM passes WHERE finished_at IS NULL").fetchone()[0]
            notices = {r["node_id"]: r for r in store.notices()}
            nodes = {n: store.node(n) for n in names}
            chain = store.verify_audit()
        finally:
            store.close()
        # the schedulers at the end, before the scene is torn down
        pods = http.get(f"{url}/api/v1/namespaces/{ns}/pods", timeout=10).json()["items"]
        queued = {j: slurm_job(s_env, j) for j in jobs}

    # every node drained, once, and its capacity returned before its deadline
    assert returned_at < min(r["deadline"] for r in notices.values()), "capacity returned after a deadline"
    first: dict[str, dict] = {}
    for rec in drains:
        if rec["inputs"].get("round") == "first":
            assert rec["target"] not in first, f"{rec['target']}: two first-round drain records"
            first[rec["target"]] = rec
    assert set(first) == set(names)
    assert all(into_draining.get(n) == 1 for n in names), {n: into_draining.get(n) for n in names}
    for name in names:
        mine = [a for a in actions if a["node"] == name and not a["inputs"].get("continue")]
        assert [a["id"] for a in mine] == [first[name]["inputs"]["action_id"]], (name, mine)
        assert mine[0]["status"] == "done", mine[0]
        assert first[name]["inputs"]["notice"] == nodes[name].notice_id
        assert notices[name]["handled_at"] is not None
        assert nodes[name].state in RETURNED
    # the split is exact: the drains the watcher had recorded were kept (and only those are from before the
    # kill); the watcher's intents were carried out by the next pass's resume, under their own action ids;
    # the planner drained the nodes the watcher had not reached; no node by both
    assert {n for n in names if first[n]["at"] < killed_at} == set(at_kill["draining"])
    assert sorted(n for n in names if first[n]["inputs"]["action_id"].startswith("w-")) == at_kill["intents"]

    # drained in every bound scheduler (checked after every pass above); then no pod left, and each
    # node forgotten by every scheduler with its instance: its Kubernetes node object deleted, Slurm
    # told DOWN (in the test cluster the node's slurmd outlives the simulated instance, so
    # ReturnToService=2 brings it back; a real node is gone with its instance)
    assert pods == [], [p["metadata"]["name"] for p in pods]
    assert all(o is None for o in seen.k8s.values()), [n for n, o in seen.k8s.items() if o is not None]
    by_node = {}
    for rec in deletes:
        assert rec["target"] not in by_node, f"{rec['target']}: deleted twice"
        by_node[rec["target"]] = rec
    for name in names:
        bound = {"kubernetes", "slurm"} if name in SLURM_NODES else {"kubernetes"}
        assert by_node[name]["result"] == "ok" and bound <= set(by_node[name]["inputs"]["accepted_at"]), by_node[name]
    for job, j in queued.items():  # requeued once, not lost: the same jobs, still queued
        assert j["JobState"] in ("PENDING", "REQUEUED", "RUNNING", "CONFIGURING"), (job, j["JobState"])
        assert j["Restarts"] == "1", (job, j["Restarts"])

    # nothing left half done, and the record is intact
    assert unfinished == [] and running_passes == 0, unfinished
    assert chain[0], chain
