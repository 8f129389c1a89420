"""What every use case works with: the region, its ports, the store, a clock, an actor."""

from __future__ import annotations

import contextlib
import getpass
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from spotctl.core.actions import Plan
from spotctl.core.config import RegionConfig
from spotctl.core.errors import RefusedError
from spotctl.core.identity import Identity
from spotctl.core.plan_input import PlanInput
from spotctl.core.planner import plan as default_planner
from spotctl.core.ports import Clock, CloudPort, ContractPort, SchedulerPort, Simulation, SystemClock
from spotctl.state.store import Store

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
#: A pure planner: ``spotctl.core.planner.plan`` unless a benchmark or a what-if study swaps it for a
#: variant behind the same interface (e.g. ``spotctl.core.plan_greedy.plan``)
Planner = Callable[[PlanInput], Plan]


class LockWait(Protocol):
    """Shows a wait for the region lock (the CLI's spinner on stderr)."""

    def waiting(self, elapsed: float, timeout: float, holder: str) -> None:
        """Called at every poll while the lock is busy; ``holder`` names who holds it ('' if unknown)."""

    def done(self) -> None:
        """The wait is over (the lock was taken, or the time is up)."""


def describe_holder(holder: dict | None, now: float | None = None) -> str:
    """``pid 4242 on ctl-1: spot-reconciler pass, for 12 s`` — who holds the region lock, from its lock file."""
    if not holder or not isinstance(holder.get("pid"), int):
        return ""
    text = f"pid {holder['pid']}"
    if isinstance(holder.get("host"), str) and holder["host"] and holder["host"] != socket.gethostname():
        text += f" on {holder['host'][:64]}"
    if isinstance(holder.get("purpose"), str) and holder["purpose"]:
        text += f": {holder['purpose'][:120]}"
    since = holder.get("since")
    if isinstance(since, (int, float)) and now is not None and 0 <= now - since < 10 * 86400:
        text += f", for {now - since:.0f} s"
    return text


def lock_busy(holder: dict | None, waited: float, wait: float) -> str:
    """The message when the region lock stayed busy: who holds it (if known) and how long we waited."""
    who = describe_holder(holder, time.time())
    msg = "another pass or command holds the region lock" + (f" ({who})" if who else "")
    return msg + (f"; waited {waited:.1f} s for it" if wait > 0 else "")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bounded stretch of work (a pass, the building of a plan
    input, the planner), and put it back as it was whatever happens. A pass makes and drops objects by the
    hundred thousand (units, node rows, views) with no cycles among them to speak of; their allocations set
    the collector off again and again, and each full collection walks every object alive (at 20k nodes: about
    a tenth of the pass, for nothing found). Reference counting frees them as before; what cyclic garbage
    there is goes at the next collection after the stretch. Nothing waits inside it (no lock, no I/O wait):
    its length is the work's own."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _quiet(_: str) -> None:
    return None


def os_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass
class Runtime:
    region: RegionConfig
    store: Store
    cloud: CloudPort
    contract: ContractPort
    schedulers: list[SchedulerPort]
    clock: Clock = field(default_factory=SystemClock)
    actor: str = field(default_factory=os_actor)
    progress: Progress = _quiet
    concurrent_observe: bool = True
    backend: str = "sim"
    simulation: Simulation | None = None  # the demo region's world, moved along with the wall clock
    outlets: dict = field(default_factory=dict)  # relay destinations: "kafka", "audit" (see ops.relay)
    lock_wait: LockWait | None = None  # shows a wait for the region lock (the CLI's spinner); None: silent
    identity: Identity | None = None  # the validated login when the region has [identity] (issue 15)
    planner: Planner = default_planner  # what a pass plans with (observe.planned): the real planner by default

    def lock(self, wait: float = 0.0, purpose: str = "") -> bool:
        """Take the region's pass lock, waiting up to ``wait`` seconds for it (0: not at all); False when it
        stays busy. Then the simulated world, if any, is brought up to its newest saved state: every change
        to it is made under this lock (see :meth:`unlock`). Waiting happens before a pass or an operator
        action starts, never inside one."""
        shown = self.lock_wait if wait > 0 else None
        on_wait = None
        if shown is not None:
            def on_wait(elapsed: float) -> None:
                shown.waiting(elapsed, wait, describe_holder(self.store.lock_holder(), time.time()))
        try:
            if not self.store.try_lock(wait, purpose=purpose or self.actor, on_wait=on_wait):
                return False
        finally:
            if shown is not None:
                shown.done()
        if self.simulation is not None:
            try:
                self.simulation.acquire(self.now())
            except BaseException:
                self.store.unlock()
                raise
        return True

    def unlock(self) -> None:
        """Release the region's pass lock; the simulated world turns read-only first (already saved)."""
        try:
            if self.simulation is not None:
                self.simulation.release()
        finally:
            self.store.unlock()

    @contextlib.contextmanager
    def locked(self, wait: float = 0.0, purpose: str = "") -> Iterator[None]:
        """The region lock around an operator action: :class:`RefusedError` (exit 6) naming the holder and
        how long it waited when the lock stays busy for ``wait`` seconds."""
        t0 = time.monotonic()
        if not self.lock(wait, purpose):
            holder, waited = self.store.lock_holder(), time.monotonic() - t0
            raise RefusedError(lock_busy(holder, waited, wait), details={"holder": holder, "waited_s": round(waited, 3)},
                               hint="try again when it is done, or wait longer with --wait SECONDS")
        try:
            yield
        finally:
            self.unlock()

    def sync_world(self) -> None:
        """Bring a simulated world up to now (a no-op for real regions)."""
        if self.simulation is not None:
            self.simulation.advance(self.now())

    def now(self) -> float:
        return self.clock.now()

    def take_token(self, priority, n: int = 1) -> int:
        b = self.region.budget
        return self.store.take_tokens(n, priority, b.rate, b.burst, self.now())

    def bucket(self):
        b = self.region.budget
        return self.store.bucket(b.rate, b.burst, self.now())
