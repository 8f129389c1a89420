"""The Grafana dashboard (contrib/grafana/spotctl.json) and the metrics documentation against what spotctl
exports: every PromQL expression parses and names only exported samples and their labels, every exported
family is documented, and the JSON is Grafana's dashboard model of the schema version it declares."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from spotctl.core.metrics import BY_NAME, FAMILIES, exported_sample_names

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "contrib" / "grafana" / "spotctl.json"
#: Grafana's variables, as a query would see them once substituted
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${datasource}": "x",
                "$region": "demo", "$pool": "gp-az1"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def expressions(d: dict[str, Any]) -> list[tuple[str, str]]:
    exprs = [(p["title"], t["expr"]) for p in panels(d) for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict) and (m := re.fullmatch(r"label_values\((.*), *(\w+)\)", q["query"])):
            exprs.append((f"variable {v['name']}", m.group(1)))
    return exprs


def substitute(expr: str) -> str:
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def selectors(node: Any) -> list[tuple[str, set[str]]]:
    """(metric name, label names used) of every selector in a parsed expression, with grouping labels."""
    out: list[tuple[str, set[str]]] = []

    def walk(n: Any, grouping: set[str]) -> None:
        if isinstance(n, promql_parser.VectorSelector):
            out.append((n.name, {m.name for m in n.matchers.matchers} | grouping))
        elif isinstance(n, promql_parser.MatrixSelector):
            walk(n.vector_selector, grouping)
        elif isinstance(n, promql_parser.AggregateExpr):
            labels = set(n.modifier.labels) if n.modifier is not None else set()
            walk(n.expr, grouping | labels)
            if n.param is not None:
                walk(n.param, grouping)
        elif isinstance(n, promql_parser.BinaryExpr):
            labels = set(n.modifier.matching.labels) if n.modifier is not None and n.modifier.matching else set()
            walk(n.lhs, grouping | labels)
            walk(n.rhs, grouping | labels)
        elif isinstance(n, promql_parser.Call):
            for a in n.args:
                walk(a, grouping)
        elif isinstance(n, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
            walk(n.expr, grouping)

    walk(node, set())
    return out


def family_of(sample: str):
    for f in FAMILIES:
        if sample in f.series_names:
            return f
    return None


def test_the_dashboard_file_is_what_its_generator_writes():
    p = subprocess.run([sys.executable, str(DASHBOARD.with_name("build_dashboard.py")), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_every_expression_parses_and_names_only_exported_metrics_and_their_labels():
    exported = exported_sample_names()
    exprs = expressions(dashboard())
    assert len(exprs) >= 30
    seen: set[str] = set()
    for title, expr in exprs:
        tree = promql_parser.parse(substitute(expr))  # raises on a syntax error
        found = selectors(tree)
        assert found, f"{title}: {expr} names no metric"
        for name, labels in found:
            assert name in exported, f"{title}: {name} is not a metric spotctl exports"
            f = family_of(name)
            allowed = {"region", *f.labels} | ({"le"} if name.endswith("_bucket") else set())
            assert labels <= allowed, f"{title}: {name} has no label(s) {sorted(labels - allowed)}"
            seen.add(f.name)
    # the dashboard shows each area of the issue: passes, actions, budget, pools, notices, contract, drills, outbox
    for must in ("spotctl_passes", "spotctl_actions", "spotctl_budget_tokens_left", "spotctl_pool_headroom_nodes",
                 "spotctl_pool_forward_nodes", "spotctl_pool_price_per_hour", "spotctl_nodes", "spotctl_notices",
                 "spotctl_notice_lead_seconds", "spotctl_notice_delivery_seconds", "spotctl_notice_cordon_seconds",
                 "spotctl_notice_empty_seconds", "spotctl_advisories_followed", "spotctl_contract_term",
                 "spotctl_drill_score", "spotctl_outbox_pending", "spotctl_outbox_oldest_age_seconds",
                 "spotctl_spend_per_hour", "spotctl_realized_discount_ratio"):
        assert must in seen, f"no panel shows {must}"


def test_a_metric_that_is_not_exported_fails_the_check():
    tree = promql_parser.parse('sum by (pool) (rate(spotctl_made_up_total{region="x"}[5m]))')
    [(name, labels)] = selectors(tree)
    assert name not in exported_sample_names() and labels == {"pool", "region"}
    with pytest.raises(Exception):
        promql_parser.parse("sum by (pool (spotctl_nodes)")


def test_every_exported_family_is_documented():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for f in FAMILIES:
        shown = f"{f.name}_total" if f.type == "counter" else f.name
        assert f"`{shown}`" in doc, f"docs/metrics.md does not document {shown}"
        for label in f.labels:
            assert label in doc
    for name in re.findall(r"`(spotctl_[a-z_]+)`", doc):
        base = name.removesuffix("_total")
        assert base in BY_NAME or family_of(name), f"docs/metrics.md names {name}, which spotctl does not export"


def test_the_json_is_grafanas_dashboard_model_of_the_schema_version_it_declares():
    """grafana-foundation-sdk's models are generated from Grafana's dashboard schema; its Dashboard model is
    schema version 36. Decoding and encoding again must keep every key: a key the schema does not have is
    dropped by the model, and fails here."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as model

    d = dashboard()
    assert d["schemaVersion"] == model.Dashboard().schema_version == 36
    back = json.loads(json.dumps(model.Dashboard.from_json(d), cls=JSONEncoder))
    dropped: list[str] = []

    def compare(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict):
            for k, v in a.items():
                if not isinstance(b, dict) or k not in b:
                    dropped.append(f"{path}/{k}")
                else:
                    compare(v, b[k], f"{path}/{k}")
        elif isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b), path
            for i, (x, y) in enumerate(zip(a, b)):
                compare(x, y, f"{path}[{i}]")
        else:
            assert a == b, f"{path}: {a!r} became {b!r}"

    compare(d, back, "")
    assert dropped == [], f"keys Grafana's dashboard schema does not have: {dropped}"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for p in panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"{p['title']} fits the 24-column grid"
