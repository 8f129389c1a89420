"""The metrics spotctl exports: one table of families, and the pure parts of keeping them.

Every family is declared once in :data:`FAMILIES` (name, type, help, labels, buckets): the exporters
(:mod:`spotctl.ops.metrics`), the documentation test and the Grafana dashboard test read it from here.
Every series carries a ``region`` label, and every series is about what spotctl manages — its own nodes,
actions, notices and pools — never the whole account.

Counters and histograms are **kept in the state database** (``kv`` rows ``metric:<series>``), updated in
the same transaction as the record they count (:mod:`spotctl.state.metrics`), so they are monotonic
across passes and processes, survive a restart, and never go back when the retention prunes old rows.
A series key is ``name{label="value",...}`` in Prometheus' own text form; a histogram keeps one row per
bucket (``name_bucket{...,le="30.0"}``, the observations in that bucket alone, summed up into Prometheus'
cumulative buckets on export) plus ``name_sum`` and ``name_count``: three rows an observation.

Gauges are read when exported: live ones from the database (nodes by state, outbox backlog, the token
bucket), and the pass's view of the cloud (headroom, forward capacity, prices, contract terms) from what
the last pass observed (:func:`pass_gauges`, kept in ``kv`` row :data:`PASS_GAUGES_KEY`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: kv row holding the gauges the last pass computed from what it observed (JSON)
PASS_GAUGES_KEY = "metrics:pass_gauges"
#: kv key prefix of the kept counter and histogram series
SERIES_PREFIX = "metric:"

#: seconds: from a second to a day (notice lead times reach hours; pass durations are seconds)
SECONDS_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 86400.0)
PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    #: where it comes from: "pass" (the pass textfile and the watcher), "bundle" (``bundle serve``)
    source: str = "pass"

    @property
    def series_names(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for it (what a PromQL expression may name)."""
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.type == "counter":
            return (f"{self.name}_total", f"{self.name}_created")
        return (self.name,)


def _f(name: str, type_: str, help_: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = (),
       source: str = "pass") -> Family:
    return Family(name, type_, help_, labels, buckets, source)


# Counter names are given without ``_total`` (prometheus_client adds it on exposition).
FAMILIES: tuple[Family, ...] = (
    _f("spotctl_passes", "counter", "Reconcile passes finished, by result (ok, partial, failed, interrupted, "
       "abandoned).", ("result",)),
    _f("spotctl_pass_duration_seconds", "histogram", "Duration of finished reconcile passes.", (), PASS_BUCKETS),
    _f("spotctl_last_pass_timestamp_seconds", "gauge", "When the last finished pass ended (Unix time)."),
    _f("spotctl_last_pass_ok", "gauge", "1 when the last finished pass ended ok, else 0."),
    _f("spotctl_actions", "counter", "Action outcomes recorded, by kind and result (done, ok, partial, failed, "
       "skipped, ...).", ("kind", "result")),
    _f("spotctl_budget_tokens_used", "counter", "API tokens taken from the region's budget."),
    _f("spotctl_budget_tokens_left", "gauge", "API tokens left in the region's budget now."),
    _f("spotctl_budget_tokens_burst", "gauge", "The budget's burst (its most tokens)."),
    _f("spotctl_pool_headroom_nodes", "gauge", "New spot nodes of the pool's shape that fit now, host by host "
       "(as the last pass observed).", ("pool",)),
    _f("spotctl_pool_capacity_nodes", "gauge", "Spot nodes of the pool's shape its hosts hold in all, ours "
       "included (as the last pass observed).", ("pool",)),
    _f("spotctl_pool_forward_nodes", "gauge", "Spot nodes the pool can hold until its next capacity drop "
       "(the reservation calendar; as the last pass observed).", ("pool",)),
    _f("spotctl_pool_next_drop_nodes", "gauge", "Spot nodes the pool can hold after its next capacity drop.",
       ("pool",)),
    _f("spotctl_pool_next_drop_timestamp_seconds", "gauge", "When the pool's next capacity drop begins "
       "(Unix time; absent when none is within the horizon).", ("pool",)),
    _f("spotctl_pool_price_per_hour", "gauge", "The pool's spot price per node-hour on the rate card the last "
       "pass read.", ("pool", "currency")),
    _f("spotctl_pool_max_nodes", "gauge", "The pool's configured node limit.", ("pool",)),
    _f("spotctl_nodes", "gauge", "spotctl's live nodes, by pool and state.", ("pool", "state")),
    _f("spotctl_notices", "counter", "Provider notices first seen, by pool and kind (hard, advisory, calendar).",
       ("pool", "kind")),
    _f("spotctl_notice_lead_seconds", "histogram", "Lead time left at receipt: a notice's deadline minus when "
       "spotctl first saw it.", ("pool", "kind"), SECONDS_BUCKETS),
    _f("spotctl_notice_delivery_seconds", "histogram", "Delivery latency: when spotctl first saw a notice (or "
       "the provider says it delivered it) minus when it was issued.", ("pool", "kind"), SECONDS_BUCKETS),
    _f("spotctl_notice_cordon_seconds", "histogram", "Reaction time to cordon: from first seeing a notice to "
       "every bound scheduler having taken the node's drain round.", ("pool", "kind"), SECONDS_BUCKETS),
    _f("spotctl_notice_empty_seconds", "histogram", "Reaction time to empty: from first seeing a notice to the "
       "node, drained, being handed back (deleting).", ("pool", "kind"), SECONDS_BUCKETS),
    _f("spotctl_advisories", "counter", "Nodes put under an advisory (reclaim risk), by pool.", ("pool",)),
    _f("spotctl_advisories_followed", "counter", "Advised nodes later reclaimed or lost (the advisory's "
       "precision is this over spotctl_advisories_total).", ("pool",)),
    _f("spotctl_reclaims", "counter", "spotctl's nodes taken back, by pool and kind (notice: after a notice; "
       "lost: gone without one).", ("pool", "kind")),
    _f("spotctl_contract_term", "gauge", "1 for each contract term's state per pool as the last pass evaluated "
       "it (met, degraded, unknown, missing).", ("pool", "term", "state")),
    _f("spotctl_drills", "gauge", "Reclaim drills on record, by status.", ("status",)),
    _f("spotctl_drill_score", "gauge", "The score (0-100) of the last finished drill of a pool.", ("pool",)),
    _f("spotctl_outbox_pending", "gauge", "Records queued for a destination, not yet delivered.",
       ("destination",)),
    _f("spotctl_outbox_oldest_age_seconds", "gauge", "Age of the oldest record still queued for a destination "
       "(the relay's lag; 0 when none is queued).", ("destination",)),
    _f("spotctl_relay_transactional", "gauge", "1 when a relay's producer last used a transaction per batch "
       "(label mode: transactional, idempotent, acks-all).", ("destination", "mode")),
    _f("spotctl_relay_degraded", "gauge", "1 when a relay last delivered in a weaker mode than configured.",
       ("destination",)),
    _f("spotctl_spend_per_hour", "gauge", "What spotctl's live nodes cost per hour at their recorded prices.",
       ("currency",)),
    _f("spotctl_on_demand_per_hour", "gauge", "What the same nodes would cost per hour at the pools' on-demand "
       "prices (pools without one are left out of this and of the spend it is compared with).", ("currency",)),
    _f("spotctl_realized_discount_ratio", "gauge", "1 - spend / on-demand cost of the live nodes that have an "
       "on-demand price (0.6: 60 % saved)."),
    # bundle serve (its own process: counters kept in memory, from its start)
    _f("spotctl_bundle_requests", "counter", "Bundle server requests, by method, path (its route) and HTTP "
       "status.", ("method", "path", "code"), source="bundle"),
    _f("spotctl_bundle_request_duration_seconds", "histogram", "Bundle server request durations.", ("path",),
       (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0), source="bundle"),
    _f("spotctl_bundle_sent_bytes", "counter", "Bundle bytes sent to agents.", (), source="bundle"),
    _f("spotctl_bundle_revision", "gauge", "The revision of the bundle being served.", (), source="bundle"),
)
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}


def exported_sample_names() -> frozenset[str]:
    """Every sample name a scrape of spotctl can carry (what the dashboard may refer to)."""
    return frozenset(s for f in FAMILIES for s in f.series_names)


# -- series keys ---------------------------------------------------------------------------------------


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def series_key(name: str, labels: Mapping[str, str]) -> str:
    """``name{a="x",b="y"}`` (labels sorted), the form kept in kv."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


def parse_series_key(key: str) -> tuple[str, dict[str, str]]:
    """The inverse of :func:`series_key`."""
    if "{" not in key:
        return key, {}
    name, rest = key.split("{", 1)
    labels: dict[str, str] = {}
    i, body = 0, rest[:-1]
    while i < len(body):
        eq = body.index("=", i)
        k = body[i:eq]
        j = eq + 2  # past ="
        out = []
        while body[j] != '"':
            if body[j] == "\\":
                j += 1
                out.append({"n": "\n"}.get(body[j], body[j]))
            else:
                out.append(body[j])
            j += 1
        labels[k] = "".join(out)
        i = j + 2  # past ",
    return name, labels


def counter_increment(name: str, labels: Mapping[str, str], by: float = 1.0) -> dict[str, float]:
    """The kv increments of a counter (``name`` as declared, without ``_total``)."""
    return {_counter_key(name, tuple(labels.items())): by}


@lru_cache(maxsize=4096)
def _counter_key(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    """The series key of a counter with these labels, checked and made once (the labels are few: pools, kinds)."""
    _check_labels(BY_NAME[name], dict(labels))
    return series_key(name + "_total", dict(labels))


def histogram_increments(name: str, labels: Mapping[str, str], value: float) -> dict[str, float]:
    """The kv increments of one observation: three rows — the one bucket it falls in (the smallest upper
    bound ``le`` it does not exceed, else ``+Inf``), the sum and the count. The rows count per bucket; the
    exporter adds them up into Prometheus' cumulative buckets (:func:`cumulative`). A value that is not
    finite, or negative, is not observed (a clock step must not poison the sum)."""
    fam = BY_NAME[name]
    buckets, sum_key, count_key = _histogram_keys(name, tuple(labels.items()))
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return {}
    i = next((i for i, b in enumerate(fam.buckets) if value <= b), len(fam.buckets))  # the last key: +Inf
    return {buckets[i]: 1.0, sum_key: float(value), count_key: 1.0}


@lru_cache(maxsize=4096)
def _histogram_keys(name: str, labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, ...], str, str]:
    """The series keys of a histogram with these labels, checked and made once: each bucket's (its ``le``, then
    ``+Inf``), the sum's and the count's (a storm of 1,000 notices observes three histograms each)."""
    fam = BY_NAME[name]
    lab = dict(labels)
    _check_labels(fam, lab)
    les = [repr(float(b)) for b in fam.buckets] + ["+Inf"]
    return (tuple(series_key(name + "_bucket", {**lab, "le": le}) for le in les),
            series_key(name + "_sum", lab), series_key(name + "_count", lab))


def cumulative(fam: Family, per_bucket: Mapping[str, float]) -> list[tuple[str, float]]:
    """Prometheus' cumulative buckets (``le`` text, count) from the kept per-bucket counts."""
    out, running = [], 0.0
    for b in fam.buckets:
        running += per_bucket.get(repr(float(b)), 0.0)
        out.append((repr(float(b)), running))
    out.append(("+Inf", running + per_bucket.get("+Inf", 0.0)))
    return out


def _check_labels(fam: Family, labels: Mapping[str, str]) -> None:
    if set(labels) != set(fam.labels):
        raise ValueError(f"{fam.name} takes labels {fam.labels}, not {tuple(sorted(labels))}")


def merge(into: dict[str, float], more: Mapping[str, float]) -> dict[str, float]:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v
    return into


# -- the pass's view -------------------------------------------------------------------------------------


def pass_gauges(*, now: float, pools: Iterable[str], headroom: Mapping[str, Any], calendars: Mapping[str, Any],
                prices: Mapping[str, Any] | None, currency: str | None,
                contract: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a pass observed of its pools, as gauges (JSON-able): headroom and capacity, the forward calendar's
    next drop, the rate card's prices and each contract term's state. Only what was observed is written: a
    pool whose calendar or price the pass could not read has no such entry (absent, not 0)."""
    out: dict[str, Any] = {"at": now, "currency": currency, "pools": {}}
    for name in pools:
        p: dict[str, Any] = {}
        hr = headroom.get(name)
        if hr is not None:
            p["headroom"] = int(hr.free)
            p["capacity"] = int(hr.capacity)
        cal = calendars.get(name)
        if cal is not None and cal.steps:
            first = cal.steps[0][1]
            p["forward"] = int(first)
            drop = next(((t, c) for t, c in cal.steps[1:] if c < first), None)
            if drop is not None:
                p["next_drop_at"] = float(drop[0])
                p["next_drop_nodes"] = int(drop[1])
        price = (prices or {}).get(name)
        if isinstance(price, (int, float)) and not isinstance(price, bool) and math.isfinite(price):
            p["price"] = float(price)
        report = ((contract or {}).get("pools") or {}).get(name)
        if isinstance(report, Mapping) and isinstance(report.get("terms"), Mapping):
            p["terms"] = {t: str(v.get("state")) for t, v in report["terms"].items() if isinstance(v, Mapping)}
        out["pools"][name] = p
    return out


def spend(pools: Iterable[tuple[str, int, float]], on_demand: Mapping[str, float | None]) -> dict[str, float | None]:
    """Spend per hour of the live nodes, given per pool as ``(pool, nodes, sum of their prices)``; the
    on-demand cost of those whose pool has an on-demand price, the spend of the same nodes, and the realized
    discount (None without any on-demand price)."""
    total = compared = od = 0.0
    for pool, n, price in pools:
        total += price
        ref = on_demand.get(pool)
        if ref is not None:
            od += ref * n
            compared += price
    return {"spend": total, "on_demand": od if od > 0 else None, "compared_spend": compared,
            "discount": (1.0 - compared / od) if od > 0 else None}
