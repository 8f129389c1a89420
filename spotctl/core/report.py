"""The figures of ``spotctl report``, as one pure function of the rows the state database recorded over a
window (:func:`build`). Any region: what a pass records is the same for the demo region, a simulation's
kept state and a real cloud. Each figure is defined in ``docs/report.md``; in short:

- **spend**: node time × the rate-card price in force (the ``prices`` rows a pass writes when a price
  changes; before the first one, the price the node was launched at), per pool; **on demand**: the same
  node time × the pool's ``on_demand_price``; **savings** = on demand − spend, over the pools that have an
  on-demand price.
- **node time**: from a node's instance creation (``building``) to the accepted delete (``deleting``) or
  its end (``gone``, ``lost``, ``failed``), or the end of the window, clipped to the window.
- **demand and waits**: a wait runs from a unit's submit to the first pass that no longer saw it pending
  (to the pass interval); ``left the queue`` counts waits that ended in the window (started, or withdrawn),
  ``still waiting`` those open at the end. Percentiles are nearest-rank (:func:`spotctl.core.stats.percentile`).
- **interruptions** per pool: nodes the provider took back (``reclaims``: gone after a hard notice, or
  lost with none), per node-hour; the monthly rate is the chance that a node kept up for a whole month
  (730 h) is interrupted at that constant rate, ``1 − exp(−rate × 730)``, in bands like the public clouds'
  spot advisors (< 5 %, 5–10 %, 10–15 %, 15–20 %, > 20 %).
- **notice SLOs**, per hard notice first seen in the window: lead (deadline − receipt), delivery
  (delivered − issued), cordon (receipt to the node's first drain), empty (receipt to the node empty and
  handed back: ``deleting``); each with p50, p95, max and how many met the contract's figure.
- **advisory precision**: advisories followed within :data:`ADVISORY_HORIZON_SECONDS` by a reclaim of the
  same instance (a hard or calendar notice, or the node reclaimed) / all advisories.
- **drills**: the scores of the drills started in the window (:func:`spotctl.core.drill.score`).
- **contract**: every recorded flip (``contract.degraded`` / ``contract.restored`` audit records) with
  its evidence, and per pool the time spent degraded in the window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]

from .stats import percentile

#: Hours in an average month: the horizon of the monthly interruption rate.
MONTH_HOURS = 730.0
#: The bands of the monthly interruption rate (upper bounds, percent) and their labels.
BANDS = ((5.0, "<5%"), (10.0, "5-10%"), (15.0, "10-15%"), (20.0, "15-20%"), (math.inf, ">20%"))
#: An advisory counts as followed by a reclaim when one comes within this long of it.
ADVISORY_HORIZON_SECONDS = 2 * 3600.0
#: The provider contract's figures (DESIGN.md §3): a hard notice ≥ 120 s ahead, delivered in ≤ 1 s.
MIN_LEAD_SECONDS = 120.0
MAX_DELIVERY_SECONDS = 1.0
_ENDED = ("gone", "lost", "failed")
#: A node's time ends when spotctl has its instance deleted (``deleting``: the delete call was accepted) or
#: the node ends otherwise.
_UP_TO = ("deleting", *_ENDED)
_BUCKETS = (300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
_MAX_POINTS = 96


def bucket_seconds(span: float) -> int:
    """The chart step for a window: the smallest of 5 min … 1 week that gives at most 96 points."""
    for b in _BUCKETS:
        if span / b <= _MAX_POINTS:
            return b
    return _BUCKETS[-1]


def band(monthly_pct: float | None) -> str | None:
    """The band of a monthly interruption rate in percent (None: no node time to measure it by)."""
    if monthly_pct is None:
        return None
    return next(label for hi, label in BANDS if monthly_pct < hi)


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Samples, nearest-rank p50 and p95, and the maximum (None without samples), to 3 decimals."""
    def q(x: float) -> float | None:
        p = percentile(values, x)
        return None if p is None else round(p, 3)

    return {"samples": len(values), "p50": q(0.5), "p95": q(0.95), "max": q(1.0)}


def _share(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


def _intervals(nodes: Sequence[Row], transitions: Sequence[Row], start: float,
               end: float) -> tuple[list[tuple[Row, float, float, bool]], dict[str, list[Row]]]:
    """Per node: (node row, up from, up to, still up at the end) clipped to the window, for nodes whose instance was created."""
    by_node: dict[str, list[Row]] = {}
    for t in transitions:
        by_node.setdefault(t["node_id"], []).append(t)
    out = []
    for n in nodes:
        ts = by_node.get(n["id"], [])
        built = next((t["at"] for t in ts if t["to_state"] in ("building", "active")), None)
        if built is None:
            continue  # no instance was ever created: nothing ran, nothing was paid
        ended = next((t["at"] for t in ts if t["to_state"] in _UP_TO and t["at"] >= built), None)
        a, b = max(start, built), min(end, ended if ended is not None else end)
        if b > a:
            out.append((n, a, b, ended is None or ended > end))
    return out, by_node


class _Prices:
    """The price in force per pool: the recorded changes (each holds until the next)."""

    def __init__(self, rows: Sequence[Row]):
        self.by_pool: dict[str, list[tuple[float, float]]] = {}
        self.currency: str | None = None
        for r in sorted(rows, key=lambda r: (r["pool"], r["at"])):
            steps = self.by_pool.setdefault(r["pool"], [])
            if not steps or steps[-1][0] != r["at"]:
                steps.append((float(r["at"]), float(r["price"])))
            self.currency = self.currency or r["currency"]

    def cost(self, pool: str, a: float, b: float, fallback: float) -> list[tuple[float, float, float]]:
        """(from, to, price) segments covering [a, b]; before the first recorded price, ``fallback``."""
        steps = self.by_pool.get(pool, [])
        segs = []
        price = fallback
        x = a
        for at, p in steps:
            if at <= x:
                price = p
                continue
            if at >= b:
                break
            segs.append((x, at, price))
            x, price = at, p
        segs.append((x, b, price))
        return segs


def build(*, region: str, start: float, end: float, rows: Mapping[str, Sequence[Row]],
          on_demand: Mapping[str, float | None], currency: str, drills: Sequence[Row] = ()) -> dict[str, Any]:
    """The report over ``[start, end]`` from the window's rows (:func:`spotctl.state.history.window_rows`);
    ``on_demand``: each configured pool's on-demand price per node-hour (None: not configured)."""
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        raise ValueError(f"not a window: {start!r} to {end!r}")
    span = end - start
    step = bucket_seconds(span)
    n_buckets = max(1, math.ceil(span / step))
    pools = sorted(set(on_demand) | {n["pool"] for n in rows.get("nodes", ())})
    intervals, by_node = _intervals(rows.get("nodes", ()), rows.get("transitions", ()), start, end)
    prices = _Prices(rows.get("prices", ()))
    cur = prices.currency or currency

    node_s = {p: 0.0 for p in pools}
    spend = {p: 0.0 for p in pools}
    series_spend = [0.0] * n_buckets
    series_od = [0.0] * n_buckets
    series_nodes = {p: [0.0] * n_buckets for p in pools}

    def spread(a: float, b: float, weight: float, into: list[float]) -> None:
        i = int((a - start) // step)
        while a < b and i < n_buckets:
            hi = min(b, start + (i + 1) * step)
            into[i] += (hi - a) * weight
            a, i = hi, i + 1

    for n, a, b, _ in intervals:
        pool = n["pool"]
        node_s[pool] += b - a
        spread(a, b, 1.0 / step, series_nodes[pool])
        od = on_demand.get(pool)
        if od is not None:
            spread(a, b, od / 3600.0, series_od)
        for x, y, price in prices.cost(pool, a, b, float(n.get("price") or 0.0)):
            spend[pool] += (y - x) * price / 3600.0
            spread(x, y, price / 3600.0, series_spend)

    priced = [p for p in pools if on_demand.get(p) is not None]
    od_cost = {p: node_s[p] / 3600.0 * float(on_demand[p] or 0.0) for p in priced}
    spend_priced = sum(spend[p] for p in priced)
    savings = sum(od_cost.values()) - spend_priced
    launched = sum(1 for n in rows.get("nodes", ()) if start <= n["created_at"] <= end and n["id"] in by_node
                   and any(t["to_state"] in ("building", "active") for t in by_node[n["id"]]))
    ended_in = {s: 0 for s in _ENDED}
    for n in rows.get("nodes", ()):
        for t in by_node.get(n["id"], ()):
            if t["to_state"] in _ENDED and start <= t["at"] <= end:
                ended_in[t["to_state"]] += 1
                break
    live_at_end = sum(1 for *_, up in intervals if up)

    cost = {
        "currency": cur,
        "spend": round(sum(spend.values()), 4),
        "on_demand": round(sum(od_cost.values()), 4) if priced else None,
        "savings": round(savings, 4) if priced else None,
        "savings_pct": _share(savings, sum(od_cost.values())) if priced else None,
        "pools_without_on_demand_price": [p for p in pools if p not in priced],
        "by_pool": {p: {"spend": round(spend[p], 4), "node_hours": round(node_s[p] / 3600.0, 4),
                        "on_demand": round(od_cost[p], 4) if p in od_cost else None,
                        "savings_pct": _share(od_cost[p] - spend[p], od_cost[p]) if p in od_cost else None}
                    for p in pools},
        "node_hours": round(sum(node_s.values()) / 3600.0, 4),
    }
    deleted = sum(1 for n in rows.get("nodes", ()) if any(t["to_state"] == "deleting" and start <= t["at"] <= end
                                                         for t in by_node.get(n["id"], ())))
    nodes = {"launched": launched, "deleted": deleted, "lost": ended_in["lost"],
             "failed": ended_in["failed"], "live_at_end": live_at_end}

    # -- demand and waits
    waits = rows.get("waits", ())
    done = [w for w in waits if w["gone_at"] is not None and w["gone_at"] <= end]
    still = [w for w in waits if w["gone_at"] is None or w["gone_at"] > end]
    wait_s = [max(0.0, w["gone_at"] - w["submitted_at"]) for w in done]
    by_sched: dict[str, list[float]] = {}
    for w in done:
        by_sched.setdefault(w["scheduler"], []).append(max(0.0, w["gone_at"] - w["submitted_at"]))
    demand = {
        "seen": len(waits), "left_queue": len(done), "still_waiting": len(still),
        "left_queue_pct": _share(len(done), len(waits)),
        "oldest_waiting_s": round(max((end - w["submitted_at"] for w in still), default=0.0), 3) if still else None,
        "wait_s": stats(wait_s),
        "by_scheduler": {s: stats(v) for s, v in sorted(by_sched.items())},
    }

    # -- notices, SLOs, advisories
    notices = rows.get("notices", ())
    kinds: dict[str, int] = {}
    for nt in notices:
        kinds[nt["kind"]] = kinds.get(nt["kind"], 0) + 1
    lead, delivery, cordon, empty = [], [], [], []
    empty_by_deadline = 0
    hard = [nt for nt in notices if nt["kind"] == "hard"]
    for nt in hard:
        seen = nt["first_seen_at"]
        if nt["deadline"] is not None:
            lead.append(nt["deadline"] - seen)
        if nt["delivered_at"] is not None:
            delivery.append(max(0.0, nt["delivered_at"] - nt["issued_at"]))
        ts = by_node.get(nt["node_id"] or "", [])
        drained = next((t["at"] for t in ts if t["to_state"] in ("draining", "deleting", "gone")), None)
        if drained is not None:
            cordon.append(max(0.0, drained - seen))
        emptied = next((t["at"] for t in ts if t["to_state"] in ("deleting", "gone")), None)
        if emptied is not None:
            empty.append(max(0.0, emptied - seen))
            if nt["deadline"] is not None and emptied <= nt["deadline"]:
                empty_by_deadline += 1
    slo = {
        "hard_notices": len(hard),
        "lead_s": stats(lead) | {"target": f">= {MIN_LEAD_SECONDS:g} s",
                                 "met": sum(1 for x in lead if x >= MIN_LEAD_SECONDS)},
        "delivery_s": stats(delivery) | {"target": f"<= {MAX_DELIVERY_SECONDS:g} s",
                                         "met": sum(1 for x in delivery if x <= MAX_DELIVERY_SECONDS)},
        "cordon_s": stats(cordon),
        "empty_s": stats(empty) | {"target": "by the deadline", "met": empty_by_deadline},
    }
    reclaimed_nodes: dict[str, list[float]] = {}
    for r in rows.get("reclaims", ()):
        reclaimed_nodes.setdefault(r["node_id"], []).append(r["at"])
    taking = [nt for nt in notices if nt["kind"] in ("hard", "calendar")]
    advisories = [nt for nt in notices if nt["kind"] == "advisory"]
    followed_by_pool: dict[str, list[int]] = {}
    for adv in advisories:
        t0, t1 = adv["issued_at"], adv["issued_at"] + ADVISORY_HORIZON_SECONDS
        hit = any(nt["instance_id"] == adv["instance_id"] and t0 <= nt["issued_at"] <= t1 for nt in taking) or \
            any(t0 <= at <= t1 for at in reclaimed_nodes.get(adv["node_id"] or "", ()))
        c = followed_by_pool.setdefault(adv["pool"] or "?", [0, 0])
        c[0] += int(hit)
        c[1] += 1
    followed = sum(c[0] for c in followed_by_pool.values())
    advisory = {"advisories": len(advisories), "followed_by_reclaim": followed,
                "precision_pct": _share(followed, len(advisories)), "horizon_s": ADVISORY_HORIZON_SECONDS,
                "by_pool": {p: {"advisories": c[1], "followed_by_reclaim": c[0], "precision_pct": _share(c[0], c[1])}
                            for p, c in sorted(followed_by_pool.items())}}

    # -- interruptions per pool
    inter: dict[str, dict[str, int]] = {p: {"notice": 0, "lost": 0} for p in pools}
    for r in rows.get("reclaims", ()):
        inter.setdefault(r["pool"], {"notice": 0, "lost": 0})
        inter[r["pool"]][r["kind"] if r["kind"] in ("notice", "lost") else "notice"] += 1
    interruptions = {}
    for p in sorted(inter):
        count = inter[p]["notice"] + inter[p]["lost"]
        hours = node_s.get(p, 0.0) / 3600.0
        rate = count / hours if hours > 0 else None
        monthly = round(100.0 * (1.0 - math.exp(-rate * MONTH_HOURS)), 2) if rate is not None else None
        interruptions[p] = {"interruptions": count, "after_notice": inter[p]["notice"], "without_notice": inter[p]["lost"],
                            "hard_notices": sum(1 for nt in hard if nt["pool"] == p),
                            "node_hours": round(hours, 4),
                            "per_1000_node_hours": round(1000.0 * rate, 3) if rate is not None else None,
                            "monthly_pct": monthly, "band": band(monthly)}

    # -- contract
    changes = []
    degraded_s: dict[str, float] = {}
    since: dict[str, float] = {}
    for rec in rows.get("contract_changes", ()):
        pool, inputs = rec["target"], rec["inputs"] if isinstance(rec["inputs"], Mapping) else {}
        kind = rec["action"].split(".", 1)[1]
        changes.append({"at": rec["at"], "pool": pool, "change": kind, "state": rec["result"],
                        "previous": inputs.get("previous"), "failing": list(inputs.get("failing") or []),
                        "evidence": inputs.get("evidence") or {}})
        if kind == "degraded":
            since.setdefault(pool, rec["at"])
        elif pool in since:
            degraded_s[pool] = degraded_s.get(pool, 0.0) + rec["at"] - since.pop(pool)
        elif str(inputs.get("previous") or "").startswith("degraded"):
            degraded_s[pool] = degraded_s.get(pool, 0.0) + rec["at"] - start  # degraded since before the window
    for pool, t_deg in since.items():
        degraded_s[pool] = degraded_s.get(pool, 0.0) + end - t_deg
    contract = {"degradations": sum(1 for c in changes if c["change"] == "degraded"),
                "restorations": sum(1 for c in changes if c["change"] == "restored"),
                "degraded_s_by_pool": {p: round(s, 3) for p, s in sorted(degraded_s.items())}, "changes": changes}

    passes: dict[str, int] = {}
    for ps in rows.get("passes", ()):
        passes[ps["status"]] = passes.get(ps["status"], 0) + 1
    scored = [d["score"] for d in drills if d.get("score") is not None]
    return {
        "region": region, "start": start, "end": end, "window_s": span,
        "cost": cost, "nodes": nodes, "demand": demand,
        "notices": {"by_kind": {k: kinds.get(k, 0) for k in ("hard", "advisory", "calendar")} | kinds,
                    "slo": slo},
        "advisories": advisory, "interruptions": interruptions,
        "drills": {"count": len(drills), "mean_score": round(sum(scored) / len(scored), 1) if scored else None,
                   "drills": list(drills)},
        "contract": contract,
        "passes": {"count": sum(passes.values()), "by_status": dict(sorted(passes.items()))},
        "series": {"step_s": step, "t": [start + i * step for i in range(n_buckets)],
                   "spend": [round(x, 4) for x in series_spend],
                   "on_demand": [round(x, 4) for x in series_od] if priced else None,
                   "nodes": {p: [round(x, 3) for x in v] for p, v in series_nodes.items()}},
    }
