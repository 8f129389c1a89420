"""Ports: the small interfaces that adapters and the simulator implement.

``ops`` works only through these. Real adapters (``spotctl.adapters``) and the
embedded demo region (``spotctl.sim``) implement them; the two entry points
choose which, through ``spotctl.wiring``.

Errors: implementations raise :mod:`spotctl.core.errors` types only —
``CapacityError`` (no room in that pool: NoValidHost, quota), ``TemporaryError``
(retry later), ``UnavailableError`` (backend down), ``AuthError``.

Remote ports: an implementation whose calls cross the network sets the class
attribute ``remote = True`` (not a protocol member: in-process ports leave it
out). A pass reads such a port in its own thread under the observe deadline
even where the runtime reads the simulator's in-process ports inline
(``ops.observe``), and bounds its requests with :func:`spotctl.core.deadline.bounded`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .models import (
    DrainProgress,
    Exclusion,
    HostCapacity,
    HostChoice,
    Instance,
    NodeUsage,
    Notice,
    PoolSpec,
    Quota,
    RateCard,
    Reclaim,
    Reservation,
    WorkUnit,
)


class Clock(Protocol):
    """Wall time, injected. Adapters and services take one (``clock: Clock | None = None``, defaulting to
    :class:`SystemClock`) and never call ``time.time()`` themselves; the entry points hand them the
    runtime's one clock (``spotctl.wiring``). Bounds on elapsed time inside one call (a timeout, a
    cache's age) use ``time.monotonic()``, which is not the domain's time and no clock replaces."""

    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...


class SystemClock:
    def now(self) -> float:
        import time

        return time.time()


class FixedClock:
    """A clock that only moves when told to (simulations and tests)."""

    def __init__(self, t: float):
        self.t = float(t)

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@runtime_checkable
class CloudPort(Protocol):
    """The private cloud: Placement/quotas, Blazar, Nova/Ironic."""

    #: Whether ``reservations()`` reads a reservation service (Blazar) at all: False when it is
    #: disabled by configuration, so that an empty list is not taken for "no reservations".
    reads_reservations: bool

    def hosts(self, pools: dict[str, PoolSpec]) -> list[HostCapacity]:
        """Every host of every pool, with capacity, foreign usage and our node count."""
        ...

    def quota(self) -> Quota:
        """What is left of the spot project's quota."""
        ...

    def reservations(self, pools: dict[str, PoolSpec], start: float, end: float) -> list[Reservation]:
        """Committed reservations on pool hosts overlapping [start, end)."""
        ...

    def instances(self) -> list[Instance]:
        """Every instance tagged as ours in this region."""
        ...

    def find_instance(self, action_id: str) -> Instance | None:
        """The instance tagged with this action id, if it exists (idempotency)."""
        ...

    def create_instance(self, pool: PoolSpec, name: str, action_id: str,
                        choice: HostChoice | None = None) -> Instance:
        """Start a spot instance tagged with ``action_id`` and return at once, without waiting for the
        cloud's scheduler (rule 2): CapacityError when the cloud refuses it now; a refusal the cloud only
        reaches later shows as an ERROR instance with ``no_room`` in a later ``instances()``.

        ``choice`` (the plan's, :mod:`spotctl.core.hostaware`): the instance may land only on a host no
        reservation takes before ``choice.not_before``. An implementation that can make its cloud honour
        it does (CapacityError when no such host has room); one that cannot (real Nova without a
        host-targeted boot) boots as before, and the landing check of the next plans corrects."""
        ...

    def advance(self, instance: Instance) -> Instance:
        """Take the one next step of a started instance whose ``step`` is set (no wait); the instance
        as it is afterwards. An instance without a step is returned as it is."""
        ...

    def delete_instance(self, instance_id: str) -> None:
        """Delete an instance; deleting one that is already gone is not an error."""
        ...

    def released(self, instance_id: str) -> bool:
        """True once the instance is gone and its allocations are freed."""
        ...


@runtime_checkable
class ContractPort(Protocol):
    """The provider contract feed: rate card, notices and advisories."""

    #: False for a feed that cannot send notices at all (a static rate card): its pools run under
    #: the no-notice policy, said, not hidden.
    provides_notices: bool

    def rate_card(self) -> RateCard: ...

    def notices(self) -> list[Notice]:
        """Notices and advisories currently in force."""
        ...


@runtime_checkable
class ReclaimPort(Protocol):
    """The provider's reclaim API (contract term 5), which drills call to rehearse a reclaim.
    Implemented by the simulator and by the HTTP contract adapter, with this one signature."""

    def reclaim(self, instance_ids: list[str], notice_seconds: int, advisory_lead_seconds: int = 0,
                drill_id: str | None = None) -> Reclaim:
        """Reclaim these instances: a hard notice with ``notice_seconds`` of lead, preceded by an
        advisory ``advisory_lead_seconds`` earlier when > 0. One receipt per instance asked for."""
        ...


@runtime_checkable
class ProviderStatus(Protocol):
    """The provider's own view of its contract terms (a call that answers is evidence it is there)."""

    def status(self) -> dict[str, Any]: ...


@runtime_checkable
class NoticeStream(Protocol):
    """The contract feed's ordered notice log (for the fast path).

    Implemented by the HTTP contract adapter; the caller persists the cursor
    (``Store.set_value``) so nothing is missed or handled twice across passes.
    """

    def poll(self, cursor: str | None, wait: float = 0.0) -> tuple[list[Notice], str]:
        """Notices issued after ``cursor`` (long-polling up to ``wait`` s), and the next cursor."""
        ...


@runtime_checkable
class SchedulerPort(Protocol):
    """One batch scheduler (Kubernetes or Slurm)."""

    name: str

    def pending(self, pools: dict[str, PoolSpec]) -> tuple[list[WorkUnit], list[Exclusion]]:
        """Pending work that more spot nodes would serve, and what was skipped and why."""
        ...

    def usage(self) -> list[NodeUsage]:
        """What runs on each of our nodes that this scheduler knows."""
        ...

    def cordon(self, node: str, reason: str) -> None: ...

    def drain(self, node: str, reason: str, deadline: float | None, force: bool = False) -> DrainProgress:
        """One drain round, without waiting: stop new work (cordon) and ask once to move what runs
        on the node (evict / requeue). With ``force`` (the planner's call: a hard notice's deadline is
        near) delete what still cannot move, with a grace period that fits before ``deadline``.
        Returns what is left; later rounds (later passes, the watcher) continue until the node is
        empty. NotFoundError when this scheduler does not know the node."""
        ...

    def protect(self, node: str, until: float | None, closed: bool = False) -> None:
        """Hold the calendar at run time: no work that would still run at ``until`` may start on the
        node (Slurm: a maintenance reservation from ``until``, so that jobs whose time limit crosses it
        stay off; Kubernetes: the safe-until annotation, and with ``closed`` — the window left is shorter
        than the work that could land — a NoSchedule taint). ``until=None`` lifts it. Idempotent.
        NotFoundError when this scheduler does not know the node."""
        ...

    def resume(self, node: str) -> None: ...

    def forget(self, node: str, reason: str) -> None:
        """The node's instance is gone: mark it down / delete the node object."""
        ...


class Simulation(Protocol):
    """A world that moves on a virtual clock (the demo region)."""

    def advance(self, to: float) -> None: ...

    def report(self) -> dict[str, Any]: ...

    def acquire(self, now: float) -> None:
        """The region lock was just taken: bring the world up to its newest saved state, at ``now``;
        changes are saved from here on. Every change to a shared world is made under that lock."""
        ...

    def release(self) -> None:
        """The region lock is about to be released: read-only again (everything is saved already)."""
        ...


class TokenStore(Protocol):
    """Cached tokens per region and identity (``user``, ``client-ID``): private files, written atomically."""

    def load(self, region: str, who: str) -> dict[str, Any] | None: ...

    def save(self, region: str, who: str, doc: dict[str, Any]) -> Any: ...

    def delete(self, region: str, who: str) -> bool: ...

    def names(self, region: str) -> list[str]: ...


class IdentityPort(Protocol):
    """A region's OIDC provider (Keycloak): the OAuth flows, and a token's signature checked against the
    realm's published keys (:mod:`spotctl.core.identity` then checks its claims). Remote."""

    tokens: TokenStore

    def verify(self, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The header and claims of a token whose signature verifies (AuthError otherwise)."""
        ...

    def device_start(self) -> dict[str, Any]: ...

    def device_poll(self, device_code: str) -> dict[str, Any] | str:
        """The tokens, or ``authorization_pending`` / ``slow_down``."""
        ...

    def client_credentials(self, client_id: str, secret: str) -> dict[str, Any]: ...

    def refresh(self, refresh_token: str, client_id: str) -> dict[str, Any]: ...

    def logout(self, refresh_token: str, client_id: str) -> None: ...
