#!/usr/bin/env python3
"""A state database aged by 30 simulated days, written directly (no passes run): the history a region of
``nodes`` spot nodes leaves behind, for the pass benchmark (``benchmarks/passes.py``) to run the same
generated region's passes on (``spotctl.sim.generate.generated_region``: its fleet is *not* in the
history, the first pass adopts it as on a fresh database).

Volumes, from a pass every 30 s and this churn (the defaults of ``age``):

- **nodes that ended**: ``churn`` (10 %) of the fleet per day, so 3 × ``nodes`` over 30 days (60k at
  20k nodes, 300k at 100k), lifetimes exponential (mean 1 day), ending within the window; 60 % scaled down
  (intended → building → active → deleting → gone), 35 % reclaimed after a hard notice (… active →
  draining → gone, with the notice row, handled, and a ``reclaims`` row), 5 % lost (… active → lost,
  a ``reclaims`` row): 5, 5 and 4 transitions, each with its event.
- **actions**: the launch of each node (count 1) and its delete or drain, finished (``done``).
- **audit**: ``node.launch`` intended and ok for every node, ``node.delete``/``node.drain`` intended and
  ok, or ``node.lost``: 4 or 3 a node (~11.7 per 3 nodes), one valid chain in time order, every record
  with its outbox row, delivered (records are kept 90 days, and take their outbox rows with them).
- **outbox**: every event and audit record queued at its time, in time order, delivered 2 s later,
  except what the last minute queued (still pending); delivered events older than the outbox retention
  (7 days) were pruned, so only the last 7 days' events are there.
- **passes**: one every 30 s; the store keeps the newest 2000 rows (``Store.finish_pass``).
- **plans**: one a pass; the store keeps the newest 500 within 64 MiB (``[retention] plans_max`` and
  ``plans_max_mib``), each with an input of the size a plan of ``nodes`` nodes has.
- **pruned** as the passes prune (a run of this file; ``age(pruned=False)`` leaves the backlog for
  ``benchmarks/prune.py``): nothing left that the default retention lets go, and the passes' walk marks
  where the last pass's prune left them (a region that has run 30 days pruned at every pass).

Rows are built in Python and written with ``executemany``, one transaction per table chunk:
about 9 s at 20k nodes. Run alone: ``python benchmarks/aged.py DB NODES [DAYS]``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotctl.core.audit import GENESIS, canonical  # noqa: E402
from spotctl.core.models import Node, NodeState  # noqa: E402
from spotctl.sim.generate import GEN_START, generated_pools  # noqa: E402
from spotctl.sim.rng import uuid_from  # noqa: E402
from spotctl.state.bulk import AuditRows, EventRows  # noqa: E402
from spotctl.state.store import Store, _node_row  # noqa: E402

DAY = 86_400.0
PASS_EVERY = 30.0
PASSES_KEPT = 2000  # Store.finish_pass keeps the newest 2000 pass rows
PLANS_KEPT, PLANS_MIB = 500, 64  # the default [retention] plans_max, plans_max_mib
OUTBOX_DAYS = 7  # the default [retention] outbox_days: delivered rows older than that are pruned
CHUNK = 50_000
S = NodeState

# how a node ends: (share, the states after active, the reason it ended)
ENDINGS = (
    (0.60, (S.DELETING, S.GONE), "scaled down"),
    (0.35, (S.DRAINING, S.GONE), "reclaimed after notice"),
    (0.05, (S.LOST,), "instance vanished without notice"),
)


def _steps(node: Node, t0: float, end: float, boot: float, ending: int) -> list[tuple[float, S | None, S, str]]:
    """(when, from, to, reason) of each transition of one node's life."""
    after = ENDINGS[ending][1]
    steps = [(t0, None, S.INTENDED, "demand"), (t0 + 5.0, S.INTENDED, S.BUILDING, "instance created"),
             (t0 + 5.0 + boot, S.BUILDING, S.ACTIVE, "instance active")]
    if len(after) == 2:
        steps.append((end - 120.0, S.ACTIVE, after[0], ENDINGS[ending][2]))
        steps.append((end, after[0], after[1], "instance deleted and its allocations freed" if ending == 0
                      else f"reclaimed after notice n-{node.id}"))
    else:
        steps.append((end, S.ACTIVE, S.LOST, "instance vanished without notice"))
    return steps


def age(store: Store, nodes: int, *, now: float = GEN_START, days: float = 30.0, churn: float = 0.10,
        seed: int = 1, pruned: bool = False) -> dict[str, int]:
    """Write ``days`` of history for a region of ``nodes`` nodes into ``store`` (empty); rows per table.
    ``pruned``: then pruned as the passes would have pruned it (:func:`_pruned_as_the_passes_did`; what a run
    of this file writes, for the pass benchmark); else with every row the retention lets go still there (the
    backlog ``benchmarks/prune.py`` measures)."""
    r = random.Random(seed)
    pools = generated_pools(nodes, seed)
    names = sorted(pools)
    weights = [pools[p].max_nodes for p in names]
    begin, last = now - days * DAY, now - 60.0
    ended = int(nodes * churn * days)
    actor, region = "spot-reconciler", store.region
    node_rows, actions, notices, reclaims = [], [], [], []
    happen: list[tuple[float, int, int]] = []  # (when, node index, step): every transition, in time order later
    lives = []
    for i in range(ended):
        pool = pools[r.choices(names, weights)[0]]
        end = begin + 3600.0 + r.random() * (last - begin - 3600.0)
        # a life that began before the window is not cut to begin with it: that piled one node in thirty on its
        # first second, thousands of rows falling due in the first passes measured (5,440 transitions in the
        # window's first 2 minutes at 20k nodes, where the pace is about 4 a pass); its rows from before the
        # window are what the passes' prune took already (_pruned_as_the_passes_did)
        t0 = end - r.expovariate(1 / DAY) - pool.boot_seconds - 130.0
        x = r.random()
        ending = 0 if x < ENDINGS[0][0] else 1 if x < ENDINGS[0][0] + ENDINGS[1][0] else 2
        aid = f"hist-{i:07d}"
        node = Node(id=f"spot-{pool.name}-h{i:07d}", pool=pool.name, state=S.INTENDED, action_id=f"{aid}.0",
                    created_at=t0, updated_at=t0, instance_id=uuid_from(r),
                    host=f"{pool.name}-hv{r.randrange(1, 1000):05d}", reason="demand", price=0.02)
        steps = _steps(node, t0, end, float(pool.boot_seconds), ending)
        lives.append((node, steps, ending))
        happen.extend((s[0], i, k) for k, s in enumerate(steps))
        node.state, node.updated_at, node.reason = steps[-1][2], end, steps[-1][3]
        if ending == 1:
            node.notice_id, node.notice_deadline = f"n-{node.id}", end
        node_rows.append(_node_row(node))
        actions.append((f"{aid}", None, "launch", pool.name, None, 1, "launch", "done", "demand", actor, t0, t0 + 5,
                        "1 of 1 instance(s) exist", "{}"))
        if ending < 2:
            kind = "delete" if ending == 0 else "drain"
            actions.append((f"{aid}-{kind}", None, kind, pool.name, node.id, None, "reclaim", "done",
                            ENDINGS[ending][2], actor, end - 120.0, end, "ok", "{}"))
        if ending == 1:
            notices.append((f"n-{node.id}", node.id, node.instance_id, "hard", end - 120.0, end, end - 118.0,
                            end - 117.0, "reclaim", end - 119.0, pool.name))
        if ending:
            reclaims.append((pool.name, node.id, end, "notice" if ending == 1 else "lost"))
    happen.sort()
    # a generator's database, written once: no rollback journal, no syncs (switched back to WAL at the end)
    store.conn.execute("PRAGMA journal_mode=DELETE")
    store.conn.execute("PRAGMA journal_mode=OFF")
    store.conn.execute("PRAGMA synchronous=OFF")
    counts = {"nodes": ended, "actions": len(actions), "notices": len(notices), "reclaims": len(reclaims)}
    _insert(store, "nodes", node_rows)
    del node_rows
    _insert(store, "actions", actions)
    _insert(store, "notices", notices)
    _insert(store, "reclaims", reclaims)
    counts.update(_history(store, lives, happen, actor, region, now))
    counts.update(_passes_and_plans(store, nodes, now, r))
    if pruned:
        counts["pruned"] = _pruned_as_the_passes_did(store, now)
    store.conn.execute("PRAGMA journal_mode=WAL")
    store.conn.execute("PRAGMA synchronous=NORMAL")
    # on disk, as a database that aged over days is: the writes above skipped every sync, and left in the page
    # cache they would be flushed by the first sync of what is measured next (a 333 MiB history: 1.2 s, which
    # the first commit of the prune or of the first pass would pay for the generator)
    fd = os.open(store.path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return counts


def _history(store: Store, lives, happen, actor: str, region: str, now: float) -> dict[str, int]:
    """Transitions, their events, the audit chain and the outbox, in one time order."""
    events, chain = EventRows(region), AuditRows(region, GENESIS)
    keep_events = now - OUTBOX_DAYS * DAY
    pending_from = now - 120.0
    moves, audit, outbox = [], [], []
    n = {"transitions": 0, "audit": 0, "outbox": 0}
    for at, i, k in happen:
        node, steps, ending = lives[i]
        _, src, dst, reason = steps[k]
        moves.append((node.id, src.value if src else None, dst.value, at, reason, actor))
        done = None if at >= pending_from else at + 2.0
        if at >= keep_events or done is None:
            kind, key, payload, created = events.transition(node, src, dst, reason, at)
            outbox.append((kind, key, payload, created, done))
        for action, result in _audited(k, ending):
            row, (kind, key, payload, created) = chain.record(
                actor=actor, action=action, target=node.id, result=result,
                inputs={"pool": node.pool, "action_id": node.action_id, "instance_id": node.instance_id}, at=at)
            audit.append(row)
            outbox.append((kind, key, payload, created, done))
        if len(moves) >= CHUNK:
            _flush(store, moves, audit, outbox, n)
    _flush(store, moves, audit, outbox, n)
    return n


def _audited(step: int, ending: int) -> list[tuple[str, str]]:
    """The audit records written at a step of a node's life."""
    if step == 0:
        return [("node.launch", "intended")]
    if step == 1:
        return [("node.launch", "ok")]
    if step == 3 and ending == 2:
        return [("node.lost", "lost")]
    kind = "node.delete" if ending == 0 else "node.drain"
    return [(kind, "intended")] if step == 3 else [(kind, "ok")] if step == 4 else []


def _flush(store: Store, moves: list, audit: list, outbox: list, n: dict[str, int]) -> None:
    _insert(store, "transitions", moves)
    _insert(store, "audit", audit)
    _insert(store, "outbox", outbox)
    for table, rows in (("transitions", moves), ("audit", audit), ("outbox", outbox)):
        n[table] += len(rows)
        rows.clear()


def _passes_and_plans(store: Store, nodes: int, now: float, r: random.Random) -> dict[str, int]:
    """The newest passes and plans the store keeps, one every 30 s up to a minute ago."""
    passes = []
    for j in range(PASSES_KEPT, 0, -1):
        at = now - 60.0 - j * PASS_EVERY
        passes.append((at, at + 1.5, "spot-reconciler", "ok", canonical(
            {"actions": 3, "degraded": {}, "outcomes": [], "tokens_used": 3})))
    # a plan input of the size a pass over `nodes` nodes records (its nodes dominate it), compressed
    sample = {"nodes": [{"id": f"spot-gp-az1-{i:06d}", "pool": "gp-az1", "state": "active", "created_at": now - i,
                         "idle_since": None, "host": f"gp-az1-hv{i // 10:05d}", "price": 0.02,
                         "instance_id": uuid_from(r)} for i in range(nodes)]}
    blob = zlib.compress(canonical(sample).encode(), 6)
    keep = max(1, min(PLANS_KEPT, (PLANS_MIB << 20) // max(1, len(blob))))
    summary = canonical({"actions": 3, "launches": 2, "demand": {}, "actions_sha256": "0" * 64, "kinds": []})
    plans = [(f"p-{j:06d}", now - 60.0 - j * PASS_EVERY, "spot-reconciler", 1, summary, blob)
             for j in range(keep, 0, -1)]
    with store.tx() as c:
        c.executemany("INSERT INTO passes (started_at, finished_at, actor, status, summary) VALUES (?,?,?,?,?)",
                      passes)
        c.executemany("INSERT INTO plans (plan_id, at, actor, executed, summary, input) VALUES (?,?,?,?,?,?)",
                      plans)
    return {"passes": len(passes), "plans": len(plans), "plan_input_bytes": len(blob)}


_SQL = {
    "nodes": "INSERT INTO nodes (id, pool, state, action_id, instance_id, host, created_at, updated_at, reason, "
             "cordoned, idle_since, notice_deadline, notice_id, price, protected_until, protect_closed) "
             "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "actions": "INSERT INTO actions (id, plan_id, kind, pool, node, count, priority, status, reason, actor, "
               "created_at, updated_at, result, inputs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "notices": "INSERT INTO notices (id, node_id, instance_id, kind, issued_at, deadline, first_seen_at, "
               "handled_at, reason, delivered_at, pool) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "reclaims": "INSERT INTO reclaims (pool, node_id, at, kind) VALUES (?,?,?,?)",
    "transitions": "INSERT INTO transitions (node_id, from_state, to_state, at, reason, actor) VALUES (?,?,?,?,?,?)",
    "audit": "INSERT INTO audit (id, at, actor, action, target, result, inputs, prev_hash, hash) "
             "VALUES (?,?,?,?,?,?,?,?,?)",
    "outbox": "INSERT INTO outbox (kind, key, payload, created_at, delivered_at) VALUES (?,?,?,?,?)",
}


def _pruned_as_the_passes_did(store: Store, now: float) -> int:
    """What every pass's prune (``spotctl.ops.prune.prune_in_pass``, the default retention) would have left
    by ``now``: nothing due, and the walks' marks (kv ``prune.{transitions,outbox}.after``) at the last row
    before their cutoffs, so that the next pass walks only what crossed the cutoff since, as in a region that
    pruned all along. Without them the first passes on this history walk 30 days of kept rows (delivered
    audit records' outbox rows, live nodes' transitions) from the start: ``benchmarks/prune.py`` measures
    that catching-up on its own. Returns the rows deleted."""
    from spotctl.core.config import Retention
    from spotctl.ops.prune import run

    deleted, done = run(store, Retention.of(), now, resume=True)
    assert done, "the prune of the aged history did not finish"
    return sum(deleted.values())


def _insert(store: Store, table: str, rows: list) -> None:
    for i in range(0, len(rows), CHUNK):
        with store.tx() as c:
            c.executemany(_SQL[table], rows[i:i + CHUNK])


def main() -> int:
    db, nodes = Path(sys.argv[1]), int(sys.argv[2])
    days = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    t0 = time.perf_counter()
    with Store.open(db, "generated") as store:
        counts = age(store, nodes, days=days, pruned=True)
    counts["seconds"] = round(time.perf_counter() - t0, 2)  # type: ignore[assignment]
    counts["db_mib"] = round(db.stat().st_size / (1 << 20), 1)  # type: ignore[assignment]
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
