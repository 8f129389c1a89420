"""Prometheus metrics of a region, with ``prometheus_client``: a collector that reads the state database,
the textfile a pass writes for node_exporter's textfile collector, and the ``/metrics`` endpoint of the
watcher. Families and their meaning: :mod:`spotctl.core.metrics` and ``docs/metrics.md``.

The collector reads what is recorded — kept counters, live nodes, the outbox, the token bucket, the last
pass's view of the pools — and observes nothing itself: a scrape makes no call to a cloud or scheduler
and takes no lock. A scrape from another thread (the watcher's HTTP server) opens the database on its own
connection for the scrape.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from spotctl.core.drill import ENDED_STATES
from spotctl.core.metrics import (
    BY_NAME,
    FAMILIES,
    PASS_GAUGES_KEY,
    Family,
    cumulative,
    parse_series_key,
    pass_gauges,
    spend,
)
from spotctl.core.models import NodeState

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from spotctl.state.store import Store

    from .observe import Snapshot
    from .runtime import Runtime

log = logging.getLogger(__name__)

#: the live node states (every pool has a spotctl_nodes series for each, 0 included)
LIVE = tuple(s for s in NodeState if s.value not in ENDED_STATES)
#: outbox kind -> the destination its relay delivers to (the label of the outbox families)
DESTINATION = {"event": "kafka", "audit": "audit"}


def record_pass_view(rt: Runtime, snap: Snapshot, contract: dict | None) -> None:
    """Keep the gauges of what this pass observed of its pools (headroom, forward calendar, prices, contract
    terms) for the exporters: one kv row, replaced each pass."""
    rc = snap.rate_card
    view = pass_gauges(now=snap.now, pools=rt.region.pools, headroom=snap.headroom, calendars=snap.calendars,
                       prices=rc.prices if rc else None, currency=rc.currency if rc else None, contract=contract)
    rt.store.set_value(PASS_GAUGES_KEY, json.dumps(view, sort_keys=True), snap.now)


def families(store: Store, region: Any, now: float) -> list[Any]:
    """Every family of a region's pass metrics (``prometheus_client`` metric families), read from ``store``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    r = region.name
    made: dict[str, Any] = {}

    def fam(name: str) -> Any:
        if name not in made:
            f = BY_NAME[name]
            labels = ["region", *f.labels]
            cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                   "histogram": HistogramMetricFamily}[f.type]
            made[name] = cls(f.name, f.help, labels=labels)
        return made[name]

    # kept counters and histograms
    hist: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for key, value in sorted(store.metric_series().items()):
        sample, labels = parse_series_key(key)
        f, part = _family_of(sample)
        if f is None or f.source != "pass":
            continue
        if f.type == "counter":
            fam(f.name).add_metric([r, *(labels.get(k, "") for k in f.labels)], value)
            continue
        le = labels.pop("le", None)
        h = hist.setdefault((f.name, tuple(sorted(labels.items()))), {"buckets": {}, "sum": 0.0, "count": 0.0})
        if part == "bucket" and le is not None:
            h["buckets"][le] = value
        elif part == "sum":
            h["sum"] = value
    for (name, labels_t), h in sorted(hist.items()):
        f = BY_NAME[name]
        labels = dict(labels_t)
        fam(name).add_metric([r, *(labels.get(k, "") for k in f.labels)], cumulative(f, h["buckets"]), h["sum"])

    # the last pass
    last = store.last_pass()
    if last is not None and last.get("finished_at") is not None:
        fam("spotctl_last_pass_timestamp_seconds").add_metric([r], float(last["finished_at"]))
        fam("spotctl_last_pass_ok").add_metric([r], 1.0 if last["status"] == "ok" else 0.0)

    # the token budget
    policy = region.policy
    b = store.bucket(region.budget.rate, region.budget.burst, now)
    fam("spotctl_budget_tokens_used").add_metric([r], float(store.tokens_used_total()))
    fam("spotctl_budget_tokens_left").add_metric([r], float(b.tokens))
    fam("spotctl_budget_tokens_burst").add_metric([r], float(b.burst))

    # live nodes by pool and state (every configured pool and live state, 0 included), and their spend
    counts: dict[tuple[str, str], int] = {(p, s.value): 0 for p in region.pools for s in LIVE}
    per_pool: dict[str, list] = {}
    for pool, st, n, price in store.live_node_summary():  # one GROUP BY, whatever the fleet's size
        counts[(pool, st)] = n
        agg = per_pool.setdefault(pool, [pool, 0, 0.0])
        agg[1] += n
        agg[2] += price
    for (pool, st), c in sorted(counts.items()):
        fam("spotctl_nodes").add_metric([r, pool, st], float(c))
    for name, pool in sorted(region.pools.items()):
        fam("spotctl_pool_max_nodes").add_metric([r, name], float(pool.max_nodes))

    # what the last pass observed of its pools
    raw = store.get_value(PASS_GAUGES_KEY)
    view = _view(raw, store)
    currency = view.get("currency") or policy.currency
    for pool, p in sorted((view.get("pools") or {}).items()):
        if pool not in region.pools:
            continue  # a pool since removed from the configuration
        for key, family in (("headroom", "spotctl_pool_headroom_nodes"), ("capacity", "spotctl_pool_capacity_nodes"),
                            ("forward", "spotctl_pool_forward_nodes"), ("next_drop_nodes", "spotctl_pool_next_drop_nodes"),
                            ("next_drop_at", "spotctl_pool_next_drop_timestamp_seconds")):
            if isinstance(p.get(key), (int, float)):
                fam(family).add_metric([r, pool], float(p[key]))
        if isinstance(p.get("price"), (int, float)):
            fam("spotctl_pool_price_per_hour").add_metric([r, pool, str(currency)], float(p["price"]))
        for term, st in sorted((p.get("terms") or {}).items()):
            fam("spotctl_contract_term").add_metric([r, pool, term, str(st)], 1.0)
    on_demand = {name: _on_demand(pool) for name, pool in region.pools.items()}
    s = spend([tuple(v) for v in per_pool.values()], on_demand)
    fam("spotctl_spend_per_hour").add_metric([r, str(currency)], float(s["spend"] or 0.0))
    if s["on_demand"] is not None:
        fam("spotctl_on_demand_per_hour").add_metric([r, str(currency)], float(s["on_demand"]))
        fam("spotctl_realized_discount_ratio").add_metric([r], float(s["discount"] or 0.0))

    # the outbox and its relays
    from .relay import last_modes

    for kind, dest in DESTINATION.items():
        pending, oldest = store.outbox_pending(kind)
        fam("spotctl_outbox_pending").add_metric([r, dest], float(pending))
        fam("spotctl_outbox_oldest_age_seconds").add_metric(
            [r, dest], 0.0 if oldest is None else max(0.0, now - oldest))
    for dest, m in sorted(last_modes(store).items()):
        if m.get("mode"):
            fam("spotctl_relay_transactional").add_metric([r, dest, str(m["mode"])],
                                                          1.0 if m["mode"] == "transactional" else 0.0)
            fam("spotctl_relay_degraded").add_metric([r, dest], 1.0 if m.get("degraded") else 0.0)

    # drills
    for st, c in sorted(_drills(store).items()):
        fam("spotctl_drills").add_metric([r, st], float(c))
    for pool, score in sorted(_drill_scores(store).items()):
        fam("spotctl_drill_score").add_metric([r, pool], score)
    # a family with no sample (yet, or here) is still declared, its HELP and TYPE: a scrape names them all
    return [fam(f.name) for f in FAMILIES if f.source == "pass"]


def _family_of(sample: str) -> tuple[Family | None, str]:
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if sample.endswith(suffix):
            f = BY_NAME.get(sample[: -len(suffix)])
            if f is not None:
                return f, suffix[1:]
    return None, ""


def _view(raw: str | None, store: Store) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        view = json.loads(raw)
    except ValueError:
        view = None
    if not isinstance(view, dict):
        log.warning("state database %s: kv row %s is not a JSON object: the pool gauges are left out",
                    store.path, PASS_GAUGES_KEY)
        return {}
    return view


def _on_demand(pool: Any) -> float | None:
    v = pool.on_demand_price  # checked where it enters (config): finite and > 0, or None
    return float(v) if v is not None else None


def _drills(store: Store) -> dict[str, int]:
    from .drill_record import INDEX_KEY, key

    out: dict[str, int] = {}
    for d in _json_list(store.get_value(INDEX_KEY)):
        rec = _json_obj(store.get_value(key(str(d))))
        if rec is not None:
            st = str(rec.get("status", "unknown"))
            out[st] = out.get(st, 0) + 1
    return out


def _drill_scores(store: Store) -> dict[str, float]:
    raw = _json_obj(store.get_value(DRILL_SCORES_KEY)) or {}
    return {str(p): float(s) for p, s in raw.items() if isinstance(s, (int, float)) and math.isfinite(s)}


#: kv: pool -> the score of its last scored drill (written when a drill's report is computed)
DRILL_SCORES_KEY = "metrics:drill_scores"


def record_drill_score(rt: Runtime, pool: str, score: float | None) -> None:
    if score is None or not math.isfinite(score):
        return
    scores = _drill_scores(rt.store)
    scores[pool] = float(score)
    rt.store.set_value(DRILL_SCORES_KEY, json.dumps(scores, sort_keys=True), rt.now())


def _json_list(raw: str | None) -> list:
    try:
        v = json.loads(raw) if raw else []
    except ValueError:
        return []
    return v if isinstance(v, list) else []


def _json_obj(raw: str | None) -> dict | None:
    try:
        v = json.loads(raw) if raw else None
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


class RegionCollector:
    """A ``prometheus_client`` collector of a region's pass metrics. ``open_store`` gives a store for one
    collection (on the collecting thread); ``clock`` the time."""

    def __init__(self, region: Any, open_store: Callable[[], Store], clock: Callable[[], float],
                 close: bool = True):
        self.region = region
        self.open_store = open_store
        self.clock = clock
        self.close = close
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self._lock:
            store = self.open_store()
            try:
                yield from families(store, self.region, self.clock())
            finally:
                if self.close:
                    store.close()


def registry_for(store: Store, region: Any, clock: Callable[[], float]) -> CollectorRegistry:
    """A registry holding the region's pass metrics, read from ``store`` (on this thread)."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(RegionCollector(region, lambda: store, clock, close=False))
    return reg


def write_textfile_of(store: Store, region: Any, path: str, clock: Callable[[], float] = time.time) -> None:
    """The region's metrics as a node_exporter textfile, written atomically (``prometheus_client``'s
    ``write_to_textfile``: a temporary file renamed over ``path``)."""
    from prometheus_client import write_to_textfile

    write_to_textfile(path, registry_for(store, region, clock))


def write_textfile(rt: Runtime, path: str) -> None:
    """The textfile after a pass (``spot-reconciler --metrics-file``)."""
    write_textfile_of(rt.store, rt.region, path, rt.now)


def exposition_of(store: Store, region: Any, clock: Callable[[], float] = time.time) -> str:
    """The region's metrics in the Prometheus text format (``spotctl metrics``)."""
    from prometheus_client import generate_latest

    return generate_latest(registry_for(store, region, clock)).decode()


def exposition(rt: Runtime) -> str:
    return exposition_of(rt.store, rt.region, rt.now)


def serve(rt: Runtime, address: str, port: int) -> Any:
    """Serve ``/metrics`` for the region on ``address:port`` from a thread (the watcher's endpoint); each scrape
    reads the database on a connection of its own. Returns the server (``shutdown()`` to stop)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from spotctl.state.store import Store

    path, region_name = rt.store.path, rt.region.name
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RegionCollector(rt.region, lambda: Store.open(path, region_name, create=False),
                                 rt.now))
    server, _thread = start_http_server(port, addr=address, registry=reg)
    return server
