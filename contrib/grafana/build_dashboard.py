"""Writes contrib/grafana/spotctl.json, the Grafana dashboard of spotctl's metrics (docs/metrics.md).

    python contrib/grafana/build_dashboard.py          # rewrite the dashboard
    python contrib/grafana/build_dashboard.py --check  # exit 1 when the file differs from what this writes

The dashboard follows Grafana's dashboard JSON model, schemaVersion 36 (Grafana 10.1: what the
grafana-foundation-sdk models of tests/test_grafana.py describe). Provision it as a file
(docs/metrics.md, "Grafana"). Every expression names only metrics spotctl exports (the test parses them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("spotctl.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'region=~"$region"'
RP = 'region=~"$region", pool=~"$pool"'


class Layout:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False, "panels": [],
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x, self.row_h = 0, 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend or "__auto"}
    if instant:
        t["instant"] = True
        t["range"] = False
        t["format"] = "table"
    return t


def panel(kind: str, title: str, targets: list[dict[str, Any]], *, unit: str = "short", description: str = "",
          options: dict[str, Any] | None = None, custom: dict[str, Any] | None = None,
          thresholds: list[tuple[float | None, str]] | None = None, decimals: int | None = None,
          min_: float | None = None, max_: float | None = None) -> dict[str, Any]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    defaults: dict[str, Any] = {"unit": unit, "color": {"mode": "palette-classic" if kind == "timeseries" else "thresholds"}}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute",
                                  "steps": [{"value": v, "color": c} for v, c in thresholds]}
    if decimals is not None:
        defaults["decimals"] = decimals
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if custom:
        defaults["custom"] = custom
    p: dict[str, Any] = {"type": kind, "title": title, "datasource": DS, "targets": targets,
                         "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options or {}}
    if description:
        p["description"] = description
    return p


def stat(title: str, expr: str, unit: str = "short", description: str = "", **kw: Any) -> dict[str, Any]:
    return panel("stat", title, [target(expr)], unit=unit, description=description,
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "textMode": "auto",
                          "orientation": "auto"}, **kw)


def series(title: str, targets: list[dict[str, Any]], unit: str = "short", description: str = "",
           stack: bool = False, bars: bool = False, **kw: Any) -> dict[str, Any]:
    custom = {"drawStyle": "bars" if bars else "line", "lineWidth": 1, "fillOpacity": 60 if stack else 10,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}, "showPoints": "never",
              "spanNulls": True}
    return panel("timeseries", title, targets, unit=unit, description=description, custom=custom,
                 options={"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"],
                                     "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "desc"}}, **kw)


def table(title: str, targets: list[dict[str, Any]], description: str = "", unit: str = "short") -> dict[str, Any]:
    p = panel("table", title, targets, unit=unit, description=description,
              options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"],
                                                                          "fields": ""}})
    p["transformations"] = [{"id": "merge", "options": {}},
                            {"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True}}}]
    return p


def quantiles(metric: str, by: str, title: str, description: str, qs: tuple[float, ...] = (0.5, 0.95)) -> dict[str, Any]:
    return series(title, [target(f"histogram_quantile({q}, sum by (le, {by}) "
                                 f"(rate({metric}_bucket{{{RP}}}[$__rate_interval])))", f"p{int(q * 100)} {{{{{by}}}}}")
                          for q in qs], unit="s", description=description)


def build() -> dict[str, Any]:
    L = Layout()
    L.row("Region overview")
    L.add(stat("Live spot nodes", f"sum(spotctl_nodes{{{R}}})", description="spotctl's live nodes, every pool and state."), 4, 4)
    L.add(stat("Spend", f"sum(spotctl_spend_per_hour{{{R}}})", decimals=2,
               description="What the live nodes cost per hour at their recorded prices."), 4, 4)
    L.add(stat("Realized discount", f"avg(spotctl_realized_discount_ratio{{{R}}})", unit="percentunit",
               description="1 - spend / on-demand cost of the live nodes whose pools have an on-demand price.",
               thresholds=[(None, "red"), (0.3, "orange"), (0.5, "green")]), 4, 4)
    L.add(stat("Since the last pass", f"time() - max(spotctl_last_pass_timestamp_seconds{{{R}}})", unit="s",
               description="The timer runs a pass every minute: more than a few minutes is a stuck timer or a lock.",
               thresholds=[(None, "green"), (300, "orange"), (900, "red")]), 4, 4)
    L.add(stat("Last pass ok", f"min(spotctl_last_pass_ok{{{R}}})", description="0: the last pass was partial or failed "
               "(see `spotctl status`).", thresholds=[(None, "red"), (1, "green")]), 4, 4)
    L.add(stat("Token budget left", f"min(spotctl_budget_tokens_left{{{R}}} / spotctl_budget_tokens_burst{{{R}}})",
               unit="percentunit", thresholds=[(None, "red"), (0.1, "orange"), (0.3, "green")],
               description="API tokens left of the burst. Near 0 for long: the budget is exhausted (runbook)."), 4, 4)
    L.add(series("Passes by result", [target(f"sum by (result) (increase(spotctl_passes_total{{{R}}}[$__rate_interval]))",
                                             "{{result}}")], stack=True, bars=True), 8, 8)
    L.add(quantiles_plain("spotctl_pass_duration_seconds", "Pass duration"), 8, 8)
    L.add(series("Actions by kind and result", [target(f"sum by (kind, result) (increase(spotctl_actions_total{{{R}}}"
                                                       f"[$__rate_interval]))", "{{kind}} {{result}}")],
                 stack=True, bars=True), 8, 8)

    L.row("Pools")
    L.add(series("Nodes by pool and state", [target(f"sum by (pool, state) (spotctl_nodes{{{RP}}})",
                                                    "{{pool}} {{state}}")], stack=True), 12, 9)
    L.add(series("Headroom, forward capacity and the next drop", [
        target(f"spotctl_pool_headroom_nodes{{{RP}}}", "{{pool}} headroom"),
        target(f"spotctl_pool_forward_nodes{{{RP}}}", "{{pool}} until next drop"),
        target(f"spotctl_pool_next_drop_nodes{{{RP}}}", "{{pool}} after next drop")],
        description="Headroom: new nodes that fit now. Forward: nodes the pool holds until its next capacity "
                    "drop (the reservation calendar); after: what it holds then."), 12, 9)
    L.add(table("Next capacity drop per pool", [
        target(f"spotctl_pool_next_drop_timestamp_seconds{{{RP}}} - time()", "", instant=True),
        target(f"spotctl_pool_next_drop_nodes{{{RP}}}", "", instant=True)], unit="s",
        description="Seconds until each pool's next drop (a reservation's start) and what it holds after."), 8, 8)
    L.add(series("Price per node-hour", [target(f"spotctl_pool_price_per_hour{{{RP}}}", "{{pool}}")],
                 decimals=3), 8, 8)
    L.add(series("Nodes against the pool limit", [target(
        f"sum by (pool) (spotctl_nodes{{{RP}}}) / on (pool) group_left sum by (pool) (spotctl_pool_max_nodes{{{RP}}})",
        "{{pool}}")], unit="percentunit", max_=1.0, min_=0.0), 8, 8)

    L.row("Notices and the contract")
    L.add(series("Notices by kind", [target(f"sum by (kind) (increase(spotctl_notices_total{{{RP}}}[$__rate_interval]))",
                                            "{{kind}}")], stack=True, bars=True), 8, 8)
    L.add(quantiles("spotctl_notice_lead_seconds", "kind", "Lead time left at receipt",
                    "A notice's deadline minus when spotctl first saw it (p5 and p50: the short ones matter).",
                    (0.05, 0.5)), 8, 8)
    L.add(quantiles("spotctl_notice_delivery_seconds", "kind", "Notice delivery latency",
                    "When spotctl saw a notice (or the provider delivered it) minus when it was issued.", (0.5, 0.95)), 8, 8)
    L.add(quantiles("spotctl_notice_cordon_seconds", "kind", "Reaction: notice to cordon",
                    "From first seeing a notice to every bound scheduler taking the node's drain round."), 8, 8)
    L.add(quantiles("spotctl_notice_empty_seconds", "kind", "Reaction: notice to empty",
                    "From first seeing a notice to the drained node being handed back."), 8, 8)
    L.add(stat("Advisory precision", f"sum(spotctl_advisories_followed_total{{{RP}}}) / sum(spotctl_advisories_total{{{RP}}})",
               unit="percentunit", description="Advised nodes later reclaimed or lost, of all advised nodes.",
               thresholds=[(None, "orange"), (0.2, "green")]), 4, 8)
    L.add(stat("Reclaims without a notice", f"sum(spotctl_reclaims_total{{{RP}, kind=\"lost\"}})",
               thresholds=[(None, "green"), (1, "red")],
               description="Nodes gone without a notice: the provider broke the notice term (runbook: a lost node)."), 4, 8)
    L.add(series("Reclaims by pool and kind", [target(f"sum by (pool, kind) (increase(spotctl_reclaims_total{{{RP}}}"
                                                      f"[$__rate_interval]))", "{{pool}} {{kind}}")], stack=True, bars=True), 12, 8)
    L.add(table("Contract terms not met", [target(f"spotctl_contract_term{{{RP}, state!=\"met\"}} == 1", "", instant=True)],
                description="Each pool's terms the last pass found degraded, unknown (no evidence yet) or missing "
                            "(`spotctl contract check` shows the evidence)."), 12, 8)

    L.row("Drills")
    L.add(panel("bargauge", "Last drill score per pool", [target(f"spotctl_drill_score{{{RP}}}", "{{pool}}")],
                unit="none", min_=0.0, max_=100.0, thresholds=[(None, "red"), (80, "orange"), (95, "green")],
                options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                         "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True}), 12, 7)
    L.add(series("Drills on record by status", [target(f"sum by (status) (spotctl_drills{{{R}}})", "{{status}}")],
                 stack=True), 12, 7)

    L.row("The record pipeline")
    L.add(series("Outbox backlog", [target(f"spotctl_outbox_pending{{{R}}}", "{{destination}}")],
                 description="Records queued for Kafka and the audit service, not yet delivered."), 8, 8)
    L.add(series("Relay lag", [target(f"spotctl_outbox_oldest_age_seconds{{{R}}}", "{{destination}}")], unit="s",
                 description="Age of the oldest record still queued: grows while a destination is down (runbook)."), 8, 8)
    L.add(series("Relay delivery mode", [
        target(f"spotctl_relay_degraded{{{R}}}", "{{destination}} degraded"),
        target(f"spotctl_relay_transactional{{{R}}}", "{{destination}} transactional ({{mode}})")],
        description="Degraded 1: delivering in a weaker mode than configured."), 8, 8)
    L.add(series("Bundle server requests", [target(
        'sum by (code) (rate(spotctl_bundle_requests_total{region=~"$region"}[$__rate_interval]))', "{{code}}")],
        unit="reqps"), 8, 8)
    L.add(series("Bundle server latency", [target(
        'histogram_quantile(0.99, sum by (le) (rate(spotctl_bundle_request_duration_seconds_bucket{region=~"$region"}'
        '[$__rate_interval])))', "p99")], unit="s"), 8, 8)
    L.add(stat("Bundle revision served", 'max(spotctl_bundle_revision{region=~"$region"})'), 8, 8)

    return {
        "title": "spotctl — spot capacity",
        "uid": "spotctl-region",
        "description": "A region's spot capacity, the provider contract, drills and the record pipeline (docs/metrics.md).",
        "tags": ["spotctl", "openstack", "spot"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": "1m",
        "schemaVersion": 36,
        "version": 1,
        "time": {"from": "now-24h", "to": "now"},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {"list": [{"datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "hide": 0, "refresh": 1, "skipUrlSync": False},
            {"name": "region", "label": "Region", "type": "query", "datasource": DS,
             "query": {"query": "label_values(spotctl_passes_total, region)", "refId": "region"},
             "refresh": 2, "multi": True,
             "includeAll": True, "hide": 0, "sort": 1, "skipUrlSync": False},
            {"name": "pool", "label": "Pool", "type": "query", "datasource": DS,
             "query": {"query": 'label_values(spotctl_nodes{region=~"$region"}, pool)', "refId": "pool"},
             "refresh": 2, "multi": True,
             "includeAll": True, "hide": 0, "sort": 1, "skipUrlSync": False},
        ]},
        "panels": L.panels,
    }


def quantiles_plain(metric: str, title: str) -> dict[str, Any]:
    return series(title, [target(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{R}}}[$__rate_interval])))",
                                 f"p{int(q * 100)}") for q in (0.5, 0.95)], unit="s")


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not what {Path(__file__).name} writes: run it", file=sys.stderr)
            sys.exit(1)
        sys.exit(0)
    OUT.write_text(text)
    print(f"wrote {OUT}")
