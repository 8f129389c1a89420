"""One reconcile pass: load → observe → plan (pure) → act → persist.

Used by ``spot-reconciler`` (the systemd timer's job) and ``spotctl reconcile``. Each phase logs its
time at info (``spotctl -v``), with what it observed, planned and did (see :mod:`.observe`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from spotctl.core.actions import Action, Plan
from spotctl.core.models import OutcomeStatus

from . import contract
from .act import Outcome, execute, execute_drains, resume
from .metrics import record_pass_view
from .observe import ObserveBudget, Snapshot, observe, plan_input, planned
from .prune import prune_in_pass
from .relay import DESTINATIONS
from .relay import relay as relay_outbox
from .runtime import Runtime, collector_paused, lock_busy
from .sync import sync_nodes

log = logging.getLogger(__name__)

MAX_FALLBACK_ROUNDS = 3


@dataclass
class PassResult:
    status: str  # ok | partial | skipped | dry-run
    region: str
    started_at: float
    plan: Plan | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    degraded: dict[str, str] = field(default_factory=dict)
    auth_failed: list[str] = field(default_factory=list)  # sources that refused our credentials
    synced: dict[str, int] = field(default_factory=dict)
    tokens_used: int = 0
    tokens_left: float = 0.0
    duration_s: float = 0.0
    message: str = ""
    contract_changes: list[dict] = field(default_factory=list)
    relay: dict | None = None  # outbox kind -> what the relay delivered and what stays queued
    pruned: dict[str, int] = field(default_factory=dict)  # table -> rows the prune after the pass deleted

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "region": self.region,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 4),
            "message": self.message,
            "plan": self.plan.to_dict() if self.plan else None,
            "outcomes": [o.to_dict() for o in self.outcomes],
            "degraded": self.degraded,
            "auth_failed": self.auth_failed,
            "synced": self.synced,
            "budget": {"tokens_used": self.tokens_used, "tokens_left": round(self.tokens_left, 3)},
            "contract_changes": self.contract_changes,
            "relay": self.relay,
            "pruned": self.pruned,
        }


def run_pass(rt: Runtime, *, dry_run: bool = False, wait: float = 0.0) -> PassResult:
    """One pass under the region lock. When another pass or command holds it, wait up to ``wait`` seconds
    (the timer does not: 0), then skip: that one does the work. The cyclic collector is paused for the pass
    (``runtime.collector_paused``), and its commits leave the write-ahead log to one checkpoint at its end
    (``StoreBase.checkpoints_deferred``)."""
    with collector_paused(), rt.store.checkpoints_deferred():
        return _run_pass(rt, dry_run=dry_run, wait=wait)


def _run_pass(rt: Runtime, *, dry_run: bool = False, wait: float = 0.0) -> PassResult:
    result = PassResult(status="ok", region=rt.region.name, started_at=rt.now())
    waited = time.monotonic()
    if not rt.lock(wait, f"reconcile pass{' (dry run)' if dry_run else ''}, by {rt.actor}"):
        result.status = "skipped"
        result.message = lock_busy(rt.store.lock_holder(), time.monotonic() - waited, wait) + "; skipped"
        rt.progress(result.message)
        return result
    t0 = lap = time.perf_counter()
    log.info("pass: region lock taken after %.1f ms", (time.monotonic() - waited) * 1000)
    now = result.started_at = rt.now()  # after any wait for the lock
    seq = None
    rt.store.started_pass = None
    try:
        used_before = rt.store.tokens_used_total()
        seq = None if dry_run else rt.store.start_pass(rt.actor, now)
        if not dry_run:
            result.outcomes.extend(resume(rt))
            lap = _lap("resume half-done actions", lap)
        # one observe deadline for the pass: the sources are read at once, a late one is degraded
        budget = ObserveBudget(rt.region.policy.observe_deadline_seconds)
        snap = observe(rt, budget)
        lap = _lap("observe", lap)
        result.degraded = dict(snap.degraded)
        result.auth_failed = list(snap.auth_failed)
        nodes = None
        conformance = contract.evaluate(rt, snap)
        if not dry_run:
            result.synced, nodes = sync_nodes(rt, snap)
            result.contract_changes = contract.record_changes(rt, conformance)
            record_pass_view(rt, snap, conformance)
            _record_history(rt, snap)
        lap = _lap("contract" if dry_run else "contract and node records", lap)
        inp = plan_input(rt, snap, nodes, no_notice=contract.degraded_pools(conformance))
        plan = planned(inp, rt.planner)
        lap = _lap("plan", lap)
        result.plan = plan
        rt.progress(f"plan {plan.id}: {len(plan.actions)} actions")
        if dry_run:
            result.status = "dry-run"
        else:
            rt.store.record_plan(plan_id=plan.id, at=now, actor=rt.actor, executed=True,
                                 summary={"actions": len(plan.actions), "launches": plan.launches(),
                                          "demand": plan.demand, "actions_sha256": plan.actions_digest(),
                                          "kinds": [a.kind for a in plan.actions]},
                                 plan_input=inp.recorded_json())
            result.outcomes.extend(_act(rt, plan, snap, inp.no_notice_pools, budget))
            lap = _lap(f"act ({len(result.outcomes)} outcomes)", lap)
    except BaseException as e:  # an error or an interrupt: the pass row says so, not "running" for good
        # (an interrupt right after the row was committed, before start_pass returned: the store knows it)
        _abandon(rt, seq if seq is not None else rt.store.started_pass, e, result)
        raise
    finally:
        rt.unlock()
    try:
        if not dry_run:
            # after the pass lock is released: a slow or unreachable destination holds up no pass or watcher
            result.relay = _relay(rt, result)
            _lap("relay", lap)
        if result.degraded or any(o.status in ("failed", "partial") and not _fell_back(o, result)
                                  for o in result.outcomes):
            if result.status == "ok":
                result.status = "partial"
        result.tokens_used = rt.store.tokens_used_total() - used_before
        result.tokens_left = rt.bucket().tokens
        result.duration_s = time.perf_counter() - t0
        if seq is not None:
            rt.store.finish_pass(seq, result.status, {
                "actions": len(plan.actions), "outcomes": [o.to_dict() for o in result.outcomes],
                "degraded": result.degraded, "tokens_used": result.tokens_used}, rt.now(), duration=result.duration_s)
    except BaseException as e:  # interrupted while relaying or recording the end: not "running" for good
        _abandon(rt, seq, e, result)
        raise
    result.pruned = prune_in_pass(rt, seq).get("rows", {})  # what the retention lets go, in its time budget
    log.info("pass%s: ended %s in %.1f ms, %d tokens used, %.1f left", f" {seq}" if seq is not None else "", result.status,
             result.duration_s * 1000, result.tokens_used, result.tokens_left)
    return result


def _abandon(rt: Runtime, seq: int | None, e: BaseException, result: PassResult) -> None:
    """Record the end of a pass that an error or an interrupt stopped (the row of a pass already finished is
    left as it is); a store that fails here leaves the row to the next pass, which closes it as abandoned."""
    if seq is None:
        return
    try:
        rt.store.finish_pass(seq, "failed" if isinstance(e, Exception) else "interrupted",
                             {"error": f"{type(e).__name__}: {e}"[:500],
                              "outcomes": [o.to_dict() for o in result.outcomes]}, rt.now(), only_running=True)
    except Exception:
        log.exception("could not record the end of pass %s", seq)


def _lap(phase: str, since: float) -> float:
    """Log how long a phase of the pass took (-v); the time it ended."""
    now = time.perf_counter()
    log.info("pass: %s in %.1f ms", phase, (now - since) * 1000)
    return now


def _relay(rt: Runtime, result: PassResult) -> dict:
    """Outbox → Kafka and the audit service; a configured destination that is down, or that ran in a weaker
    delivery mode than configured (Kafka without transactions), makes the pass partial."""
    configured = {dest for dest in DESTINATIONS.values() if rt.region.section(dest) is not None}
    with rt.store.relay_lock() as mine:
        if not mine:  # it delivers the same rows; this pass's rows go with them or with the next pass
            rt.progress("relay: another process is relaying this region's outbox; left to it")
            return {}
        report = relay_outbox(rt.store, rt.outlets, now=rt.now, configured=configured)
    for dest, why in report.failed.items():
        result.degraded[f"relay.{dest}"] = why
    for dest, why in report.degraded.items():  # e.g. Kafka without transactions: delivered, but weaker
        result.degraded[f"relay.{dest}.mode"] = why
    return report.to_dict()


def _fell_back(o: Outcome, result: PassResult) -> bool:
    """A launch refused for capacity whose demand another pool took is not a failure of the pass."""
    return o.kind == "launch" and o.status == "failed" and any(
        x.kind == "launch" and x.status == "ok" and x.pool != o.pool and x is not o for x in result.outcomes)


def _act(rt: Runtime, plan: Plan, snap: Snapshot, no_notice: frozenset[str],
         budget: ObserveBudget | None = None) -> list[Outcome]:
    outcomes: list[Outcome] = []
    current = plan
    replaced: set[str] = set()  # nodes whose consolidation move launched its new node (only then is it drained)
    for round_ in range(MAX_FALLBACK_ROUNDS + 1):
        failed_pools = []
        # a fallback round launches for demand only: a consolidation move is its launch and its drain, in one plan
        actions = [a for a in current.actions if round_ == 0 or (a.kind == "launch" and "consolidation" not in a.inputs)]
        i = 0
        while i < len(actions):
            action = actions[i]
            if action.kind == "drain":
                # a run of drains (a reclaim storm) goes at once: every node cordoned within seconds
                j = i
                while j < len(actions) and actions[j].kind == "drain":
                    j += 1
                run = []
                for a in actions[i:j]:
                    if _move(a) and a.node not in replaced:  # its new node was not made: the work stays
                        outcomes.append(Outcome(a.id, "drain", OutcomeStatus.SKIPPED, "consolidation move: its new node "
                                                "was not launched, so the node is not drained", pool=a.pool, node=a.node))
                    else:
                        run.append(a)
                if run:
                    outcomes.extend(execute_drains(rt, run, current.id))
                i = j
                continue
            i += 1
            out = execute(rt, action, current.id)
            outcomes.append(out)
            if _move(action) and out.done >= 1:
                replaced.add(action.inputs["consolidation"]["node"])
            if action.kind == "launch" and out.status in ("failed", "partial") and out.done < (action.count or 0) \
                    and "token budget" not in out.detail:
                failed_pools.append(action.pool)
        if not failed_pools:
            break
        # Fall back to the next pool in the same pass: re-plan with the failure remembered. The re-read
        # draws on what is left of the pass's observe deadline (a source still late: no fallback launch).
        rt.progress(f"launch failed in {', '.join(p or '?' for p in failed_pools)}: re-planning without it")
        snap = observe(rt, budget)
        current = planned(plan_input(rt, snap, no_notice=no_notice), rt.planner)
        if not any(a.kind == "launch" for a in current.actions):
            break
    return outcomes


def _move(a: Action) -> bool:
    """Whether ``a`` is half of a consolidation move (the launch of the new node, or the drain of the old)."""
    info = a.inputs.get("consolidation")
    return isinstance(info, dict) and info.get("kind") == "move"


def _record_history(rt: Runtime, snap: Snapshot) -> None:
    """What `spotctl report` reads and no other row keeps (:mod:`spotctl.state.history`): the prices this
    pass saw (a row per change) and the pending units' waits (a scheduler not read ends none)."""
    from spotctl.state import history

    if snap.rate_card is not None:
        history.record_prices(rt.store, snap.rate_card.prices, snap.rate_card.currency, snap.now)
        history.record_rate_card_tick(rt.store, snap.rate_card.version, snap.rate_card.prices, snap.now)
    read = {s.name for s in rt.schedulers if f"scheduler:{s.name}" not in snap.degraded}
    # units come only from the schedulers read: with none degraded, all are kept as they are (no copy of 1M)
    units = snap.units if len(read) == len(rt.schedulers) else [u for u in snap.units if u.scheduler in read]
    history.record_waits(rt.store, units, read, snap.now)
