"""The planner's input: an observed snapshot aggregated into a compact, recordable value.

``build_input`` turns what was observed (pending units, our nodes and what runs on them, notices)
into a :class:`PlanInput`; :func:`spotctl.core.planner.plan` decides on that input alone, and the
input is recorded with every executed plan (``to_dict``/``from_dict``), so that ``spotctl plan
--replay`` reproduces the plan exactly (its ``digest`` names it).
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .budget import Bucket
from .capacity import HORIZON_SECONDS, Calendar, PoolHeadroom, calendar_id
from .config import Policy, policy_record
from .models import (
    Exclusion,
    Node,
    NodeState,
    NodeUsage,
    Notice,
    NoticeKind,
    PoolSpec,
    Quota,
    RateCard,
    Shape,
    WorkUnit,
    frozen,
)
from .plan_digest import (
    DIGEST_VERSION,
    DIGEST_VERSIONS,
    JSON,
    MARKS,
    SORTED_JSON,
    demand_columns,
    demand_json,
    demand_rows,
    node_columns,
    node_rows,
    notice_dict,
    pool_from_dict,
    pool_sets,
    pool_to_dict,
)

EXAMPLES = 20  # unit ids kept per demand class (plan JSON and --explain)
REPLACEMENT = "replacement"  # the "scheduler" of synthetic demand: capacity for work on nodes about to go
MAX_EXCLUSIONS = 500  # excluded units listed one by one (all are counted by reason)


@frozen
class DemandClass:
    """Pending units that are interchangeable for packing."""

    key: str
    scheduler: str
    shape: Shape
    priority: int
    expected_seconds: int
    count: int
    pools: tuple[str, ...]  # pools that serve these units and whose shape fits them
    examples: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "scheduler": self.scheduler, "shape": self.shape.to_dict(),
            "priority": self.priority, "expected_seconds": self.expected_seconds,
            "count": self.count, "pools": list(self.pools), "examples": list(self.examples),
        }


@frozen
class NodeView:
    """One of our live nodes, merged with what the schedulers say of it."""

    id: str
    pool: str
    state: NodeState
    used: Shape
    running: int
    cordoned: bool
    idle_since: float | None
    notice: Notice | None
    price: float
    drain_started: float | None = None
    host: str | None = None
    protected_until: float | None = None  # what the schedulers were last told (SchedulerPort.protect)
    protect_closed: bool = False
    cordoned_by_us: bool = False  # our record says we cordoned it (``cordoned`` also counts other cordons)
    known: bool = True  # some scheduler knows the node (it has registered): there is something to cordon
    launched_at: float | None = None  # when we launched it (our record's creation): the node's age
    #: when its youngest running workload started, as its schedulers say (None: nothing runs, or not known)
    work_started_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id, "pool": self.pool, "state": str(self.state), "used": self.used.to_dict(), "host": self.host,
            "running": self.running, "cordoned": self.cordoned, "idle_since": self.idle_since,
            "notice": notice_dict(self.notice), "price": self.price, "drain_started": self.drain_started,
            "protected_until": self.protected_until, "protect_closed": self.protect_closed,
            "cordoned_by_us": self.cordoned_by_us, "known": self.known,
        }
        # recorded when known (an input recorded before they were keeps its digest)
        if self.launched_at is not None:
            d["launched_at"] = self.launched_at
        if self.work_started_at is not None:
            d["work_started_at"] = self.work_started_at
        return d


@dataclass(frozen=True)
class PlanInput:
    region: str
    now: float
    pools: dict[str, PoolSpec]
    policy: Policy
    headroom: dict[str, PoolHeadroom]
    calendars: dict[str, Calendar]
    quota: Quota
    rate_card: RateCard | None
    nodes: tuple[NodeView, ...]
    demand: tuple[DemandClass, ...]
    advisories: dict[str, int]  # pool -> active advisories
    recent_reclaims: dict[str, int]  # pool -> reclaims in the last hour
    pool_failures: dict[str, float]  # pool -> failed-until
    budget: Bucket
    no_notice_pools: frozenset[str] = frozenset()
    excluded: dict[str, int] = field(default_factory=dict)  # reason -> count
    exclusions: tuple[tuple[str, str, str], ...] = ()  # (unit, scheduler, reason), first MAX_EXCLUSIONS
    host_reclaims: dict[str, float] = field(default_factory=dict)  # host -> when a reservation takes it
    #: schedulers whose usage was not read this pass (down, or bound by a pool but not configured): a node of
    #: theirs that shows nothing running is not known to be empty
    usage_unread: frozenset[str] = frozenset()
    #: the rate card seen before this one (the previous tick), from the state DB: its version and prices.
    #: Consolidation moves only on a saving that holds on both. None: not known (a first pass, no feed).
    previous_rate_card: tuple[str, dict[str, float]] | None = None
    digest_version: int = 0  # 1, 2 or 3 (see plan_digest.DIGEST_VERSIONS): a recorded input's; 0: a new one (3)

    def digest(self) -> str:
        """The input's name (its plan id is the first 12 hex digits): changes with any decision input."""
        return self._digest

    def to_dict(self) -> dict[str, Any]:
        """What is recorded: every input, each distinct pool set once (``pool_sets``; a class names its
        own by index, ``pool_set``), the nodes and the demand as columns (version 3; version 2: an object
        each). ``from_dict`` also reads records of versions 1 and 2."""
        return self._recorded

    @cached_property
    def demand_sets(self) -> tuple[list[tuple[str, ...]], list[int]]:
        """The distinct pool sets of the demand and each class's (:func:`pool_sets`), computed once."""
        return pool_sets(self.demand)

    @cached_property
    def _digest(self) -> str:
        """SHA-256 of the input's canonical JSON (:meth:`recorded_json`)."""
        return hashlib.sha256(self.recorded_json().encode()).hexdigest()

    def recorded_json(self) -> str:
        """The canonical JSON (sorted keys, no spaces, ASCII) the digest is the SHA-256 of: from version 2 on
        (version 3: every new input) that of :meth:`to_dict`, which is what the store records (one encoding for
        the name and the record); a recorded input of version 1 (no version recorded), that of
        :meth:`_legacy_dict`, the bytes as then, so that its plan id stays. Versions 1 and 2 are written in
        parts: each distinct pool set encoded once, each class from a template."""
        return self._canonical_text

    @cached_property
    def _canonical_text(self) -> str:
        version = self.resolved_digest_version
        if version not in DIGEST_VERSIONS:
            raise ValueError(f"unknown plan input digest version {self.digest_version!r}")
        if version >= 3:  # the recorded form as it is: its large parts are columns, which the encoder writes in C
            return SORTED_JSON.encode(self._recorded)
        v2 = version == 2
        md, mn = (JSON.encode(m) for m in MARKS)
        sets = {"pool_sets": [list(t) for t in self.demand_sets[0]], "digest_version": 2} if v2 else {}
        text = SORTED_JSON.encode({**self._small, **sets, "demand": MARKS[0], "nodes": MARKS[1]})
        if text.count(md) != 1 or text.count(mn) != 1 or text.index(md) > text.index(mn):
            whole = self.to_dict() if v2 else self._legacy_dict()
            return SORTED_JSON.encode(whole)
        head, rest = text.split(md)
        mid, tail = rest.split(mn)
        return "".join((head, self._demand_json(v2), mid, SORTED_JSON.encode(self._node_dicts), tail))

    @cached_property
    def resolved_digest_version(self) -> int:
        return self.digest_version or DIGEST_VERSION

    def _demand_json(self, v2: bool) -> str:
        """The demand of :meth:`_legacy_dict` (``v2``: of :meth:`to_dict`) as canonical JSON."""
        return demand_json(self.demand, *self.demand_sets, v2=v2)

    @cached_property
    def _node_dicts(self) -> list[dict[str, Any]]:
        """The nodes as recorded, made once for the digest and the record (``to_dict``) alike."""
        return [n.to_dict() for n in self.nodes]

    @cached_property
    def _recorded(self) -> dict[str, Any]:
        sets, of_class = self.demand_sets
        version = self.resolved_digest_version
        common = {**self._small, "pool_sets": [list(t) for t in sets], "digest_version": version}
        if version >= 3:
            return {**common, "nodes": node_columns(self.nodes), "demand": demand_columns(self.demand, of_class)}
        demand = []
        for c, i in zip(self.demand, of_class):
            d = c.to_dict()
            del d["pools"]
            d["pool_set"] = i
            demand.append(d)
        return {**common, "nodes": self._node_dicts, "demand": demand}

    def _legacy_dict(self) -> dict[str, Any]:
        """The whole input, each class with its pools: what the digest is the SHA-256 of (as JSON)."""
        return {**self._small, "nodes": self._node_dicts, "demand": [d.to_dict() for d in self.demand]}

    @cached_property
    def _small(self) -> dict[str, Any]:
        """Every input but the nodes and the demand (a size of the pools, not of the fleet); made once for the
        digest and the record alike."""
        rc = self.rate_card
        return {
            "region": self.region,
            "now": self.now,
            "policy": policy_record(self.policy),
            "headroom": {k: v.to_dict() for k, v in sorted(self.headroom.items())},
            "calendars": {k: v.to_dict() for k, v in sorted(self.calendars.items())},
            "calendar_id": calendar_id(self.calendars),
            "quota": {"instances": self.quota.instances, "vcpu": self.quota.vcpu, "ram_mb": self.quota.ram_mb},
            "rate_card": None if rc is None else {
                "version": rc.version, "currency": rc.currency, "prices": dict(sorted(rc.prices.items())),
                "valid_from": rc.valid_from, "valid_until": rc.valid_until,
            },
            "advisories": dict(sorted(self.advisories.items())),
            "recent_reclaims": dict(sorted(self.recent_reclaims.items())),
            "pool_failures": dict(sorted(self.pool_failures.items())),
            "budget": self.budget.to_dict(),
            "no_notice_pools": sorted(self.no_notice_pools),
            "excluded": dict(sorted(self.excluded.items())),
            "exclusions": [list(e) for e in self.exclusions],
            "pools": {k: pool_to_dict(v) for k, v in sorted(self.pools.items())},
            "host_reclaims": dict(sorted(self.host_reclaims.items())),
            **({"usage_unread": sorted(self.usage_unread)} if self.usage_unread else {}),
            **({"previous_rate_card": {"version": self.previous_rate_card[0],
                                       "prices": dict(sorted(self.previous_rate_card[1].items()))}}
               if self.previous_rate_card is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanInput:
        """Rebuild a recorded input, so that its plan can be reproduced exactly."""
        rc = d["rate_card"]
        b = d["budget"]
        sets = [tuple(t) for t in d.get("pool_sets", ())]
        version = d.get("digest_version", 1)  # recorded before versions were: 1
        if version not in DIGEST_VERSIONS:
            raise ValueError(f"unknown plan input digest version {version!r}")
        nodes, demand = (node_rows(d["nodes"]), demand_rows(d["demand"])) if version >= 3 else (d["nodes"], d["demand"])
        return cls(
            region=d["region"], now=d["now"],
            pools={k: pool_from_dict(v) for k, v in d["pools"].items()},
            policy=Policy(**d["policy"]),
            headroom={k: PoolHeadroom(pool=k, **v) for k, v in d["headroom"].items()},
            calendars={k: Calendar(pool=v["pool"], start=v["start"], end=v["end"],
                                   steps=tuple((t, c) for t, c in v["steps"])) for k, v in d["calendars"].items()},
            quota=Quota(**d["quota"]),
            rate_card=None if rc is None else RateCard(version=rc["version"], currency=rc["currency"],
                                                       prices=dict(rc["prices"]), valid_from=rc["valid_from"],
                                                       valid_until=rc["valid_until"]),
            nodes=tuple(NodeView(
                id=n["id"], pool=n["pool"], state=NodeState(n["state"]), used=Shape(**n["used"]),
                running=n["running"], cordoned=n["cordoned"], idle_since=n["idle_since"],
                notice=None if n["notice"] is None else Notice(
                    id=n["notice"]["id"], instance_id=n["notice"]["instance_id"],
                    kind=NoticeKind(n["notice"]["kind"]), issued_at=n["notice"]["issued_at"],
                    deadline=n["notice"]["deadline"], reason=n["notice"]["reason"], pool=n["notice"]["pool"]),
                price=n["price"], drain_started=n["drain_started"], host=n.get("host"),
                protected_until=n.get("protected_until"), protect_closed=n.get("protect_closed", False),
                cordoned_by_us=n.get("cordoned_by_us", False), known=n.get("known", True),
                launched_at=n.get("launched_at"), work_started_at=n.get("work_started_at"))
                for n in nodes),
            demand=tuple(DemandClass(
                key=c["key"], scheduler=c["scheduler"], shape=Shape(**c["shape"]), priority=c["priority"],
                expected_seconds=c["expected_seconds"], count=c["count"],
                pools=tuple(c["pools"]) if "pools" in c else sets[c["pool_set"]],
                examples=tuple(c["examples"])) for c in demand),
            advisories=dict(d["advisories"]), recent_reclaims=dict(d["recent_reclaims"]),
            pool_failures=dict(d["pool_failures"]),
            budget=Bucket(rate=b["rate"], burst=b["burst"], tokens=b["tokens"], at=b["at"]),
            no_notice_pools=frozenset(d["no_notice_pools"]), excluded=dict(d["excluded"]),
            exclusions=tuple(tuple(e) for e in d["exclusions"]),
            host_reclaims=dict(d.get("host_reclaims", {})),
            usage_unread=frozenset(d.get("usage_unread", ())),
            previous_rate_card=None if d.get("previous_rate_card") is None else (
                d["previous_rate_card"]["version"], dict(d["previous_rate_card"]["prices"])),
            digest_version=version,
        )


def build_input(
    *,
    region: str,
    now: float,
    pools: dict[str, PoolSpec],
    policy: Policy,
    headroom: dict[str, PoolHeadroom],
    calendars: dict[str, Calendar],
    quota: Quota,
    rate_card: RateCard | None,
    nodes: list[Node],
    usage: list[NodeUsage],
    notices: list[Notice],
    units: list[WorkUnit],
    excluded: dict[str, int],
    recent_reclaims: dict[str, int],
    pool_failures: dict[str, float],
    budget: Bucket,
    no_notice_pools: frozenset[str] = frozenset(),
    exclusions: list[Exclusion] | None = None,
    host_reclaims: dict[str, float] | None = None,
    usage_unread: frozenset[str] = frozenset(),
    previous_rate_card: tuple[str, dict[str, float]] | None = None,
) -> PlanInput:
    """Aggregate an observed snapshot into a compact, recordable plan input."""
    by_node: dict[str, list[NodeUsage]] = {}
    for u in usage:
        by_node.setdefault(u.node, []).append(u)
    # each node's strongest notice: a hard one first, then the one to act on soonest (an advisory with a
    # deadline is acted on from calendar_advisory_seconds before it: notices.advisory_stage), the oldest
    lead = max(policy.calendar_advisory_seconds, policy.advisory_prespin_lead_seconds)
    by_instance: dict[str, Notice] = {}
    for n in sorted(notices, key=lambda n: (n.kind != NoticeKind.HARD,
                                            n.issued_at if n.deadline is None else max(n.issued_at, n.deadline - lead),
                                            n.issued_at, n.id)):
        by_instance.setdefault(n.instance_id, n)
    advisories: dict[str, int] = {}
    views = []
    # what only consolidation decides on (node age, run time, the previous rate card) is in the input only when
    # consolidation is on: an input holds what its plan was decided on, and no more
    consolidating = policy.consolidation_min_saving_pct > 0
    for node in sorted(nodes, key=lambda n: n.id):
        if not node.live and not (node.state is NodeState.FAILED and node.instance_id):
            continue  # a failed node with an instance (an ERROR server) stays: the planner deletes it
        us = by_node.get(node.id, [])
        running = 0
        last_busy = None
        some_cordoned = False  # some scheduler has it cordoned
        started: float | None = None  # the youngest workload's start, over the schedulers with work there
        start_unknown = False
        v = r = g = 0  # what runs on it, summed over its schedulers
        for u in us:
            s = u.used
            v, r, g = v + s.vcpu, r + s.ram_mb, g + s.gpus
            running += u.running
            lb = u.last_busy_at
            if lb is not None and (last_busy is None or lb > last_busy):
                last_busy = lb
            if u.cordoned:
                some_cordoned = True
            if u.running:
                ws = u.work_started_at
                if ws is None:
                    start_unknown = True
                elif started is None or ws > started:
                    started = ws
        used = us[0].used if len(us) == 1 else Shape(v, r, g) if us else Shape()
        notice = by_instance.get(node.instance_id) if node.instance_id else None
        if notice is not None and notice.kind is not NoticeKind.HARD:
            advisories[node.pool] = advisories.get(node.pool, 0) + 1
        idle_since = None
        if running == 0:
            idle_since = last_busy if last_busy is not None else node.idle_since
            if idle_since is None:
                idle_since = node.updated_at
        views.append(NodeView(
            id=node.id, pool=node.pool, state=node.state, used=used, running=running, notice=notice,
            cordoned=node.cordoned or some_cordoned, idle_since=idle_since, price=node.price, known=bool(us),
            drain_started=node.updated_at if node.state is NodeState.DRAINING else None, host=node.host,
            protected_until=node.protected_until, protect_closed=node.protect_closed, cordoned_by_us=node.cordoned,
            launched_at=node.created_at if consolidating else None,
            work_started_at=None if start_unknown or not running or not consolidating else started))
    classes = _unit_classes(units)
    demand = []
    # the pools that serve a binding (scheduler, partition, features, selector, tolerations), by pool shape;
    # and one shared tuple per distinct set of pools (O(classes x shapes), not O(classes x pools))
    serving: dict[tuple[Any, ...], list[tuple[Shape, list[str]]]] = {}
    interned: dict[tuple[Any, ...], tuple[str, ...]] = {}
    for key, (sample, ids) in classes.items():
        count = len(ids)
        examples = sorted(ids) if count <= EXAMPLES else heapq.nsmallest(EXAMPLES, ids)
        binding = (key[0],) + key[4:]
        by_shape = serving.get(binding)
        if by_shape is None:
            shapes: dict[Shape, list[str]] = {}
            for p in pools.values():
                if p.serves(sample):
                    shapes.setdefault(p.shape, []).append(p.name)
            by_shape = serving[binding] = list(shapes.items())
        fitting = tuple(i for i, (shape, _) in enumerate(by_shape) if sample.shape.fits_in(shape))
        served = interned.get((binding, fitting))
        if served is None:
            served = interned[(binding, fitting)] = tuple(sorted(n for i in fitting for n in by_shape[i][1]))
        k = "|".join(str(x) for x in key)
        demand.append(DemandClass(
            key=hashlib.sha1(k.encode()).hexdigest()[:10], scheduler=key[0], shape=sample.shape,
            priority=sample.priority, expected_seconds=sample.expected_seconds, count=count,
            pools=served, examples=tuple(examples),
        ))
    demand.sort(key=demand_order)
    return PlanInput(
        region=region, now=now, pools=dict(sorted(pools.items())), policy=policy, headroom=headroom,
        calendars=calendars, quota=quota, rate_card=rate_card, nodes=tuple(views), demand=tuple(demand),
        advisories=advisories, recent_reclaims=dict(recent_reclaims),
        pool_failures={p: t for p, t in pool_failures.items() if t > now}, budget=budget,
        no_notice_pools=no_notice_pools, excluded=dict(excluded),
        exclusions=tuple(sorted((e.unit_id, str(e.scheduler), e.reason) for e in (exclusions or ()))[:MAX_EXCLUSIONS]),
        host_reclaims={h: t for h, t in (host_reclaims or {}).items() if now <= t <= now + HORIZON_SECONDS},
        usage_unread=frozenset(usage_unread), previous_rate_card=previous_rate_card if consolidating else None,
    )


def duration_band(seconds: int) -> int:
    """The band of a unit's expected run time: under 15 minutes, then doublings (15-30 min, 30-60 min, 1-2 h,
    2-4 h, 4-8 h, 8-16 h, ...)."""
    return (max(0, int(seconds)) // 900).bit_length()


def demand_order(d: DemandClass) -> tuple[Any, ...]:
    """The plan's order of demand classes: the highest priority first; within it the longest duration band
    first, and the largest shape first within a band. Packing in this order fills a new node with work that ends
    at about the same time (an 8-hour job and ten-minute ones on one node keep it 8 hours; the short work fills
    what room the long work leaves), and gives the longest calendar windows to the work that needs them."""
    return (-d.priority, -duration_band(d.expected_seconds), -d.shape.gpus, -d.shape.vcpu, -d.shape.ram_mb,
            d.expected_seconds, d.key)


def _unit_classes(units: list[WorkUnit]) -> dict[tuple[Any, ...], tuple[WorkUnit, list[str]]]:
    """Pending units by demand class, in order of first appearance: key (``str`` scheduler, shape, priority,
    duration, partition, features, selector, tolerations) -> (the class's first unit, every unit id). Each unit
    is read as a tuple (scheduler, shape as three ints, priority, duration, binding: no frozen-dataclass hash
    per unit), turned into the class key of old (``str`` scheduler, Shape) once per class."""
    raw: dict[tuple[Any, ...], list[Any]] = {}
    for w in units:  # (attribute loads in the loop: CPython specialises them, faster than an attrgetter)
        s = w.shape
        k = (w.scheduler, s.vcpu, s.ram_mb, s.gpus, w.priority, w.expected_seconds, w.partition, w.features,
             w.node_selector, w.tolerations)
        if (entry := raw.get(k)) is not None:
            entry.append(w.id)
        else:
            raw[k] = [w, w.id]
    classes: dict[tuple[Any, ...], tuple[WorkUnit, list[str]]] = {}
    for entry in raw.values():  # keys equal once the scheduler is a str (an enum and its value) are one class
        w = entry[0]
        key = (str(w.scheduler), w.shape, w.priority, w.expected_seconds, w.partition, w.features,
               w.node_selector, w.tolerations)
        if (got := classes.get(key)) is not None:
            got[1].extend(entry[1:])
        else:
            classes[key] = (w, entry[1:])
    return classes
