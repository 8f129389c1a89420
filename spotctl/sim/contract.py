"""The provider contract feed: rate card, notices and advisories, reclaim API.

:class:`Provider` holds the notices; :class:`SimContract` is the
:class:`ContractPort` face of it (plus :meth:`SimContract.reclaim`, the
provider's reclaim API that drills call). Just over 400 lines because it is
one thing: the notice life cycle (issue, escalate, expire, deliver) on one set
of records.

Notices come from two sources:

* the **calendar**: a lease takes hosts at ``start − cleaning``. Instances on
  those hosts get a ``calendar`` notice as soon as the lease exists, an
  ``advisory`` ``advisory_lead_seconds`` before, and a ``hard`` notice with a
  lead of ``hard_lead`` (150–300 s) before the deadline. At the deadline the
  provider deletes what is still there.
* **on-demand surges** at random (``surges_per_day``): an advisory for the
  instances of one host, which clears after ``advisory_ttl`` unless a hard
  notice (``surge_hard_probability``, lead ``surge_hard_lead`` ≥ 120 s) follows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from spotctl.core.errors import NotFoundError
from spotctl.core.models import Notice, NoticeKind, PoolClass, PoolKind, PoolSpec, RateCard, Reclaim, ReclaimReceipt
from spotctl.core.timefmt import iso as _iso

from .rng import diurnal, keyed, mix, poisson, stable_int

if TYPE_CHECKING:  # pragma: no cover
    from .cloud import Lease, SimInstance
    from .world import SimWorld

_KINDS = {k.value: k for k in NoticeKind}


def base_price(pool: PoolSpec) -> float:
    """List price per node-hour (EUR) before time-of-day and noise."""
    s = pool.shape
    price = s.vcpu * 0.02 + (s.ram_mb / 1024.0) * 0.003 + s.gpus * 1.6
    if pool.kind is PoolKind.BAREMETAL:
        price *= 1.15
    if pool.pool_class is PoolClass.RESERVED_IDLE:
        price *= 0.7
    return price


def iso(t: float) -> str:
    """Notice reasons name times to the second (:func:`spotctl.core.timefmt.iso`)."""
    return _iso(t) or "-"


class NoticeRec:
    __slots__ = ("id", "instance_id", "kind", "issued_at", "deadline", "reason", "pool", "expires_at",
                 "source", "ref", "view")

    def __init__(self, id: str, instance_id: str, kind: str, issued_at: float, deadline: float | None,
                 reason: str, pool: str, expires_at: float | None, source: str, ref: str):
        self.id = id
        self.instance_id = instance_id
        self.kind = kind
        self.issued_at = issued_at
        self.deadline = deadline
        self.reason = reason
        self.pool = pool
        self.expires_at = expires_at
        self.source = source  # calendar | surge | reclaim
        self.ref = ref  # lease id, host name or drill reason
        # The provider's receipt that the node agent got it: 50-350 ms after issue, stable per notice.
        delivered = issued_at + 0.05 + (stable_int("delivery", id) % 300) / 1000.0
        self.view = Notice(id=id, instance_id=instance_id, kind=_KINDS[kind], issued_at=issued_at,
                           deadline=deadline, reason=reason, pool=pool, delivered_at=delivered)

    def dump(self) -> list:
        return [self.id, self.instance_id, self.kind, self.issued_at, self.deadline, self.reason, self.pool,
                self.expires_at, self.source, self.ref]

    @classmethod
    def load(cls, d: list) -> "NoticeRec":
        return cls(*d)


class Provider:
    """Notices in force, the surge process, prices."""

    def __init__(self, world: "SimWorld"):
        self.w = world
        self.notices: dict[str, NoticeRec] = {}
        self.by_inst: dict[str, list[NoticeRec]] = {}
        self.counter = 0
        self.surge_cursor: int | None = None  # next hour slot to plan
        self._base = {name: base_price(p) for name, p in world.pools.items()}
        self._pkey = {name: stable_int(world.seed, "price", name) for name in world.pools}
        self._prices: dict[tuple[str, int], float] = {}
        self._pinned: dict[tuple[str, int], float] = {}  # what-if prices (pin_price), kept apart from the cache
        self._card: RateCard | None = None

    # --- rate card -----------------------------------------------------------

    def pin_price(self, pool: str, slot: int, price: float) -> None:
        """What-if: the rate card of ``slot`` (``rate_card_seconds`` long, counted from the epoch) quotes
        ``price`` for ``pool`` (a spike, a drop, an oscillation), whatever the model says. In memory only: a
        saved world does not keep it."""
        if pool not in self.w.pools:
            raise NotFoundError(f"unknown pool {pool!r}")
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
            raise ValueError(f"a price is a finite number >= 0, not {price!r}")
        self._pinned[(pool, slot)] = round(float(price), 4)
        if self._card is not None and self._card.version == f"rc-{slot}":
            self._card = None  # made again with the pinned price

    def price(self, pool: str, slot: int) -> float:
        pinned = self._pinned.get((pool, slot))
        if pinned is not None:
            return pinned
        p = self._prices.get((pool, slot))
        if p is None:
            if len(self._prices) > 50000:
                self._prices.clear()
            k = self.w.knobs
            t = slot * k.rate_card_seconds
            base = self._base.get(pool, 0.0)
            noise = 2.0 * mix(self._pkey.get(pool, 0), slot) - 1.0
            p = base * (1.0 + k.price_diurnal * diurnal(t, 15.0) + k.price_noise * noise)
            if k.price_swing_ticks > 0 and k.price_swing:  # spikes and drops, a block of ticks at a time
                p *= 1.0 + k.price_swing * (2.0 * mix(self._pkey.get(pool, 0), slot // k.price_swing_ticks, 7) - 1.0)
            p = round(p, 4)
            self._prices[(pool, slot)] = p
        return p

    def rate_card(self) -> RateCard:
        w = self.w
        length = w.knobs.rate_card_seconds
        slot = int(w.now // length)
        card = self._card
        if card is None or card.version != f"rc-{slot}":
            card = self._card = RateCard(
                version=f"rc-{slot}", currency=w.region.policy.currency,
                prices={name: self.price(name, slot) for name in sorted(w.pools)},
                valid_from=float(slot * length), valid_until=float((slot + 1) * length))
        return RateCard(card.version, card.currency, dict(card.prices), card.valid_from, card.valid_until)

    # --- notices -------------------------------------------------------------

    def views(self) -> list[Notice]:
        now = self.w.now
        return [n.view for n in self.notices.values()
                if n.issued_at <= now and (n.expires_at is None or n.expires_at > now)]

    def _issue(self, inst: "SimInstance", kind: str, deadline: float | None, reason: str, source: str, ref: str,
               expires_at: float | None = None) -> NoticeRec:
        w = self.w
        self.counter += 1
        rec = NoticeRec(f"ntc-{self.counter:06d}", inst.id, kind, w.now, deadline, reason, inst.pool,
                        expires_at, source, ref)
        self.notices[rec.id] = rec
        self.by_inst.setdefault(inst.id, []).append(rec)
        w.stats["notices_" + kind] += 1
        if kind == "hard" and deadline is not None:
            # An advisory followed by a hard notice stays until the instance is gone.
            for other in self.by_inst[inst.id]:
                if other.kind == "advisory" and other.expires_at is not None:
                    other.expires_at = None
            w.push(deadline, "deadline", rec.id)
        elif expires_at is not None:
            w.push(expires_at, "expire", rec.id)
        return rec

    def _has(self, iid: str, kind: str, ref: str | None = None) -> bool:
        return any(n.kind == kind and (ref is None or n.ref == ref) for n in self.by_inst.get(iid, ()))

    def _drop(self, rec: NoticeRec) -> None:
        self.notices.pop(rec.id, None)
        lst = self.by_inst.get(rec.instance_id)
        if lst is not None:
            lst[:] = [n for n in lst if n is not rec]
            if not lst:
                del self.by_inst[rec.instance_id]

    def on_expire(self, nid: str) -> None:
        rec = self.notices.get(nid)
        if rec is not None and rec.expires_at is not None and rec.expires_at <= self.w.now:
            self._drop(rec)

    def on_deadline(self, nid: str) -> None:
        rec = self.notices.get(nid)
        if rec is not None and rec.kind == "hard":
            self._enforce(rec)

    def _enforce(self, rec: NoticeRec) -> None:
        """The deadline of a hard notice: score it, then take the instance back."""
        w = self.w
        self._drop(rec)
        inst = w.fleet.instances.get(rec.instance_id)
        if inst is None or not inst.alive:
            return
        if w.cluster.drained_everywhere(inst.name, inst.id, rec.deadline):
            w.stats["notices_handled"] += 1
        else:
            w.stats["notices_missed"] += 1
        w.fleet.delete(inst.id, cause="reclaimed")

    def instance_created(self, inst: "SimInstance") -> None:
        """Calendar notices (and an advisory when close) for a new instance on a leased host."""
        h = self.w.fleet.hosts.get(inst.host)
        if h is None:
            return
        for lease in h.leases:
            if lease.deadline > self.w.now:
                self._calendar_for(inst, lease)
                if lease.deadline - self.w.knobs.advisory_lead_seconds <= self.w.now:
                    self._advise_for(inst, lease)

    def instance_gone(self, inst: "SimInstance", cause: str) -> None:
        """The instance is gone: all its notices end; deleted by us in time = handled."""
        for rec in list(self.by_inst.get(inst.id, ())):
            if (cause == "deleted" and rec.kind == "hard" and rec.deadline is not None
                    and self.w.now <= rec.deadline):
                self.w.stats["notices_handled"] += 1
            self._drop(rec)

    # --- calendar-driven -----------------------------------------------------

    def _calendar_for(self, inst: "SimInstance", lease: "Lease") -> None:
        if not self._has(inst.id, "calendar", lease.id):
            self._issue(inst, "calendar", lease.deadline,
                        f"reservation {lease.id} takes host {inst.host} at {iso(lease.deadline)}",
                        "calendar", lease.id, expires_at=lease.deadline)

    def _advise_for(self, inst: "SimInstance", lease: "Lease") -> None:
        if not self._has(inst.id, "advisory", lease.id):
            self._issue(inst, "advisory", lease.deadline,
                        f"reservation {lease.id} reclaims host {inst.host} at {iso(lease.deadline)}",
                        "calendar", lease.id, expires_at=None)

    def lease_created(self, lease: "Lease") -> None:
        w = self.w
        k = w.knobs
        now = w.now
        for name in lease.hosts:
            for inst in w.fleet.alive_on(name):
                self._calendar_for(inst, lease)
                if lease.deadline - k.advisory_lead_seconds <= now:
                    self._advise_for(inst, lease)
        if lease.deadline - k.advisory_lead_seconds > now:
            w.push(lease.deadline - k.advisory_lead_seconds, "lease_adv", lease.id)
        w.push(max(now, lease.deadline - k.hard_lead[1]), "lease_hard", lease.id)
        w.push(max(now, lease.deadline), "lease_block", lease.id)
        end = lease.end + (lease.start - lease.deadline)
        w.push(max(now, end), "lease_end", lease.id)

    def on_lease_adv(self, lid: str) -> None:
        lease = self.w.fleet.leases.get(lid)
        if lease is None:
            return
        for name in lease.hosts:
            for inst in self.w.fleet.alive_on(name):
                self._advise_for(inst, lease)

    def on_lease_hard(self, lid: str) -> None:
        w = self.w
        lease = w.fleet.leases.get(lid)
        if lease is None:
            return
        lo, hi = w.knobs.hard_lead
        for name in lease.hosts:
            for inst in w.fleet.alive_on(name):
                lead = keyed(w.seed, "lead", lid, inst.id).uniform(lo, hi)
                w.push(max(w.now, lease.deadline - lead), "hard_issue", inst.id, lease.deadline, "calendar", lid)

    def on_hard_issue(self, iid: str, deadline: float, source: str, ref: str) -> None:
        w = self.w
        inst = w.fleet.instances.get(iid)
        if inst is None or not inst.alive or self._has(iid, "hard"):
            return
        if deadline < 0:  # a lead, not a deadline (surges decide it when they fire)
            deadline = w.now - deadline
        late = w.knobs.late_notice_lead
        if inst.pool in w.knobs.late_notice_pools and deadline - w.now > late:
            # a degraded contract: the notice comes late, ``late_notice_lead`` before the same deadline
            w.push(deadline - late, "hard_issue", iid, deadline, source, ref)
            return
        if source == "calendar":
            reason = f"reservation {ref} reclaims host {inst.host}: delete by {iso(deadline)}"
        else:
            reason = f"on-demand surge on host {ref}: delete by {iso(deadline)}"
        self._issue(inst, "hard", deadline, reason, source, ref)

    def on_lease_block(self, lid: str) -> None:
        """The lease's capacity leaves the spot pool: whatever is still there is taken."""
        w = self.w
        lease = w.fleet.leases.get(lid)
        if lease is None:
            return
        w.fleet.version += 1
        for name in lease.hosts:
            for inst in w.fleet.alive_on(name):
                hard = [n for n in self.by_inst.get(inst.id, ()) if n.kind == "hard"]
                if hard:
                    self._enforce(hard[0])
                else:
                    w.stats["nodes_lost_without_notice"] += 1
                    w.fleet.delete(inst.id, cause="reclaimed")

    # --- surges --------------------------------------------------------------

    def surges_per_day(self) -> float:
        k = self.w.knobs
        if k.surges_per_day is not None:
            return k.surges_per_day
        return 4.0 * max(1.0, len(self.w.fleet.hosts) / 45.0)

    def plan_surges(self, upto: float) -> None:
        """Schedule the surge events of every hour slot that starts before ``upto``."""
        w = self.w
        if self.surge_cursor is None:
            self.surge_cursor = int(w.now // 3600)
        lam = self.surges_per_day() / 24.0
        while self.surge_cursor * 3600 <= upto:
            h = self.surge_cursor
            r = keyed(w.seed, "surge-plan", h)
            for i in range(poisson(r, lam)):
                t = h * 3600 + r.random() * 3600
                if t >= w.now:
                    w.push(t, "surge", h, i)
            self.surge_cursor += 1

    def on_surge(self, hour: int, i: int) -> None:
        w = self.w
        k = w.knobs
        hosts = sorted({inst.host for inst in w.fleet.instances.values() if inst.status == "ACTIVE"})
        if not hosts:
            return
        r = keyed(w.seed, "surge", hour, i)
        host = r.choice(hosts)
        insts = sorted((x for x in w.fleet.alive_on(host) if x.status == "ACTIVE"), key=lambda x: (x.created_at, x.id))
        if not insts:
            return
        w.stats["surges"] += 1
        ttl = r.uniform(*k.advisory_ttl)
        for inst in insts:
            self._issue(inst, "advisory", None, f"on-demand surge on host {host}: reclaim risk is high",
                        "surge", host, expires_at=w.now + ttl)
        if r.random() < k.surge_hard_probability:
            victim = insts[-1]
            delay = r.uniform(*k.surge_hard_delay)
            lead = r.uniform(*k.surge_hard_lead)
            for rec in self.by_inst.get(victim.id, ()):
                if rec.kind == "advisory" and rec.source == "surge" and rec.ref == host:
                    rec.expires_at = None  # followed by a hard notice
            w.push(w.now + delay, "hard_issue", victim.id, -lead, "surge", host)

    # --- reclaim API -----------------------------------------------------------

    def reclaim(self, instance_id: str, lead_seconds: float, reason: str, advisory_lead_seconds: float = 0.0) -> Notice:
        """A hard notice now with ``lead_seconds`` of lead; with an advisory lead, an advisory now and
        the hard notice ``advisory_lead_seconds`` later. Returns the first notice issued."""
        w = self.w
        inst = w.fleet.instances.get(instance_id)
        if inst is None or not inst.alive:
            raise NotFoundError(f"no live instance {instance_id!r} in the simulated region")
        for rec in self.by_inst.get(instance_id, ()):
            if rec.kind == "hard" or (rec.kind == "advisory" and rec.source == "reclaim"):
                return rec.view
        w.stats["reclaims"] += 1
        if advisory_lead_seconds > 0:
            due = w.now + float(advisory_lead_seconds)
            adv = self._issue(inst, "advisory", due + float(lead_seconds),
                              f"{reason}: a hard notice follows at {iso(due)}", "reclaim", reason)
            w.push(due, "reclaim_hard", instance_id, float(lead_seconds), reason)
            return adv.view
        return self._issue(inst, "hard", w.now + float(lead_seconds),
                           f"{reason}: delete by {iso(w.now + float(lead_seconds))}", "reclaim", reason).view

    def on_reclaim_hard(self, instance_id: str, lead_seconds: float, reason: str) -> None:
        """The hard notice of a reclaim that was announced by an advisory first."""
        w = self.w
        inst = w.fleet.instances.get(instance_id)
        if inst is None or not inst.alive or self._has(instance_id, "hard"):
            return
        self._issue(inst, "hard", w.now + lead_seconds, f"{reason}: delete by {iso(w.now + lead_seconds)}",
                    "reclaim", reason)

    # --- persistence -----------------------------------------------------------

    def dump(self) -> dict:
        return {"notices": [n.dump() for n in self.notices.values()], "counter": self.counter,
                "surge_cursor": self.surge_cursor}

    def load(self, d: dict) -> None:
        self.counter = d["counter"]
        self.surge_cursor = d["surge_cursor"]
        for row in d["notices"]:
            rec = NoticeRec.load(row)
            self.notices[rec.id] = rec
            self.by_inst.setdefault(rec.instance_id, []).append(rec)


class SimContract:
    """The :class:`~spotctl.core.ports.ContractPort` of the demo region."""

    provides_notices = True

    def __init__(self, world: "SimWorld"):
        self._w = world

    def rate_card(self) -> RateCard:
        return self._w.provider.rate_card()

    def notices(self) -> list[Notice]:
        return self._w.provider.views()

    def status(self) -> dict:
        """The in-process provider's own view of its reclaim API (called by the contract check: an
        answer is the evidence that the API is there)."""
        live = sum(1 for i in self._w.fleet.instances.values() if i.alive)
        return {"terms": [{"term": "reclaim_api", "state": "met", "evidence": {"live_instances": live}}]}

    def reclaim(self, instance_ids: list[str], notice_seconds: int, advisory_lead_seconds: int = 0,
                drill_id: str | None = None) -> Reclaim:
        """:class:`~spotctl.core.ports.ReclaimPort`: the provider's reclaim API, in the simulated region."""
        w = self._w
        reason = f"reclaim drill {drill_id}" if drill_id else "reclaim drill"
        receipts = []
        try:
            for iid in instance_ids:
                try:
                    n = w.provider.reclaim(iid, float(notice_seconds), reason, float(advisory_lead_seconds))
                except NotFoundError as e:
                    receipts.append(ReclaimReceipt(instance_id=iid, error=e.message))
                    continue
                hard = n.kind is NoticeKind.HARD
                receipts.append(ReclaimReceipt(instance_id=iid, notice_id=n.id if hard else None,
                                               advisory_id=None if hard else n.id))
        finally:
            w.changed()
        return Reclaim(id=f"sim-rcl-{w.provider.counter:06d}", instances=tuple(receipts))
