"""Planner v1: a pure, deterministic function (PlanInput) -> Plan.

``build_input`` aggregates an observed snapshot (pending units, our nodes and
what runs on them) into a compact :class:`PlanInput`; ``plan`` decides on that
input alone, so a recorded input reproduces its plan exactly.

Order of decisions (and of the actions it returns):
1. reclaim handling — hard notices: drain; expired deadlines: delete;
2. advisories — cordon (stop new placements); cleared advisories — uncordon;
3. empty draining / failed nodes — delete;
4. demand — fill free room on our nodes first, then pack the rest into new
   nodes of the cheapest, least risky pool whose forward calendar leaves time
   for the work to finish and drain; respecting headroom (host by host),
   quota, pool limits, spend cap and the token budget;
5. scale down — idle nodes past the idle TTL, within the disruption budget.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property

from .budget import Bucket, Priority
from .capacity import HORIZON_SECONDS, Calendar, PoolHeadroom, calendar_id
from .config import Policy
from .lifecycle import bound_schedulers, forced_round
from .models import (
    Exclusion,
    KubernetesBinding,
    Node,
    NodeState,
    NodeUsage,
    Notice,
    NoticeKind,
    PoolClass,
    PoolKind,
    PoolSpec,
    Quota,
    RateCard,
    Scheduler,
    Shape,
    SlurmBinding,
    WorkUnit,
)

# --- input ------------------------------------------------------------------

EXAMPLES = 20  # unit ids kept per demand class (plan JSON and --explain)
REPLACEMENT = "replacement"  # the "scheduler" of synthetic demand: capacity for work on nodes about to go
MAX_EXCLUSIONS = 500  # excluded units listed one by one (all are counted by reason)


@dataclass(frozen=True)
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

    def to_dict(self) -> dict:
        return {
            "key": self.key, "scheduler": self.scheduler, "shape": self.shape.to_dict(),
            "priority": self.priority, "expected_seconds": self.expected_seconds,
            "count": self.count, "pools": list(self.pools), "examples": list(self.examples),
        }


@dataclass(frozen=True)
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

    def to_dict(self) -> dict:
        return {
            "id": self.id, "pool": self.pool, "state": str(self.state), "used": self.used.to_dict(), "host": self.host,
            "running": self.running, "cordoned": self.cordoned, "idle_since": self.idle_since,
            "notice": _notice_dict(self.notice), "price": self.price, "drain_started": self.drain_started,
            "protected_until": self.protected_until, "protect_closed": self.protect_closed,
            "cordoned_by_us": self.cordoned_by_us, "known": self.known,
        }


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

    def digest(self) -> str:
        return self._encoded[1]

    def to_dict(self) -> dict:
        return self._encoded[0]

    @cached_property
    def _encoded(self) -> tuple[dict, str]:
        d = self._to_dict()
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
        return d, hashlib.sha256(blob.encode()).hexdigest()

    def _to_dict(self) -> dict:
        rc = self.rate_card
        return {
            "region": self.region,
            "now": self.now,
            "policy": self.policy.__dict__,
            "headroom": {k: v.to_dict() for k, v in sorted(self.headroom.items())},
            "calendars": {k: v.to_dict() for k, v in sorted(self.calendars.items())},
            "calendar_id": calendar_id(self.calendars),
            "quota": {"instances": self.quota.instances, "vcpu": self.quota.vcpu, "ram_mb": self.quota.ram_mb},
            "rate_card": None if rc is None else {
                "version": rc.version, "currency": rc.currency, "prices": dict(sorted(rc.prices.items())),
                "valid_from": rc.valid_from, "valid_until": rc.valid_until,
            },
            "nodes": [n.to_dict() for n in self.nodes],
            "demand": [d.to_dict() for d in self.demand],
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
        }

    @classmethod
    def from_dict(cls, d: dict) -> "PlanInput":
        """Rebuild a recorded input, so that its plan can be reproduced exactly."""
        rc = d["rate_card"]
        b = d["budget"]
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
                cordoned_by_us=n.get("cordoned_by_us", False), known=n.get("known", True))
                for n in d["nodes"]),
            demand=tuple(DemandClass(
                key=c["key"], scheduler=c["scheduler"], shape=Shape(**c["shape"]), priority=c["priority"],
                expected_seconds=c["expected_seconds"], count=c["count"], pools=tuple(c["pools"]),
                examples=tuple(c["examples"])) for c in d["demand"]),
            advisories=dict(d["advisories"]), recent_reclaims=dict(d["recent_reclaims"]),
            pool_failures=dict(d["pool_failures"]),
            budget=Bucket(rate=b["rate"], burst=b["burst"], tokens=b["tokens"], at=b["at"]),
            no_notice_pools=frozenset(d["no_notice_pools"]), excluded=dict(d["excluded"]),
            exclusions=tuple(tuple(e) for e in d["exclusions"]),
            host_reclaims=dict(d.get("host_reclaims", {})),
            usage_unread=frozenset(d.get("usage_unread", ())),
        )


def pool_to_dict(p: PoolSpec) -> dict:
    return {
        "name": p.name, "kind": str(p.kind), "class": str(p.pool_class), "az": p.az, "shape": p.shape.to_dict(),
        "flavor": p.flavor, "resource_class": p.resource_class, "aggregate": p.aggregate, "image": p.image,
        "networks": p.networks, "max_nodes": p.max_nodes,
        "kubernetes": {"labels": [list(x) for x in p.kubernetes.labels], "taints": list(p.kubernetes.taints)},
        "slurm": {"partition": p.slurm.partition, "features": list(p.slurm.features)},
        "boot_seconds": p.boot_seconds, "cleaning_seconds": p.cleaning_seconds, "list_price": p.list_price,
    }


def pool_from_dict(d: dict) -> PoolSpec:
    return PoolSpec(
        name=d["name"], kind=PoolKind(d["kind"]), pool_class=PoolClass(d["class"]), az=d["az"],
        shape=Shape(**d["shape"]), flavor=d["flavor"], resource_class=d["resource_class"], aggregate=d["aggregate"],
        image=d["image"], networks=d["networks"], max_nodes=d["max_nodes"],
        kubernetes=KubernetesBinding(labels=tuple(tuple(x) for x in d["kubernetes"]["labels"]),
                                     taints=tuple(d["kubernetes"]["taints"])),
        slurm=SlurmBinding(partition=d["slurm"]["partition"], features=tuple(d["slurm"]["features"])),
        boot_seconds=d["boot_seconds"], cleaning_seconds=d["cleaning_seconds"], list_price=d["list_price"],
    )


def _notice_dict(n: Notice | None) -> dict | None:
    if n is None:
        return None
    return {"id": n.id, "instance_id": n.instance_id, "kind": str(n.kind), "issued_at": n.issued_at,
            "deadline": n.deadline, "reason": n.reason, "pool": n.pool}


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
) -> PlanInput:
    """Aggregate an observed snapshot into a compact, recordable plan input."""
    by_node: dict[str, list[NodeUsage]] = {}
    for u in usage:
        by_node.setdefault(u.node, []).append(u)
    by_instance: dict[str, Notice] = {}
    for n in sorted(notices, key=lambda n: (n.kind != NoticeKind.HARD, n.issued_at, n.id)):
        by_instance.setdefault(n.instance_id, n)
    advisories: dict[str, int] = {}
    views = []
    for node in sorted(nodes, key=lambda n: n.id):
        if not node.live and not (node.state is NodeState.FAILED and node.instance_id):
            continue  # a failed node with an instance (an ERROR server) stays: the planner deletes it
        us = by_node.get(node.id, [])
        used = us[0].used if len(us) == 1 else Shape()
        running = 0
        last_busy = None
        for u in us:
            if len(us) > 1:
                used = used + u.used
            running += u.running
            if u.last_busy_at is not None:
                last_busy = u.last_busy_at if last_busy is None else max(last_busy, u.last_busy_at)
        notice = by_instance.get(node.instance_id) if node.instance_id else None
        if notice is not None and notice.kind is not NoticeKind.HARD:
            advisories[node.pool] = advisories.get(node.pool, 0) + 1
        idle_since = None
        if running == 0:
            idle_since = last_busy if last_busy is not None else node.idle_since
            if idle_since is None:
                idle_since = node.updated_at
        views.append(NodeView(
            id=node.id, pool=node.pool, state=node.state, used=used, running=running,
            cordoned=node.cordoned or any(u.cordoned for u in us), idle_since=idle_since,
            notice=notice, price=node.price,
            drain_started=node.updated_at if node.state is NodeState.DRAINING else None, host=node.host,
            protected_until=node.protected_until, protect_closed=node.protect_closed, cordoned_by_us=node.cordoned,
            known=bool(us),
        ))
    classes: dict[tuple, list] = {}
    for u in units:
        key = (str(u.scheduler), u.shape, u.priority, u.expected_seconds, u.partition, u.features,
               u.node_selector, u.tolerations)
        entry = classes.get(key)
        if entry is None:
            entry = classes[key] = [u, 0, []]
        entry[1] += 1
        ex = entry[2]
        if len(ex) < EXAMPLES:
            ex.append(u.id)
            ex.sort()
        elif u.id < ex[-1]:
            ex[-1] = u.id
            ex.sort()
    demand = []
    for key, (sample, count, examples) in classes.items():
        served = tuple(sorted(p.name for p in pools.values() if sample.shape.fits_in(p.shape) and p.serves(sample)))
        k = "|".join(str(x) for x in key)
        demand.append(DemandClass(
            key=hashlib.sha1(k.encode()).hexdigest()[:10], scheduler=key[0], shape=sample.shape,
            priority=sample.priority, expected_seconds=sample.expected_seconds, count=count,
            pools=served, examples=tuple(sorted(examples)),
        ))
    demand.sort(key=lambda d: (-d.priority, -d.shape.gpus, -d.shape.vcpu, -d.shape.ram_mb, d.expected_seconds, d.key))
    return PlanInput(
        region=region, now=now, pools=dict(sorted(pools.items())), policy=policy, headroom=headroom,
        calendars=calendars, quota=quota, rate_card=rate_card, nodes=tuple(views), demand=tuple(demand),
        advisories=advisories, recent_reclaims=dict(recent_reclaims),
        pool_failures={p: t for p, t in pool_failures.items() if t > now}, budget=budget,
        no_notice_pools=no_notice_pools, excluded=dict(excluded),
        exclusions=tuple(sorted((e.unit_id, str(e.scheduler), e.reason) for e in (exclusions or ()))[:MAX_EXCLUSIONS]),
        host_reclaims={h: t for h, t in (host_reclaims or {}).items() if now <= t <= now + HORIZON_SECONDS},
        usage_unread=frozenset(usage_unread),
    )


# --- output -----------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    id: str
    kind: str  # launch | drain | cordon | uncordon | delete
    priority: Priority
    reason: str
    pool: str | None = None
    count: int | None = None
    node: str | None = None
    units: int = 0
    price: float | None = None
    deadline: float | None = None
    inputs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {
            "id": self.id, "kind": self.kind, "priority": self.priority.name.lower(),
            "pool": self.pool, "reason": self.reason, "inputs": self.inputs,
        }
        if self.count is not None:
            d["count"] = self.count
        if self.node is not None:
            d["node"] = self.node
        if self.kind == "launch":
            d["units"] = self.units
            d["price_per_node_hour"] = self.price
        if self.deadline is not None:
            d["deadline"] = self.deadline
        return d


@dataclass(frozen=True)
class Plan:
    id: str
    region: str
    now: float
    actions: tuple[Action, ...]
    unplaced: dict[str, int]
    pools: list[dict]
    demand: dict
    inputs: dict
    explain: tuple[str, ...]
    excluded: tuple[dict, ...] = ()

    def actions_digest(self) -> str:
        """SHA-256 of the ordered action list (every field of every action): what a replay compares."""
        body = json.dumps([a.to_dict() for a in self.actions], sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(body.encode()).hexdigest()

    def launches(self) -> int:
        return sum(a.count or 0 for a in self.actions if a.kind == "launch")

    def to_dict(self, explain: bool = False) -> dict:
        d = {
            "id": self.id, "region": self.region, "now": self.now,
            "actions": [a.to_dict() for a in self.actions],
            "unplaced": self.unplaced, "pools": self.pools, "demand": self.demand, "inputs": self.inputs,
            "excluded": list(self.excluded),
        }
        if explain:
            d["explain"] = list(self.explain)
        return d


# --- the planner ------------------------------------------------------------


def pool_score(pool: PoolSpec, price: float, advisories: int, reclaims: int) -> float:
    """Price per vCPU-hour, inflated by risk (advisories, recent reclaims)."""
    risk = 1.0 + 0.25 * advisories + 0.25 * reclaims
    return price / max(pool.shape.vcpu, 1) * risk


def plan(inp: PlanInput) -> Plan:
    now = inp.now
    policy = inp.policy
    digest = inp.digest()
    plan_id = digest[:12]
    rc = inp.rate_card
    prices = dict(rc.prices) if rc else {}
    base_inputs = {
        "rate_card_version": rc.version if rc else None,
        "calendar_id": calendar_id(inp.calendars),
        "budget_tokens": round(inp.budget.refill(now).tokens, 3),
    }
    actions: list[Action] = []
    explain: list[str] = []

    def add(kind: str, priority: Priority, reason: str, **kw) -> Action:
        a = Action(id=f"{plan_id}-{len(actions):03d}", kind=kind, priority=priority, reason=reason,
                   inputs={**base_inputs, **kw.pop("inputs", {})}, **kw)
        actions.append(a)
        return a

    # Tokens: higher classes are planned first and counted against the bucket.
    bucket = inp.budget.refill(now)

    def tokens(priority: Priority, n: int) -> int:
        nonlocal bucket
        bucket, granted = bucket.take(n, priority, now)
        return granted

    live = [n for n in inp.nodes]
    gone_soon: set[str] = set()
    to_replace: list[NodeView] = []  # nodes whose running work needs capacity elsewhere, soon

    # 1-3: node housekeeping -------------------------------------------------
    for n in live:
        notice = n.notice
        if notice is None and n.host and n.host in inp.host_reclaims:
            at = inp.host_reclaims[n.host]
            if calendar_advisory_due(at, now, policy):
                # Blazar says a reservation takes this host: treat it as an advisory, early.
                notice = Notice(id=f"calendar-{n.host}-{int(at)}", instance_id="", kind=NoticeKind.CALENDAR,
                                issued_at=at - policy.calendar_advisory_seconds, deadline=at,
                                reason=f"reservation takes host {n.host}", pool=n.pool)
        if notice is not None and notice.kind is NoticeKind.HARD:
            deadline = notice.deadline
            if deadline is not None and now >= deadline and n.state is not NodeState.DELETING:
                if tokens(Priority.RECLAIM, 1):
                    add("delete", Priority.RECLAIM, f"hard notice {notice.id} deadline passed: make sure the capacity is returned",
                        node=n.id, pool=n.pool, deadline=deadline, inputs={"notice": notice.id})
                gone_soon.add(n.id)
                continue
            if n.state in (NodeState.ACTIVE, NodeState.ADVISED, NodeState.BUILDING):
                left = (deadline - now) if deadline else None
                add("drain", Priority.RECLAIM,
                    f"hard notice {notice.id} ({notice.reason or 'reclaim'})" + (f", deadline in {int(left)}s" if left is not None else ""),
                    node=n.id, pool=n.pool, deadline=deadline, inputs={"notice": notice.id, "running": n.running})
                if n.running:
                    to_replace.append(n)
                gone_soon.add(n.id)
                continue
        if n.state is NodeState.DRAINING:
            # A drain is a state machine across passes: each pass runs one more round (evict what is
            # left) until the node is empty; near a hard notice's deadline the last round is forced
            # (what still cannot move is deleted with the time left), then the capacity is returned.
            gone_soon.add(n.id)
            overdue = n.drain_started is not None and now - n.drain_started >= policy.drain_seconds
            deadline = notice.deadline if notice is not None else None
            deadline_near = forced_round(deadline, now)
            pr = Priority.RECLAIM if notice is not None else Priority.CONSOLIDATION
            if n.running and deadline_near:
                add("drain", pr, f"notice {notice.id} deadline in {int(deadline - now)}s: last drain round, delete "
                    f"the {n.running} workload(s) still there", node=n.id, pool=n.pool, deadline=deadline,
                    inputs={"notice": notice.id, "running": n.running, "continue": True, "force": True})
            elif n.running and not overdue:
                add("drain", pr, f"drain continues: {n.running} workload(s) still on the node", node=n.id,
                    pool=n.pool, deadline=deadline, inputs={"running": n.running, "continue": True,
                                                           **({"notice": notice.id} if notice else {})})
            # empty only on evidence: every scheduler the node is bound to was read and shows nothing there
            pool = inp.pools.get(n.pool)
            seen_empty = n.running == 0 and n.known and not (
                bound_schedulers(pool) & inp.usage_unread if pool is not None else inp.usage_unread)
            if seen_empty or overdue or deadline_near:
                why = "drained and empty" if seen_empty else (
                    "drain time is up" if overdue else "notice deadline is near")
                if tokens(pr, 1):
                    add("delete", pr, f"{why}: return the capacity", node=n.id, pool=n.pool)
            continue
        if n.state is NodeState.FAILED:
            gone_soon.add(n.id)
            if tokens(Priority.CONSOLIDATION, 1):
                add("delete", Priority.CONSOLIDATION, "instance failed to build", node=n.id, pool=n.pool)
            continue
        if notice is not None and n.state in (NodeState.ACTIVE, NodeState.ADVISED, NodeState.BUILDING):
            stage = advisory_stage(notice, now, policy)
            what = f"{notice.kind.value} advisory {notice.id} ({notice.reason or 'reclaim risk'})"
            if stage == "expired":
                # Time-boxed: an advisory that neither cleared nor became a notice stops steering us.
                if n.state is NodeState.ADVISED or (n.state is NodeState.BUILDING and n.cordoned_by_us):
                    add("uncordon", Priority.OPERATOR, f"{what} timed out after {int(now - notice.issued_at)}s: "
                        "accept work again", node=n.id, pool=n.pool, inputs={"notice": notice.id})
                continue
            gone_soon.add(n.id)
            if stage == "drain":
                when = f", reclaim in {int(notice.deadline - now)}s" if notice.deadline is not None else ""
                add("drain", Priority.RECLAIM, f"{what}: drain ahead of the reclaim{when}", node=n.id, pool=n.pool,
                    deadline=notice.deadline, inputs={"notice": notice.id, "stage": stage, "running": n.running})
                if n.running:
                    to_replace.append(n)
                continue
            # (a node still booting that no scheduler knows yet has nothing to cordon, and no work is planned
            # onto it: it is cordoned once it registers, not once per pass before)
            if n.state is not NodeState.ADVISED and not n.cordoned and (n.known or n.state is not NodeState.BUILDING):
                add("cordon", Priority.RECLAIM, f"{what}: stop new placements", node=n.id, pool=n.pool,
                    inputs={"notice": notice.id, "stage": "cordon"})
            if stage == "prespin" and n.running:
                to_replace.append(n)
            continue
        if notice is None and (n.state is NodeState.ADVISED or (n.state is NodeState.BUILDING and n.cordoned_by_us)):
            add("uncordon", Priority.OPERATOR, "advisory cleared: accept work again", node=n.id, pool=n.pool)

    # 3b. The calendar at run time: each node's schedulers are told by when its work must end (a
    # reservation takes its host), so that no scheduler starts work there that would be cut off.
    for n in live:
        if n.id in gone_soon or n.cordoned or n.state not in (NodeState.BUILDING, NodeState.ACTIVE):
            continue
        longest = max([d.expected_seconds for d in inp.demand if d.scheduler == str(Scheduler.KUBERNETES)
                       and n.pool in d.pools] + [policy.default_pod_seconds])
        until, closed = node_protection(inp.host_reclaims.get(n.host) if n.host else None, now, policy, longest)
        told = None if n.protected_until is None else round(n.protected_until)
        if (None if until is None else round(until)) == told and (closed == n.protect_closed or until is None):
            continue
        if until is None:
            why = "no reservation takes its host any more: lift the run-time window"
        else:
            why = (f"a reservation takes host {n.host} at {int(inp.host_reclaims[n.host])}: work must end by "
                   f"{int(until)} ({int(until - now)}s from now)")
            if closed:
                why += f"; shorter than the work that could land ({longest}s): no new work"
        add("protect", Priority.RECLAIM, why, node=n.id, pool=n.pool,
            inputs={"until": until, "closed": closed, "host": n.host, "longest_seconds": longest})

    # Replacement capacity, planned before ordinary demand (priority class "replacement"): one unit
    # the size of what runs on each node about to go, in any other pool of the same kind that fits it.
    demand = list(inp.demand)
    for n in sorted(to_replace, key=lambda n: n.id):
        src = inp.pools.get(n.pool)
        others = tuple(sorted(name for name, p in inp.pools.items() if name != n.pool and n.used.fits_in(p.shape)
                              and (src is None or p.kind is src.kind)))
        demand.append(DemandClass(key=f"replace-{n.id}", scheduler=REPLACEMENT, shape=n.used, priority=1_000_000,
                                  expected_seconds=0, count=1, pools=others, examples=(n.id,)))

    # 4: demand --------------------------------------------------------------
    remaining = {d.key: d.count for d in demand}
    classes = {d.key: d for d in demand}
    unplaced: dict[str, int] = {}
    used_nodes: set[str] = set()

    # 4a. free room on our own nodes that will take work (building or active, not cordoned)
    takers = [n for n in live if n.id not in gone_soon and not n.cordoned
              and n.state in (NodeState.BUILDING, NodeState.ACTIVE, NodeState.INTENDED)]
    covered = 0
    groups: dict[tuple[str, Shape, float | None], list[str]] = {}
    for n in takers:
        room = (inp.pools[n.pool].shape - n.used).clamp() if n.pool in inp.pools else Shape()
        # a node whose host a reservation takes serves only work that ends in time (the same window
        # its schedulers are told: node_protection)
        until, _ = node_protection(inp.host_reclaims.get(n.host) if n.host else None, now, policy, 0)
        window = None if until is None else until - now
        if window is not None and window <= 0:
            continue
        groups.setdefault((n.pool, room, window), []).append(n.id)
    serving: dict[str, list[DemandClass]] = {}
    for d in demand:
        for pname in d.pools:
            serving.setdefault(pname, []).append(d)
    for (pool_name, room, window), ids in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1], float("inf") if kv[0][2] is None else kv[0][2])):
        left = len(ids)
        idx = 0
        while left > 0:
            cands = [d for d in serving.get(pool_name, ()) if remaining[d.key] > 0 and d.shape.fits_in(room)]
            if not cands:
                break
            pattern = _fill(room, cands, remaining, window=window)
            if not pattern:
                break
            reps = min([left] + [remaining[k] // c for k, c in pattern.items()])
            for k, c in pattern.items():
                remaining[k] -= c * reps
                covered += c * reps
            used_nodes.update(ids[idx: idx + reps])
            idx += reps
            left -= reps

    # 4b. pack the rest into new nodes, pool by pool, cheapest first
    live_by_pool: dict[str, int] = {}
    for n in live:
        live_by_pool[n.pool] = live_by_pool.get(n.pool, 0) + 1
    spend = sum(prices.get(n.pool, n.price) for n in live if n.id not in gone_soon)
    cap = policy.spend_cap_per_hour
    quota_inst = inp.quota.instances
    quota_vcpu = inp.quota.vcpu
    quota_ram = inp.quota.ram_mb
    launch_room = policy.max_launches_per_pass
    pool_order = []
    for name, pool in inp.pools.items():
        price = prices.get(name)
        if price is None:
            continue
        pool_order.append((pool_score(pool, price, inp.advisories.get(name, 0), inp.recent_reclaims.get(name, 0)), name))
    pool_order.sort()
    pool_summaries = []
    for name, pool in inp.pools.items():
        hr = inp.headroom.get(name)
        cal = inp.calendars.get(name)
        nxt = None
        if cal:
            now_cap = cal.capacity_at(now)
            for when, c in cal.steps:
                if when > now and c < now_cap:
                    nxt = {"at": when, "capacity": c}
                    break
        price = prices.get(name)
        pool_summaries.append({
            "name": name, "kind": str(pool.kind), "class": str(pool.pool_class), "az": pool.az,
            "shape": pool.shape.to_dict(), "price": price,
            "score": None if price is None else round(pool_score(pool, price, inp.advisories.get(name, 0), inp.recent_reclaims.get(name, 0)), 6),
            "headroom": hr.free if hr else 0, "capacity": hr.capacity if hr else 0,
            "nodes": live_by_pool.get(name, 0), "max_nodes": pool.max_nodes,
            "advisories": inp.advisories.get(name, 0), "recent_reclaims": inp.recent_reclaims.get(name, 0),
            "failed_until": inp.pool_failures.get(name), "no_notice": name in inp.no_notice_pools,
            "calendar_next_drop": nxt,
        })
    block: dict[str, str] = {}  # class key -> last reason it could not be placed
    budget_out = False

    if rc is None:
        for d in demand:
            if remaining[d.key]:
                block[d.key] = "rate card unavailable: no launches without prices"
        explain.append("rate card unavailable: launches are held until prices are known")
        pool_order = []

    planned: dict[str, int] = {}  # pool -> nodes launched by this plan so far
    rounds = ((Priority.REPLACEMENT, [d for d in demand if d.scheduler == REPLACEMENT]),
              (Priority.LAUNCH, [d for d in demand if d.scheduler != REPLACEMENT]))
    for priority, round_demand in rounds:
      for _score, name in pool_order:  # noqa: E111 (one round per priority class)
        pool = inp.pools[name]
        price = prices[name]
        cands = [d for d in round_demand if name in d.pools and remaining[d.key] > 0]
        if not cands:
            continue
        if inp.pool_failures.get(name, 0) > now:
            for d in cands:
                block[d.key] = f"pool {name} failed to launch recently (until {int(inp.pool_failures[name])})"
            explain.append(f"{name}: skipped, launch failed recently")
            continue
        hr = inp.headroom.get(name)
        free = (hr.free if hr else 0) - planned.get(name, 0)
        cal = inp.calendars.get(name)
        existing = live_by_pool.get(name, 0) + planned.get(name, 0)
        limit_left = max(0, pool.max_nodes - existing)
        launched = 0
        units = 0
        segments: list[list] = []  # [nodes, safe_until, longest unit seconds] per packing pattern
        earliest_safe = None
        while True:
            why = None
            if launched >= free:
                why = f"no headroom left in {name}"
            elif launched >= limit_left:
                why = f"pool {name} at its limit of {pool.max_nodes} nodes"
            elif budget_out:
                why = "token budget exhausted for this pass"
            elif launch_room <= 0:
                why = f"at most {policy.max_launches_per_pass} launches per pass"
            elif quota_inst is not None and quota_inst <= 0:
                why = "spot project quota (instances) exhausted"
            elif quota_vcpu is not None and quota_vcpu < pool.shape.vcpu:
                why = "spot project quota (vCPU) exhausted"
            elif quota_ram is not None and quota_ram < pool.shape.ram_mb:
                why = "spot project quota (RAM) exhausted"
            elif cap is not None and spend + price > cap + 1e-9:
                why = f"spend cap {cap}/h reached"
            if why:
                for d in cands:
                    if remaining[d.key]:
                        block[d.key] = why
                break
            n_total = existing + launched + 1
            safe_until = cal.safe_until(n_total, now) if cal else now + 24 * 3600
            if cal and calendar_advisory_due(safe_until, now + pool.boot_seconds, policy):
                # the same rule that cordons a node ahead of a reservation: a node launched now would
                # be cordoned before it is up, and the work meant for it could never land there
                for d in cands:
                    if remaining[d.key]:
                        block[d.key] = (f"calendar: {name} takes capacity back in {int(max(0, safe_until - now))}s; "
                                        f"a node launched now would be cordoned by the calendar advisory "
                                        f"({policy.calendar_advisory_seconds}s ahead) before it boots")
                break
            window = safe_until - now - policy.drain_seconds - pool.boot_seconds
            if name in inp.no_notice_pools:
                window = min(window, policy.no_notice_max_seconds)
                if pool.kind is PoolKind.BAREMETAL:
                    window = min(window, policy.no_notice_max_seconds / 2)
            fits = [d for d in cands if remaining[d.key] > 0]
            pattern = _fill(pool.shape, fits, remaining, window=window)
            if not pattern:
                for d in fits:
                    if d.expected_seconds > window:
                        block[d.key] = (f"calendar: {name} takes capacity back in {int(max(0, safe_until - now))}s, "
                                        f"too soon for {d.expected_seconds}s of work + drain")
                break
            # how many identical nodes: bounded by units, headroom, limits, quota, spend, calendar step
            reps = min(remaining[k] // c for k, c in pattern.items())
            reps = min(reps, free - launched, limit_left - launched, launch_room)
            if quota_inst is not None:
                reps = min(reps, quota_inst)
            if quota_vcpu is not None:
                reps = min(reps, quota_vcpu // max(pool.shape.vcpu, 1))
            if quota_ram is not None:
                reps = min(reps, quota_ram // max(pool.shape.ram_mb, 1))
            if cap is not None:
                reps = min(reps, int((cap - spend + 1e-9) // price) if price > 0 else reps)
            if cal:
                reps = min(reps, _same_window_count(cal, n_total, now))
            reps = max(reps, 1)
            granted = tokens(priority, reps)
            if granted <= 0:
                for d in fits:
                    block[d.key] = "token budget exhausted for this pass"
                explain.append(f"{name}: token budget exhausted")
                budget_out = True
                break
            reps = granted
            for k, c in pattern.items():
                remaining[k] -= c * reps
                units += c * reps
            segments.append([reps, safe_until, max(classes[k].expected_seconds for k in pattern)])
            launched += reps
            launch_room -= reps
            spend += price * reps
            if quota_inst is not None:
                quota_inst -= reps
            if quota_vcpu is not None:
                quota_vcpu -= pool.shape.vcpu * reps
            if quota_ram is not None:
                quota_ram -= pool.shape.ram_mb * reps
            earliest_safe = safe_until if earliest_safe is None else min(earliest_safe, safe_until)
        if launched:
            planned[name] = planned.get(name, 0) + launched
            what = ("replacement capacity for " + ", ".join(sorted({e for d in cands for e in d.examples}))
                    if priority is Priority.REPLACEMENT else f"{units} pending units")
            add("launch", priority,
                f"{what}: {launched} × {name} ({pool.shape.vcpu} vCPU/{pool.shape.ram_mb // 1024} GiB"
                + (f"/{pool.shape.gpus} GPU" if pool.shape.gpus else "") + f") at {price:.3f}/node-hour"
                + (f"; calendar keeps the capacity until {int(earliest_safe - now)}s from now" if earliest_safe and cal and earliest_safe < cal.end else ""),
                pool=name, count=launched, units=units, price=price,
                inputs={"safe_until": earliest_safe, "headroom": free, "score": round(_score, 6),
                        "segments": segments})
            explain.append(f"{name}: launch {launched} for {units} units (score {_score:.4f}, headroom {free}, price {price})")

    for d in demand:
        left = remaining[d.key]
        if left <= 0:
            continue
        if not d.pools:
            reason = "no pool serves it (scheduler binding or node shape)"
        else:
            reason = block.get(d.key, "no pool could take it")
        unplaced[reason] = unplaced.get(reason, 0) + left
        explain.append(f"{d.scheduler} {d.shape.vcpu}c/{d.shape.ram_mb}M/{d.shape.gpus}g ×{left} unplaced: {reason}"
                       + (f" (e.g. {', '.join(d.examples[:3])})" if d.examples else ""))

    # 5: scale down idle nodes, within the disruption budget -----------------
    pending_left = sum(remaining.values())
    idle = [n for n in live if n.id not in gone_soon and n.id not in used_nodes and n.state is NodeState.ACTIVE
            and n.running == 0 and n.idle_since is not None and now - n.idle_since >= policy.idle_ttl_seconds]
    if idle:
        allowed = int(len([n for n in live if n.id not in gone_soon]) * policy.disruption_budget_pct / 100)
        if policy.disruption_budget_pct > 0:
            allowed = max(1, allowed)
        idle.sort(key=lambda n: (-prices.get(n.pool, n.price), n.idle_since, n.id))
        for n in idle[:allowed]:
            if not tokens(Priority.CONSOLIDATION, 1):
                explain.append("scale-down held: token budget")
                break
            add("delete", Priority.CONSOLIDATION,
                f"idle for {int(now - n.idle_since)}s (idle TTL {policy.idle_ttl_seconds}s)", node=n.id, pool=n.pool)
        if len(idle) > allowed:
            explain.append(f"scale-down: {len(idle) - allowed} more idle nodes held by the disruption budget ({policy.disruption_budget_pct}%)")

    total = sum(d.count for d in inp.demand)
    by_sched: dict[str, int] = {}
    for d in inp.demand:
        by_sched[d.scheduler] = by_sched.get(d.scheduler, 0) + d.count
    demand_summary = {
        "pending": total, "by_scheduler": dict(sorted(by_sched.items())), "covered_by_existing_nodes": covered,
        "placed_on_new_nodes": sum(a.units for a in actions if a.kind == "launch"),
        "unplaced": sum(unplaced.values()), "excluded": sum(inp.excluded.values()),
        "excluded_reasons": dict(sorted(inp.excluded.items())), "pending_after_plan": pending_left,
        "classes": [d.to_dict() for d in inp.demand[:50]],  # largest first, with up to 20 unit ids each
    }
    inputs = {**base_inputs, "plan_input_digest": digest, "budget": inp.budget.to_dict(),
              "no_notice_pools": sorted(inp.no_notice_pools)}
    ordered = sorted(enumerate(actions), key=lambda ia: (ia[1].priority, ia[0]))
    actions = [replace(a, id=f"{plan_id}-{i:03d}") for i, (_, a) in enumerate(ordered)]
    return Plan(id=plan_id, region=inp.region, now=now, actions=tuple(actions), unplaced=dict(sorted(unplaced.items())),
                pools=pool_summaries, demand=demand_summary, inputs=inputs, explain=tuple(explain),
                excluded=tuple({"unit": u, "scheduler": sch, "reason": r} for u, sch, r in inp.exclusions))


def calendar_advisory_due(reclaim_at: float, at: float, policy: Policy) -> bool:
    """Whether a reservation taking capacity back at ``reclaim_at`` is, at time ``at``, close enough for
    its calendar advisory (cordon, then the graduated response): ``calendar_advisory_seconds`` ahead.
    One rule for both uses: housekeeping cordons nodes by it, and launching skips capacity that it
    would cordon before a new node could take work."""
    return reclaim_at - at <= policy.calendar_advisory_seconds


def node_protection(reclaim_at: float | None, now: float, policy: Policy,
                    longest_seconds: int) -> tuple[float | None, bool]:
    """By when work on a node must end, and whether no new work may start at all.

    ``reclaim_at``: when a reservation takes the node's host (None: nothing does). Work must end before
    the calendar advisory's drain stage begins (``drain_seconds + advisory_drain_margin_seconds`` ahead),
    or it would be requeued. ``closed`` when what is left of that window is shorter than the longest work
    that could land (``longest_seconds``): a scheduler that knows no durations (Kubernetes) must then take
    no new work there; one that does (Slurm) judges each job by its time limit against ``until``."""
    if reclaim_at is None:
        return None, False
    until = reclaim_at - policy.drain_seconds - policy.advisory_drain_margin_seconds
    return until, until - now < longest_seconds


def advisory_stage(notice: Notice, now: float, policy: Policy) -> str:
    """Where the graduated response to an advisory stands: cordon → prespin → drain, or expired.

    With a deadline (a calendar reclaim, a lease start) the stages run back from
    it, so that the node is empty before the provider's hard notice; without
    one they run forward from the advisory, and give up after the time box.
    """
    if notice.deadline is not None:
        left = notice.deadline - now
        if left <= policy.drain_seconds + policy.advisory_drain_margin_seconds:
            return "drain"
        if left <= policy.advisory_prespin_lead_seconds:
            return "prespin"
        return "cordon"
    age = now - notice.issued_at
    if age >= policy.advisory_timeout_seconds:
        return "expired"
    if age >= policy.advisory_drain_seconds:
        return "drain"
    if age >= policy.advisory_prespin_seconds:
        return "prespin"
    return "cordon"


def _fill(room: Shape, cands: list[DemandClass], remaining: dict[str, int], window: float | None) -> dict[str, int]:
    """Greedy fill of one node's room: class key -> units (largest first, as sorted)."""
    pattern: dict[str, int] = {}
    for d in cands:
        left = remaining[d.key]
        if left <= 0 or (window is not None and d.expected_seconds > window):
            continue
        if not d.shape.fits_in(room):
            continue
        if d.shape == Shape():
            continue
        k = min(left, d.shape.count_in(room))
        if k <= 0:
            continue
        pattern[d.key] = k
        room = room - d.shape.times(k)
    return pattern


def _same_window_count(cal: Calendar, n: int, now: float) -> int:
    """How many more nodes (from the n-th on) share the n-th node's safe window."""
    levels = sorted({c for _, c in cal.steps if c >= n})
    if not levels:
        return 1
    return max(1, levels[0] - n + 1)
