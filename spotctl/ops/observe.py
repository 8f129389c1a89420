"""Observe: read the cloud, the contract feed and the schedulers, then bring
our node records in line with what was seen.

Each source may fail; the pass goes on degraded and says which source failed.

Every source is read at once, within the pass's observe deadline
(``policy.observe_deadline_seconds``, measured on the monotonic clock): a source
that has not answered by then is degraded for this pass and not waited for. Its
thread is left to end on its own (its HTTP requests are bounded by the time left,
see :mod:`spotctl.core.deadline`) and its result, when it comes, is dropped: the
sources only return values, and only :func:`observe` applies them to the snapshot.
Ports that run in this process (the simulator's; ``remote`` not set) are read inline
and in order where the runtime asks for no concurrency (``simulate``, the demo
region): no deadline applies to them, so a simulation stays deterministic.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from spotctl.core import deadline
from spotctl.core.budget import Priority
from spotctl.core.capacity import HORIZON_SECONDS, Calendar, PoolHeadroom, also_full, forward_calendar, headroom
from spotctl.core.errors import AuthError, ConfigError, SpotctlError
from spotctl.core.models import (
    Exclusion,
    HostCapacity,
    Instance,
    Node,
    NodeState,
    NodeUsage,
    Notice,
    NoticeKind,
    PoolSpec,
    Quota,
    RateCard,
    WorkUnit,
)
from spotctl.core.plan_input import PlanInput, build_input
from spotctl.core.ports import ProviderStatus, ReclaimPort

from .runtime import Runtime

log = logging.getLogger(__name__)

RECLAIM_WINDOW = 3600


@dataclass
class Snapshot:
    now: float
    hosts: list[HostCapacity] = field(default_factory=list)
    quota: Quota = field(default_factory=Quota)
    reservations: list = field(default_factory=list)
    instances: list[Instance] | None = None
    rate_card: RateCard | None = None
    notices: list[Notice] = field(default_factory=list)
    units: list[WorkUnit] = field(default_factory=list)
    exclusions: list[Exclusion] = field(default_factory=list)
    usage: list[NodeUsage] = field(default_factory=list)
    degraded: dict[str, str] = field(default_factory=dict)  # source -> error
    auth_failed: list[str] = field(default_factory=list)  # sources that refused our credentials (exit 4)
    headroom: dict[str, PoolHeadroom] = field(default_factory=dict)
    calendars: dict[str, Calendar] = field(default_factory=dict)
    # the provider's status call (the reclaim API's evidence, see ops.contract): its body, or why there is none
    provider_status: object = None
    provider_status_error: str | None = None


@dataclass
class ObserveBudget:
    """The observe deadline of one pass: every :func:`observe` of the pass (the first, and a launch
    fallback's re-read) draws on the same seconds, so that observing never takes longer than this in all."""

    seconds: float
    spent: float = 0.0

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)


def observe(rt: Runtime, budget: ObserveBudget | None = None) -> Snapshot:
    """Read every source at once, within ``budget`` (a fresh ``policy.observe_deadline_seconds`` when
    None); a source still unanswered at the deadline is degraded for this pass."""
    started = time.monotonic()
    budget = budget or ObserveBudget(rt.region.policy.observe_deadline_seconds)
    now = rt.now()
    pools = rt.region.pools
    snap = Snapshot(now=now)

    def cloud():
        return (rt.cloud.hosts(pools), rt.cloud.quota(), rt.cloud.reservations(pools, now, now + HORIZON_SECONDS),
                rt.cloud.instances())

    def contract_rate():
        return rt.contract.rate_card()

    def contract_notices():
        return rt.contract.notices()

    # name -> (read, the port it reads)
    tasks = {"cloud": (cloud, rt.cloud), "rate_card": (contract_rate, rt.contract),
             "notices": (contract_notices, rt.contract)}
    for s in rt.schedulers:
        tasks[f"scheduler:{s.name}"] = ((lambda s=s: (s.pending(pools), s.usage())), s)
    status: dict[str, object] = {}
    if isinstance(rt.contract, ReclaimPort) and isinstance(rt.contract, ProviderStatus):
        # the reclaim API's evidence (ops.contract): read with the rest, under the same deadline
        tasks["reclaim_api"] = (rt.contract.status, rt.contract)
    if rt.concurrent_observe:
        threaded = dict(tasks)
    else:  # in-process ports inline, in order; a port that crosses the network still in a thread
        threaded = {k: v for k, v in tasks.items() if getattr(v[1], "remote", False)}
    results = _gather(tasks, threaded, snap, budget, status)
    budget.spent += time.monotonic() - started
    if results.get("cloud") is not None:
        snap.hosts, snap.quota, snap.reservations, snap.instances = results["cloud"]
    snap.rate_card = results.get("rate_card")
    snap.notices = results.get("notices") or []
    if "reclaim_api" in tasks:
        snap.provider_status = results.get("reclaim_api")
        snap.provider_status_error = status.get("reclaim_api")
    for s in rt.schedulers:
        r = results.get(f"scheduler:{s.name}")
        if r is not None:
            (units, excl), usage = r
            snap.units.extend(units)
            snap.exclusions.extend(excl)
            snap.usage.extend(usage)
    for name, pool in pools.items():
        snap.headroom[name] = headroom(pool, snap.hosts, now)
        snap.calendars[name] = forward_calendar(pool, snap.hosts, snap.reservations, now)
    rt.progress(f"observed: {len(snap.hosts)} hosts, {len(snap.units)} pending units, "
                f"{len(snap.notices)} notices" + (f"; degraded: {', '.join(sorted(snap.degraded))}" if snap.degraded else ""))
    return snap


#: Sources whose failure is evidence for a contract term, not a degraded pass (ops.contract)
_EVIDENCE_ONLY = frozenset({"reclaim_api"})


def _gather(tasks: dict, threaded: dict, snap: Snapshot, budget: ObserveBudget, status: dict) -> dict[str, object]:
    """Run ``threaded`` sources in worker threads and the others inline; wait for the threads until the
    budget is spent. A late source is degraded; its thread is not joined and its result never read."""
    results: dict[str, object] = {}
    seconds = budget.left()
    until = time.monotonic() + seconds
    futures = {name: _start(name, fn, until) for name, (fn, _) in threaded.items()}
    for name, (fn, _) in tasks.items():
        if name not in futures:
            results[name] = _outcome(fn, name, snap, status)
    if futures:
        wait(futures.values(), timeout=max(0.0, until - time.monotonic()))
    for name, fut in futures.items():
        if fut.done():
            results[name] = _outcome(fut.result, name, snap, status)
            continue
        why = (f"no answer within the pass's observe deadline ({budget.seconds:g} s"
               + (f", {seconds:.3g} s of it left" if seconds < budget.seconds else "") + "); not waited for")
        log.warning("source %s: %s", name, why)
        (status if name in _EVIDENCE_ONLY else snap.degraded)[name] = why
    snap.degraded = {k: snap.degraded[k] for k in tasks if k in snap.degraded}  # in source order, always
    return results


def _start(name: str, fn, until: float) -> Future:
    """Run one source in a daemon thread, its network calls bounded by the time left (core.deadline).

    Not a ThreadPoolExecutor: its workers are joined when the interpreter exits, even after
    ``shutdown(wait=False)``, so one stuck source would hold the process (and the timer's next pass)
    after the pass itself had moved on. A daemon thread ends with the process."""
    fut: Future = Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            with deadline.until(until):
                fut.set_result(fn())
        except BaseException as e:  # handed to observe() through the future, like the executor does
            fut.set_exception(e)

    threading.Thread(target=run, name=f"observe-{name}", daemon=True).start()
    return fut


def _outcome(fn, name: str, snap: Snapshot, status: dict):
    try:
        return fn()
    except ConfigError:
        raise  # a misconfigured source is not an outage: stop with exit 3 and say what to fix
    except SpotctlError as e:
        log.warning("source %s unavailable: %s", name, e.message)
        why = e.message
        if isinstance(e, AuthError) and name not in _EVIDENCE_ONLY:
            snap.auth_failed.append(name)
    except Exception as e:  # an adapter bug must not stop the other sources
        log.exception("source %s failed", name)
        why = f"{type(e).__name__}: {e}"
    (status if name in _EVIDENCE_ONLY else snap.degraded)[name] = why
    return None


def sync_nodes(rt: Runtime, snap: Snapshot) -> tuple[dict[str, int], list[Node]]:
    """Bring node records in line with the cloud; adopt tagged strangers; attach notices.

    Returns counts of what changed, and the live nodes afterwards.
    """
    # Observe first, then write, then tell: no network call inside the write transaction (a slow
    # cloud or scheduler must not hold the database's write lock).
    released = _check_released(rt, snap)
    with rt.store.tx():  # one transaction: cheap when nothing changed, atomic when something did
        changed, live, vanished, steps = _sync_nodes(rt, snap, released)
    for node in vanished:
        _forget(rt, node)
    if steps:
        changed["advanced"] = _advance(rt, steps)
    return changed, live


def _check_released(rt: Runtime, snap: Snapshot) -> dict[str, bool]:
    """Instance id -> allocations freed, for the deleting/failed nodes the cloud no longer lists."""
    if snap.instances is None:
        return {}
    listed = {i.action_id for i in snap.instances}
    return {n.instance_id: _released(rt, n.instance_id)
            for n in rt.store.nodes(states=(NodeState.DELETING, NodeState.FAILED))
            if n.instance_id and n.action_id not in listed}


def _sync_nodes(rt: Runtime, snap: Snapshot,
                released: dict[str, bool]) -> tuple[dict[str, int], list[Node], list[Node],
                                                    list[tuple[Node, Instance]]]:
    store, now, actor = rt.store, snap.now, rt.actor
    vanished: list[Node] = []  # gone or lost: the schedulers forget them after the transaction
    steps: list[tuple[Node, Instance]] = []  # building instances that need one call to go on, made after the transaction
    changed = {"adopted": 0, "active": 0, "failed": 0, "lost": 0, "gone": 0, "noticed": 0, "advanced": 0}
    # live nodes, and failed ones whose instance may still exist (an ERROR server): the planner deletes those
    nodes = store.nodes(live_only=True) + [n for n in store.nodes(states=(NodeState.FAILED,)) if n.instance_id]
    adopted: list[Node] = []
    by_action = {n.action_id: n for n in nodes}
    hard: dict[str, Notice] = {}
    for nt in snap.notices:
        if nt.kind is NoticeKind.HARD:
            hard.setdefault(nt.instance_id, nt)
    if snap.instances is not None:
        seen = {i.action_id: i for i in snap.instances}
        for node in nodes:
            inst = seen.get(node.action_id)
            with store.tx():
                if inst is None:
                    if node.state is NodeState.INTENDED:
                        continue  # act() resumes it
                    if node.state is NodeState.DELETING or node.state is NodeState.FAILED:
                        if node.instance_id and not released.get(node.instance_id, False):
                            continue  # gone from the list, allocations not yet freed: check next pass
                        store.transition(node, NodeState.GONE, reason="instance deleted and its allocations freed",
                                         at=now, actor=actor)
                        changed["gone"] += 1
                    elif node.notice_id and node.notice_deadline is not None:
                        store.transition(node, NodeState.GONE, reason=f"reclaimed after notice {node.notice_id}",
                                         at=now, actor=actor)
                        changed["gone"] += 1
                    else:
                        store.transition(node, NodeState.LOST, reason="instance vanished without notice",
                                         at=now, actor=actor)
                        store.audit(actor=actor, action="node.lost", target=node.id, result="lost",
                                    inputs={"pool": node.pool, "instance_id": node.instance_id}, at=now)
                        changed["lost"] += 1
                    vanished.append(node)
                    continue
                if node.state is NodeState.INTENDED:
                    store.transition(node, NodeState.BUILDING, reason="instance found by its action tag",
                                     at=now, actor=actor, instance_id=inst.id, host=inst.host)
                elif node.state is NodeState.BUILDING and (inst.id, inst.host) != (node.instance_id, node.host):
                    store.update_node(node, instance_id=inst.id, host=inst.host)  # e.g. an Ironic claim got its node
                if inst.status == "ACTIVE" and node.state is NodeState.BUILDING:
                    store.transition(node, NodeState.ACTIVE, reason="instance active", at=now, actor=actor,
                                     instance_id=inst.id, host=inst.host, idle_since=now)
                    if node.cordoned:  # cordoned for an advisory while it was building: advised now
                        store.transition(node, NodeState.ADVISED, reason="cordoned for an advisory while building",
                                         at=now, actor=actor)
                    changed["active"] += 1
                elif inst.status == "ERROR" and node.state in (NodeState.BUILDING,):
                    _build_failed(rt, node, inst, now)
                    changed["failed"] += 1
                elif inst.step and node.state is NodeState.BUILDING:
                    steps.append((node, inst))
                nt = hard.get(inst.id)
                if nt is not None and node.notice_id != nt.id:
                    store.update_node(node, notice_id=nt.id, notice_deadline=nt.deadline)
                    changed["noticed"] += 1
        for inst in snap.instances:
            if inst.action_id in by_action:
                continue
            if store.find_node(inst.name) is not None:
                continue
            pool = rt.region.pools.get(inst.pool)
            if pool is None:
                log.warning("tagged instance %s names unknown pool %s; left alone", inst.id, inst.pool)
                continue
            node = Node(id=inst.name, pool=inst.pool, state=NodeState.INTENDED, action_id=inst.action_id,
                        created_at=inst.created_at or now, updated_at=now, instance_id=inst.id, host=inst.host,
                        reason="adopted: tagged instance unknown to the state store")
            with store.tx():
                store.add_node(node, actor=actor, reason=node.reason)
                store.transition(node, NodeState.BUILDING if inst.status != "ACTIVE" else NodeState.ACTIVE,
                                 reason="adopted", at=now, actor=actor)
                store.audit(actor=actor, action="node.adopt", target=node.id, result="ok",
                            inputs={"instance_id": inst.id, "pool": inst.pool}, at=now)
            changed["adopted"] += 1
            adopted.append(node)
    by_instance = {n.instance_id: n for n in nodes if n.instance_id}
    for nt in snap.notices:
        node = by_instance.get(nt.instance_id)
        new = store.see_notice(notice_id=nt.id, node_id=node.id if node else None, instance_id=nt.instance_id,
                               kind=str(nt.kind), issued_at=nt.issued_at, deadline=nt.deadline, reason=nt.reason,
                               at=now, delivered_at=nt.delivered_at, pool=nt.pool or (node.pool if node else None))
        if new and node is not None:
            notice_event(store, nt, node, now)
    return changed, sorted((n for n in nodes + adopted if _plannable(n)), key=lambda n: n.id), vanished, steps


def _plannable(n: Node) -> bool:
    """A node the planner acts on: live, or failed with an instance to delete."""
    return n.live or (n.state is NodeState.FAILED and bool(n.instance_id))


def _build_failed(rt: Runtime, node: Node, inst: Instance, now: float) -> None:
    """The cloud gave up building the node's instance. For want of room (NoValidHost, no free node) the
    pool is remembered as full, as when the create itself is refused, and the planner falls back."""
    store = rt.store
    why = inst.fault or "no reason given"
    store.transition(node, NodeState.FAILED, reason=f"instance in ERROR: {why}", at=now, actor=rt.actor)
    pool = rt.region.pools.get(node.pool)
    if inst.no_room and pool is not None:
        remember_full(rt, pool, why, now)
    store.audit(actor=rt.actor, action="node.build", target=node.id, result="failed",
                inputs={"pool": node.pool, "instance_id": inst.id, "fault": why, "no_room": inst.no_room,
                        "action_id": node.action_id}, at=now)


def remember_full(rt: Runtime, pool: PoolSpec, why: str, now: float) -> None:
    """Remember a pool as full for ``failure_ttl_seconds``, with the larger pools on the same hosts."""
    until = now + rt.region.policy.failure_ttl_seconds
    for name in also_full(pool, rt.region.pools):
        rt.store.remember_failure(name, until, why if name == pool.name else f"{why} (in pool {pool.name})", now)


def _advance(rt: Runtime, steps: list[tuple[Node, Instance]]) -> int:
    """Take the next step of each instance that waits for one (an Ironic deploy), one call each, a token each."""
    done = 0
    for node, inst in steps:
        if not rt.take_token(Priority.LAUNCH):
            break  # the next pass takes it
        try:
            rt.cloud.advance(inst)
            result, extra = "ok", {}
        except SpotctlError as e:
            result, extra = "failed", {"error": e.message}
            log.warning("could not %s %s: %s", inst.step, inst.id, e.message)
        done += result == "ok"
        with rt.store.tx():
            rt.store.audit(actor=rt.actor, action=f"node.{inst.step}", target=node.id, result=result,
                           inputs={"pool": node.pool, "instance_id": inst.id, "action_id": node.action_id, **extra},
                           at=rt.now())
    return done


def notice_event(store, nt: Notice, node: Node, at: float) -> None:
    """Announce a notice, advisory or calendar reclaim on one of our nodes (keyed by the node)."""
    store.cloud_event(f"io.spotctl.notice.{nt.kind.value}", node.id, {
        "notice": nt.id, "node": node.id, "pool": node.pool, "instance_id": nt.instance_id, "kind": nt.kind.value,
        "issued_at": nt.issued_at, "deadline": nt.deadline, "delivered_at": nt.delivered_at, "reason": nt.reason,
        "seen_at": at}, at)


def _released(rt: Runtime, instance_id: str) -> bool:
    try:
        return rt.cloud.released(instance_id)
    except SpotctlError:
        return False


def _forget(rt: Runtime, node: Node) -> None:
    for s in rt.schedulers:
        try:
            s.forget(node.id, node.reason)
        except SpotctlError as e:
            log.info("scheduler %s could not forget %s: %s", s.name, node.id, e.message)


def plan_input(rt: Runtime, snap: Snapshot, nodes: list[Node] | None = None,
               no_notice: frozenset[str] | None = None) -> PlanInput:
    """The planner's input from a snapshot; ``nodes`` saves a reload when the caller has them.

    ``no_notice``: pools whose provider contract is not met (see ops.contract); they plan under the
    no-notice policy.
    """
    now = snap.now
    excluded: dict[str, int] = {}
    for e in snap.exclusions:
        excluded[e.reason] = excluded.get(e.reason, 0) + 1
    # No notices (feed down, or no contract feed configured): every pool runs under the no-notice policy.
    if no_notice is None:
        without_notices = "notices" in snap.degraded or not rt.contract.provides_notices
        no_notice = frozenset(rt.region.pools) if without_notices else frozenset()
    return build_input(
        region=rt.region.name, now=now, pools=rt.region.pools, policy=rt.region.policy,
        headroom=snap.headroom, calendars=snap.calendars, quota=snap.quota,
        rate_card=snap.rate_card, nodes=nodes if nodes is not None else [
            n for n in rt.store.nodes(live_only=True) + rt.store.nodes(states=(NodeState.FAILED,))
            if _plannable(n)],
        usage=snap.usage, notices=snap.notices,
        units=snap.units, excluded=excluded, recent_reclaims=rt.store.recent_reclaims(now - RECLAIM_WINDOW),
        pool_failures=rt.store.pool_failures(now), budget=rt.bucket(), no_notice_pools=no_notice,
        exclusions=snap.exclusions, host_reclaims=host_reclaims(rt, snap),
        usage_unread=frozenset({k.split(":", 1)[1] for k in snap.degraded if k.startswith("scheduler:")}
                               | ({"kubernetes", "slurm"} - {s.name for s in rt.schedulers})),
    )


def host_reclaims(rt: Runtime, snap: Snapshot) -> dict[str, float]:
    """When a reservation takes each host back from the spot pool (lease start minus cleaning time)."""
    out: dict[str, float] = {}
    for r in snap.reservations:
        pool = rt.region.pools.get(r.pool)
        at = r.start - (pool.cleaning_seconds if pool else 0)
        for h in r.hosts:
            if r.end > snap.now and (h not in out or at < out[h]):
                out[h] = max(at, snap.now)
    return out
