"""The outbox relay: lifecycle events to Kafka, audit records to the audit log service.

The outbox rows are written in the same SQLite transaction as the state change
they describe (``spotctl.state.store``). This step delivers them:

- **in order**: rows of a kind go out in outbox-id order, batch after batch; a
  batch is only started once the previous one was acknowledged, so each key's
  rows (a node's events, the audit chain) keep their order at the destination;
- **at least once, deduplicated downstream**: a row is marked delivered only
  after the destination acknowledged it (Kafka: ``acks=all`` and, where the
  broker supports them, a committed transaction; audit service: a per-record
  ``created``/``duplicate`` result). A crash between the acknowledgement and the
  mark re-sends the row on the next pass: the audit service drops it by its
  idempotency key (the record id); Kafka consumers drop it by the CloudEvents
  ``id`` (see ``spotctl.adapters.kafka``; with ``isolation_level=read_committed``
  they also never see a batch whose transaction a crash left open);
- **bounded, and off the pass lock**: an unavailable destination costs one
  attempt per pass (the audit client's ``timeout_seconds``; Kafka's
  ``max_wait_seconds``), made after the pass lock is released; its rows stay
  queued and the next pass tries again;
- **never silently weaker**: an outlet that can run in more than one delivery
  mode (Kafka: ``transactional``, ``idempotent``, ``acks-all``) says which one
  it used (``mode``) and, when that is weaker than its configuration asks,
  why (``degraded``). The relay keeps the last mode seen in the store
  (``kv`` key ``relay.<destination>.mode``) for ``spotctl status`` and the
  metrics, and reports a degraded mode seen in this pass in
  :attr:`RelayReport.degraded` (the pass is then ``partial``).

**The duplicate bound.** Batches of a kind go out one at a time, and a batch is
marked delivered right after its acknowledgement, so a crash (or a failed
acknowledgement) re-sends at most the one batch that was in flight. With a
transactional producer a batch whose transaction did not commit is never
visible to ``read_committed`` consumers, so the only duplicates they can see
come from a crash between the commit and the outbox mark: at most
``batch_size`` duplicate events per relay crash, each a byte-identical copy of
an event already delivered (same CloudEvents ``id``, key and payload), and 0
after the consumer's dedupe by ``id``. Without transactions the same bound
holds per crash *and* per failed delivery (a batch that failed halfway can
have reached the topic in part).

A region without ``[regions.R.kafka]`` / ``[regions.R.audit]`` does not queue
that kind at all (:func:`queued_kinds`, given to the store when the runtime is
wired): no row would ever be delivered or pruned; ``spotctl status`` says
"not queued: no relay configured". Rows queued before (an older spotctl, or a
relay since removed) stay queued: nothing is lost, and the pass is not degraded
for it. The pending counts read each pass cost a few index seeks whatever the
outbox holds (:meth:`spotctl.state.outbox.Outbox.outbox_pending`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from spotctl.core.config import RegionConfig
from spotctl.core.errors import SpotctlError
from spotctl.state.store import Store

log = logging.getLogger(__name__)

# outbox kind -> the region config table (and outlet name) that delivers it
DESTINATIONS: dict[str, str] = {"event": "kafka", "audit": "audit"}
DEFAULT_BATCH = 500


def queued_kinds(region: RegionConfig) -> frozenset[str]:
    """The outbox kinds a region queues: those whose destination it configures (``[kafka]``, ``[audit]``)."""
    return frozenset(kind for kind, dest in DESTINATIONS.items() if region.section(dest) is not None)


@runtime_checkable
class Outlet(Protocol):
    """A destination for outbox rows (``spotctl.adapters.kafka``, ``spotctl.adapters.audit_http``)."""

    def deliver(self, rows: list[tuple[str, str]]) -> int:
        """Send ``(key, payload JSON)`` rows in order; return how many leading rows were acknowledged.

        Raise a :class:`SpotctlError` (``UnavailableError``/``TemporaryError``/``AuthError``) when
        none was, after waiting at most the outlet's own bound. When it returns fewer than all,
        ``last_error`` (if the outlet has it) says why the next row was refused.
        """

    def close(self) -> None: ...


@dataclass
class DestinationReport:
    destination: str
    configured: bool
    queued: bool = True  # the store queues this kind (else: no relay configured, no row written)
    delivered: int = 0
    pending: int = 0
    oldest_pending_age_s: float | None = None
    error: str | None = None
    seconds: float = 0.0
    mode: str | None = None  # the outlet's delivery mode: seen in this pass, or the last one recorded
    degraded: str | None = None  # why that mode is weaker than the configuration asks
    mode_seen_at: float | None = None
    mode_seen_now: bool = False  # the outlet connected in this pass (else: the last recorded mode)

    def to_dict(self) -> dict:
        return {"destination": self.destination, "configured": self.configured, "queued": self.queued,
                "delivered": self.delivered,
                "pending": self.pending, "oldest_pending_age_s": self.oldest_pending_age_s, "error": self.error,
                "seconds": round(self.seconds, 4), "mode": self.mode, "degraded": self.degraded,
                "mode_seen_at": self.mode_seen_at}


@dataclass
class RelayReport:
    kinds: dict[str, DestinationReport] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, str]:
        """Configured destinations that could not take everything: destination -> why."""
        return {r.destination: r.error for r in self.kinds.values() if r.configured and r.error}

    @property
    def degraded(self) -> dict[str, str]:
        """Destinations whose outlet ran in a weaker mode than configured in this pass: destination -> why."""
        return {r.destination: r.degraded for r in self.kinds.values() if r.mode_seen_now and r.degraded}

    def to_dict(self) -> dict:
        return {kind: r.to_dict() for kind, r in self.kinds.items()}


def relay(store: Store, outlets: Mapping[str, Outlet], *, now: Callable[[], float], configured: set[str] | None = None,
          batch_size: int = DEFAULT_BATCH, max_rows: int | None = None) -> RelayReport:
    """Deliver every pending outbox row whose destination has an outlet; stop a kind at its first failure.

    ``configured`` names the destinations the region configures (default: those with an outlet); a
    configured destination without an outlet is reported as an error rather than silently skipped.
    """
    configured = set(outlets) if configured is None else configured
    report = RelayReport()
    for kind, dest in DESTINATIONS.items():
        r = report.kinds[kind] = DestinationReport(dest, configured=dest in configured, queued=store.queues(kind))
        outlet = outlets.get(dest)
        if outlet is None:
            if r.configured:
                r.error = f"[{dest}] is configured but this entry point built no relay for it"
        else:
            t0 = time.perf_counter()
            try:
                size = int(getattr(outlet, "batch_size", None) or batch_size)
                r.delivered, r.error = _drain(store, kind, outlet, now, max(1, size), max_rows)
            finally:
                r.seconds = time.perf_counter() - t0
            _note_mode(store, r, outlet, now())
        r.pending, oldest = store.outbox_pending(kind, repair_at=now())
        r.oldest_pending_age_s = None if oldest is None else round(max(0.0, now() - oldest), 3)
        if r.error:
            log.warning("relay to %s: %s (%d rows stay queued)", dest, r.error, r.pending)
    return report


def outbox_queues(store: Store, now: float) -> dict[str, dict]:
    """Per outbox kind: its destination, whether the store queues it (a relay is configured), and its pending
    rows with the age of the oldest (a few index seeks each: ``spotctl status``)."""
    out = {}
    for kind, dest in DESTINATIONS.items():
        pending, oldest = store.outbox_pending(kind)
        out[kind] = {"destination": dest, "queued": store.queues(kind), "pending": pending,
                     "oldest_pending_at": oldest,
                     "oldest_pending_age_s": None if oldest is None else round(max(0.0, now - oldest), 3)}
    return out


def mode_key(destination: str) -> str:
    return f"relay.{destination}.mode"


def last_modes(store: Store) -> dict[str, dict]:
    """The last delivery mode recorded per destination: {"kafka": {"mode", "degraded", "seen_at"}}."""
    out = {}
    for dest in DESTINATIONS.values():
        raw = store.get_value(mode_key(dest))
        if raw:
            out[dest] = json.loads(raw)
    return out


def _note_mode(store: Store, r: DestinationReport, outlet: Outlet, at: float) -> None:
    mode = getattr(outlet, "mode", None)
    if mode is not None:  # the outlet connected in this pass: record what it saw
        r.mode, r.degraded, r.mode_seen_at, r.mode_seen_now = mode, getattr(outlet, "degraded", None), at, True
        store.set_value(mode_key(r.destination), json.dumps({"mode": mode, "degraded": r.degraded, "seen_at": at}), at)
        # (the outlet itself logs the warning when it picks a degraded mode)
    else:
        last = last_modes(store).get(r.destination)
        if last:
            r.mode, r.degraded, r.mode_seen_at = last["mode"], last["degraded"], last["seen_at"]


def _drain(store: Store, kind: str, outlet: Outlet, now: Callable[[], float], batch_size: int,
           max_rows: int | None) -> tuple[int, str | None]:
    delivered = 0
    after = 0
    while max_rows is None or delivered < max_rows:
        limit = batch_size if max_rows is None else min(batch_size, max_rows - delivered)
        batch = store.pending_batch(kind, limit, after)
        if not batch:
            return delivered, None
        try:
            n = outlet.deliver([(key, payload) for _, key, payload in batch])
        except SpotctlError as e:
            return delivered, e.message
        n = max(0, min(n, len(batch)))
        if n:
            store.mark_delivered([row[0] for row in batch[:n]], now())
            delivered += n
            after = batch[n - 1][0]
        if n < len(batch):
            why = getattr(outlet, "last_error", None) or "the destination did not acknowledge it"
            return delivered, f"row {batch[n][0]} (key {batch[n][1]}) refused: {why}"
    return delivered, None
