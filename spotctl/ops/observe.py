"""Observe: read the cloud, the contract feed and the schedulers into one snapshot
(``ops.sync`` then brings our node records in line with it).

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

Logged (``spotctl -v``, info): what each source returned and how long it took, the observe phase's
time, and the planner's input and output (:func:`plan_input`, :func:`planned`); ``-vv`` (debug):
each pool's headroom and each planned action.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from spotctl.core import deadline
from spotctl.core.actions import Plan
from spotctl.core.capacity import HORIZON_SECONDS, Calendar, PoolHeadroom, forward_calendar, headroom
from spotctl.core.errors import AuthError, ConfigError, SpotctlError
from spotctl.core.hostaware import reclaims_by_host
from spotctl.core.lifecycle import plannable
from spotctl.core.models import (
    Exclusion,
    HostCapacity,
    Instance,
    Node,
    NodeState,
    NodeUsage,
    Notice,
    PoolSpec,
    Quota,
    RateCard,
    WorkUnit,
)
from spotctl.core.plan_input import PlanInput, build_input
from spotctl.core.planner import plan as make_plan
from spotctl.core.ports import ProviderStatus, ReclaimPort, SchedulerPort

from .runtime import Runtime, collector_paused

log = logging.getLogger(__name__)

# a source the pass reads: the read, and the port it reads (for `remote`)
Task = tuple[Callable[[], Any], object]

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
    tasks: dict[str, Task] = {"cloud": (cloud, rt.cloud), "rate_card": (contract_rate, rt.contract),
             "notices": (contract_notices, rt.contract)}
    for s in rt.schedulers:
        tasks[f"scheduler:{s.name}"] = (functools.partial(_read_scheduler, s, pools), s)
    status: dict[str, object] = {}
    if isinstance(rt.contract, ReclaimPort) and isinstance(rt.contract, ProviderStatus):
        # the reclaim API's evidence (ops.contract): read with the rest, under the same deadline
        tasks["reclaim_api"] = (rt.contract.status, rt.contract)
    took: dict[str, float] = {}  # source -> seconds it took (a source past the deadline has none)
    tasks = {name: (_timed(fn, name, took), port) for name, (fn, port) in tasks.items()}
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
        error = status.get("reclaim_api")
        snap.provider_status_error = None if error is None else str(error)
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
    _log_sources(tasks, results, took, snap, status, time.monotonic() - started)
    for name, h in snap.headroom.items():
        log.debug("pool %s: %d hosts, room for %d spot nodes (%d of them ours), %d more fit now", name, h.hosts,
                  h.capacity, h.ours, h.free)
    rt.progress(f"observed: {len(snap.hosts)} hosts, {len(snap.units)} pending units, "
                f"{len(snap.notices)} notices" + (f"; degraded: {', '.join(sorted(snap.degraded))}" if snap.degraded else ""))
    return snap


#: Sources whose failure is evidence for a contract term, not a degraded pass (ops.contract)
_EVIDENCE_ONLY = frozenset({"reclaim_api"})


def _timed(fn: Callable[[], Any], name: str, took: dict[str, float]) -> Callable[[], Any]:
    """``fn``, recording in ``took[name]`` how long it ran (the -v log says it)."""

    def run() -> Any:
        t = time.monotonic()
        try:
            return fn()
        finally:
            took[name] = time.monotonic() - t

    return run


def _said(name: str, result: Any) -> str:
    """What a source returned, in counts (the -v log's words)."""
    if name == "cloud":
        hosts, _quota, reservations, instances = result
        return (f"{len(hosts)} hosts, {len(instances or [])} instances, {len(reservations)} reservations in the "
                f"next {HORIZON_SECONDS / 3600:g} h")
    if name == "rate_card":
        return "no rate card" if result is None else f"rate card {result.version}, {len(result.prices)} pool prices"
    if name == "notices":
        return f"{len(result)} notices" + (f" ({_by(str(n.kind) for n in result)})" if result else "")
    if name.startswith("scheduler:"):
        (units, excluded), usage = result
        return f"{len(units)} pending units, {len(excluded)} not counted as demand, {len(usage)} of our nodes in use"
    if name == "reclaim_api":
        return "status call answered"
    return "read"


def _by(names: Iterable[str]) -> str:
    """Counts by name, for a log line: ``12 cordon, 2 launch``."""
    return ", ".join(f"{n} {k}" for k, n in sorted(Counter(names).items()))


def _log_sources(tasks: dict[str, Task], results: dict[str, Any], took: dict[str, float], snap: Snapshot,
                 status: dict[str, object], elapsed: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    for name in tasks:
        ms = f"{took[name] * 1000:.1f} ms" if name in took else "no answer"
        why = snap.degraded.get(name, status.get(name))
        if why is not None or results.get(name) is None and name != "rate_card":
            log.info("source %s: not read (%s), %s", name, why or "no result", ms)
        else:
            log.info("source %s: %s, %s", name, _said(name, results[name]), ms)
    log.info("observe: %d sources in %.1f ms%s", len(tasks), elapsed * 1000,
             f", degraded: {', '.join(snap.degraded)}" if snap.degraded else "")


def _read_scheduler(s: SchedulerPort, pools: dict[str, PoolSpec]) -> tuple[tuple[list[WorkUnit], list[Exclusion]],
                                                                          list[NodeUsage]]:
    return s.pending(pools), s.usage()


def _gather(tasks: dict[str, Task], threaded: dict[str, Task], snap: Snapshot, budget: ObserveBudget,
            status: dict[str, object]) -> dict[str, Any]:
    """Run ``threaded`` sources in worker threads and the others inline; wait for the threads until the
    budget is spent. A late source is degraded; its thread is not joined and its result never read."""
    results: dict[str, Any] = {}
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
    if nodes is None:
        nodes = [n for n in rt.store.nodes(live_only=True) + rt.store.nodes(states=(NodeState.FAILED,))
                 if plannable(n)]
    reclaims, failures = rt.store.recent_reclaims(now - RECLAIM_WINDOW), rt.store.pool_failures(now)
    bucket, hosts = rt.bucket(), host_reclaims(rt, snap)
    previous = None  # the rate card before this one: consolidation's second tick (only read when it is on)
    if snap.rate_card is not None and rt.region.policy.consolidation_min_saving_pct > 0:
        from spotctl.state import history

        previous = history.previous_rate_card(rt.store, snap.rate_card.version)
    with collector_paused():  # while the input is built (pure CPU, read already): see planned()
        inp = build_input(
            region=rt.region.name, now=now, pools=rt.region.pools, policy=rt.region.policy,
            headroom=snap.headroom, calendars=snap.calendars, quota=snap.quota, rate_card=snap.rate_card,
            nodes=nodes, usage=snap.usage, notices=snap.notices, units=snap.units, excluded=excluded,
            recent_reclaims=reclaims, pool_failures=failures, budget=bucket, no_notice_pools=no_notice,
            exclusions=snap.exclusions, host_reclaims=hosts,
            usage_unread=frozenset({k.split(":", 1)[1] for k in snap.degraded if k.startswith("scheduler:")}
                                   | ({"kubernetes", "slurm"} - {s.name for s in rt.schedulers})),
            previous_rate_card=previous,
        )
    log.info("plan input: %d of our nodes, %d demand classes, %d units not counted as demand%s; no-notice "
             "pools: %s; budget %.1f tokens", len(inp.nodes), len(inp.demand), sum(excluded.values()),
             f" ({', '.join(f'{k}: {v}' for k, v in sorted(excluded.items()))})" if excluded else "",
             ", ".join(sorted(inp.no_notice_pools)) or "none", inp.budget.tokens)
    return inp


def planned(inp: PlanInput, planner: Callable[[PlanInput], Plan] | None = None) -> Plan:
    """The pure planner on ``inp`` (``planner``, a variant behind the same interface: the runtime's
    ``Runtime.planner``; None: spotctl's planner), its result logged: the actions by kind and the planner's
    time (-v), and each action with its reason (-vv)."""
    # The planner is pure CPU over small objects made and dropped by the hundred thousand, with no cycles
    # among them to speak of; the cyclic collector, set off by those allocations, rescans the whole heap
    # (the snapshot, the plan input) again and again: a third of the planner's time at 100k units, for
    # nothing found. It is paused while the planner runs (nothing waits there: no I/O, no lock) and put
    # back as it was whatever happens (runtime.collector_paused; a pass pauses it throughout); what little
    # cyclic garbage there is goes at the next collection. benchmarks/planner.py times the planner through this.
    t = time.perf_counter()
    with collector_paused():
        p = (planner or make_plan)(inp)
    log.info("plan %s: %d actions%s, planned in %.1f ms", p.id, len(p.actions),
             f" ({_by(str(a.kind) for a in p.actions)})" if p.actions else "", (time.perf_counter() - t) * 1000)
    for a in p.actions:
        log.debug("action %s %s%s%s%s: %s", a.id, a.kind, f" pool {a.pool}" if a.pool else "",
                  f" node {a.node}" if a.node else "", f" count {a.count}" if a.count else "", a.reason)
    return p


def host_reclaims(rt: Runtime, snap: Snapshot) -> dict[str, float]:
    """When a reservation takes each host back from the spot pool (lease start minus cleaning time)."""
    return reclaims_by_host(snap.reservations, rt.region.pools, snap.now)
