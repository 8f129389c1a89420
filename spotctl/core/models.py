"""Domain models: plain, immutable where possible, stdlib only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T")


@overload
def frozen(cls: type[_T], /) -> type[_T]: ...
@overload
def frozen(*, order: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True)
def frozen(cls: type[_T] | None = None, /, *, order: bool = False) -> Any:
    """A frozen dataclass to the type checker (mypy refuses an assignment to any field, as for
    ``@dataclass(frozen=True)``), made at run time with plain slots. CPython's frozen ``__init__`` sets each
    field through ``object.__setattr__``: three times the cost of a plain one (a 17-field view of a node: 6.8 µs
    against 2.1 µs), and a pass makes these per node, per scheduler and per unit. Compared and hashed by its
    fields, as a frozen dataclass is (``unsafe_hash``)."""

    def make(c: type[_T]) -> type[_T]:
        return dataclass(slots=True, unsafe_hash=True, order=order)(c)

    return make if cls is None else make(cls)


@frozen(order=True)
class Shape:
    """A resource vector: what a node offers or a unit of work asks for."""

    vcpu: int = 0
    ram_mb: int = 0
    gpus: int = 0

    def fits_in(self, other: "Shape") -> bool:
        return self.vcpu <= other.vcpu and self.ram_mb <= other.ram_mb and self.gpus <= other.gpus

    def __add__(self, o: "Shape") -> "Shape":
        return Shape(self.vcpu + o.vcpu, self.ram_mb + o.ram_mb, self.gpus + o.gpus)

    def __sub__(self, o: "Shape") -> "Shape":
        return Shape(self.vcpu - o.vcpu, self.ram_mb - o.ram_mb, self.gpus - o.gpus)

    def times(self, n: int) -> "Shape":
        return Shape(self.vcpu * n, self.ram_mb * n, self.gpus * n)

    def count_in(self, room: "Shape") -> int:
        """How many of this shape fit in ``room`` (per dimension, whole units; a dimension this shape does not
        ask for counts only when the room is short of it: then none fits). No list per call: it runs for every
        host of every pool in each pass's headroom."""
        best = -1  # no dimension asked for yet
        for need, have in ((self.vcpu, room.vcpu), (self.ram_mb, room.ram_mb), (self.gpus, room.gpus)):
            if need > 0:
                n = have // need if have > 0 else 0
                if best < 0 or n < best:
                    best = n
            elif have < 0:
                return 0
        return best if best >= 0 else 0

    def clamp(self) -> "Shape":
        return Shape(max(0, self.vcpu), max(0, self.ram_mb), max(0, self.gpus))

    def to_dict(self) -> dict[str, Any]:
        return {"vcpu": self.vcpu, "ram_mb": self.ram_mb, "gpus": self.gpus}


class PoolKind(StrEnum):
    VM = "vm"
    BAREMETAL = "baremetal"


class PoolClass(StrEnum):
    HEADROOM = "headroom"
    RESERVED_IDLE = "reserved-idle"


class Scheduler(StrEnum):
    KUBERNETES = "kubernetes"
    SLURM = "slurm"


@dataclass(frozen=True, slots=True)
class KubernetesBinding:
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[str, ...] = ()  # "key=value:NoSchedule"

    @property
    def taint_keys(self) -> frozenset[str]:
        return frozenset(t.split("=", 1)[0].split(":", 1)[0] for t in self.taints)


@dataclass(frozen=True, slots=True)
class SlurmBinding:
    partition: str | None = None
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A class of spot capacity, as configured."""

    name: str
    kind: PoolKind
    pool_class: PoolClass
    az: str
    shape: Shape
    flavor: str | None = None
    resource_class: str | None = None
    aggregate: str | None = None
    image: str | None = None
    networks: str | None = None
    max_nodes: int = 50
    kubernetes: KubernetesBinding = field(default_factory=KubernetesBinding)
    slurm: SlurmBinding = field(default_factory=SlurmBinding)
    boot_seconds: int = 120
    cleaning_seconds: int = 0
    list_price: float | None = None  # per node-hour, when no rate-card feed is configured
    on_demand_price: float | None = None  # per node-hour: what savings are measured against (spotctl report)

    def serves(self, unit: "WorkUnit") -> bool:
        """Whether a unit of pending work may run on a node of this pool."""
        if unit.scheduler is Scheduler.SLURM:
            if unit.partition and unit.partition != self.slurm.partition:
                return False
            if unit.features and not set(unit.features) <= set(self.slurm.features):
                return False
            return self.slurm.partition is not None
        labels = dict(self.kubernetes.labels)
        for k, v in unit.node_selector:
            if labels.get(k) != v:
                return False
        if not self.kubernetes.taint_keys <= set(unit.tolerations):
            return False
        return bool(self.kubernetes.labels or self.kubernetes.taints)


class NodeState(StrEnum):
    INTENDED = "intended"
    BUILDING = "building"
    ACTIVE = "active"
    ADVISED = "advised"
    DRAINING = "draining"
    DELETING = "deleting"
    GONE = "gone"
    FAILED = "failed"
    LOST = "lost"


class ActionKind(StrEnum):
    """What an action does to capacity (the planner's, the watcher's and an operator's alike)."""

    LAUNCH = "launch"
    DRAIN = "drain"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    DELETE = "delete"
    PROTECT = "protect"


TERMINAL_STATES = frozenset({NodeState.GONE, NodeState.FAILED, NodeState.LOST})


@dataclass(slots=True)
class Node:
    """A spot node as we know it (our record, not the cloud's)."""

    id: str
    pool: str
    state: NodeState
    action_id: str
    created_at: float
    updated_at: float
    instance_id: str | None = None
    host: str | None = None
    reason: str = ""
    cordoned: bool = False
    idle_since: float | None = None
    notice_deadline: float | None = None
    notice_id: str | None = None
    price: float = 0.0
    #: What the schedulers were last told (SchedulerPort.protect): work must end by then; closed: no new work.
    protected_until: float | None = None
    protect_closed: bool = False

    @property
    def live(self) -> bool:
        return self.state not in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pool": self.pool,
            "state": str(self.state),
            "instance_id": self.instance_id,
            "host": self.host,
            "action_id": self.action_id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "reason": self.reason,
            "cordoned": self.cordoned,
            "idle_since": self.idle_since,
            "notice_deadline": self.notice_deadline,
            "price": self.price,
            "protected_until": self.protected_until,
            "protect_closed": self.protect_closed,
        }


@frozen
class WorkUnit:
    """One unit of pending work: a pod or a Slurm job (one node's worth at most)."""

    id: str
    scheduler: Scheduler
    shape: Shape
    priority: int = 0
    expected_seconds: int = 3600
    submitted_at: float = 0.0
    partition: str | None = None
    features: tuple[str, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Pending work we saw and do not treat as demand, with the reason why."""

    unit_id: str
    scheduler: Scheduler
    reason: str


@dataclass(frozen=True, slots=True)
class HostCapacity:
    """One hypervisor / bare-metal host of a pool, from Placement."""

    name: str
    pool: str
    capacity: Shape  # (total - reserved) * allocation_ratio
    used_other: Shape  # usage that is not ours (on-demand tenants)
    spot_nodes: int = 0  # our spot nodes on this host
    reserved_from: float | None = None  # a reservation takes this host at this time


@dataclass(frozen=True, slots=True)
class HostChoice:
    """Where one new node may land (:mod:`spotctl.core.hostaware`): on a host that no reservation takes
    before ``not_before`` (epoch seconds). Given to :meth:`~spotctl.core.ports.CloudPort.create_instance`."""

    not_before: float

    def acceptable(self, reclaim_at: float | None) -> bool:
        return host_acceptable(reclaim_at, self.not_before)


def host_acceptable(reclaim_at: float | None, not_before: float) -> bool:
    """A host whose reclaim (a reservation's start minus cleaning; None: none) is not before ``not_before``."""
    return reclaim_at is None or reclaim_at >= not_before


@dataclass(frozen=True, slots=True)
class Quota:
    instances: int | None = None
    vcpu: int | None = None
    ram_mb: int | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """A committed reservation (Blazar lease) that takes hosts of a pool back."""

    id: str
    pool: str
    hosts: tuple[str, ...]
    start: float
    end: float


@frozen
class Instance:
    """A cloud instance carrying our tags."""

    id: str
    name: str
    pool: str
    status: str  # BUILD | ACTIVE | ERROR | DELETED
    action_id: str
    host: str | None = None
    created_at: float = 0.0
    #: Why an ERROR instance failed, as the cloud said it (Nova's fault message, Ironic's last_error).
    fault: str = ""
    #: An ERROR instance that failed for want of room (NoValidHost, no free node): the pool is full.
    no_room: bool = False
    #: A started instance that needs one more call to go on (``CloudPort.advance``): e.g. "deploy"
    #: once Ironic has given an allocation its node. Empty when the cloud goes on by itself.
    step: str = ""


@dataclass(frozen=True, slots=True)
class RateCard:
    version: str
    currency: str
    prices: dict[str, Any]  # pool -> price per node-hour
    valid_from: float
    valid_until: float


class NoticeKind(StrEnum):
    HARD = "hard"
    ADVISORY = "advisory"
    CALENDAR = "calendar"


@frozen
class Notice:
    id: str
    instance_id: str
    kind: NoticeKind
    issued_at: float
    deadline: float | None
    reason: str = ""
    pool: str | None = None
    delivered_at: float | None = None  # the provider's receipt that the node got it


@frozen
class NodeUsage:
    """What a scheduler says about one of our nodes."""

    node: str
    scheduler: Scheduler
    used: Shape
    running: int
    cordoned: bool = False
    last_busy_at: float | None = None
    #: When the youngest workload running there started (the latest start): every workload on the node has
    #: run at least ``now - work_started_at``. None: not known (the scheduler does not say, or one of the
    #: workloads has no start time); consolidation never preempts work whose run time is not known.
    work_started_at: float | None = None


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """What one drain round (cordon + one round of evictions or requeues) left on a node, as one
    scheduler sees it. A drain is a state machine across passes: a round never waits, and the node is
    empty only when its workloads are gone — not when their evictions were accepted.

    ``remaining`` counts the workloads still on the node (terminating ones included); ``moved`` the
    evictions or requeues accepted this round; ``blocked`` why some could not be moved now (a
    PodDisruptionBudget, say); ``forced`` the workloads deleted because a hard notice's deadline left
    no time to wait (each one is audited)."""

    scheduler: str
    remaining: int
    moved: int = 0
    blocked: tuple[str, ...] = ()
    forced: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.remaining == 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"remaining": self.remaining, "moved": self.moved, "empty": self.empty}
        if self.blocked:
            d["blocked"] = list(self.blocked)
        if self.forced:
            d["forced"] = list(self.forced)
        return d


@dataclass(frozen=True, slots=True)
class ReclaimReceipt:
    """What the provider's reclaim API did with one instance: a hard notice now (``notice_id``), an
    advisory first with the notice to follow (``advisory_id``), or nothing (``error``)."""

    instance_id: str
    notice_id: str | None = None
    advisory_id: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.notice_id is not None or self.advisory_id is not None)


@dataclass(frozen=True, slots=True)
class Reclaim:
    """One call of the provider's reclaim API (the drills' rehearsal of a reclaim)."""

    id: str
    instances: tuple[ReclaimReceipt, ...]

    def receipt(self, instance_id: str) -> ReclaimReceipt | None:
        return next((r for r in self.instances if r.instance_id == instance_id), None)


class OutcomeStatus(StrEnum):
    """What one step of a pass did (``spotctl.ops.act.Outcome.status``); serialises as its value."""

    OK = "ok"            # done, with the evidence (every bound scheduler accepted it, the instance exists)
    PARTIAL = "partial"  # some of it: a scheduler failed or does not know the node, or some nodes of a launch
    PENDING = "pending"  # not yet: the node has not joined a bound scheduler (a later pass applies it again)
    FAILED = "failed"
    SKIPPED = "skipped"  # not attempted (no token, or already in hand)
