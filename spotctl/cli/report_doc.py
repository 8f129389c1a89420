"""``spotctl report`` written out: a terminal table, a Markdown document, or one self-contained HTML page
with inline SVG charts (pygal, imported only here, with its external JavaScript turned off: the page needs
no network to open). The figures are computed in :mod:`spotctl.core.report`; this only writes them out."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from . import fmt

_D = "-"


def _s(v: float | None) -> str:
    """Seconds as a duration ("-" for none)."""
    return _D if v is None else fmt.duration(v)


def _sec(v: float | None) -> str:
    """Seconds to a tenth under 10 min (a notice's delivery takes well under one), else a duration."""
    if v is None:
        return _D
    return f"{v:.1f} s" if v < 600 else fmt.duration(v)


def _m(v: float | None) -> str:
    return _D if v is None else f"{v:,.2f}"


def _p(v: float | None) -> str:
    return _D if v is None else f"{v:.1f} %"


def headline(r: dict) -> list[tuple[str, str, str]]:
    """(figure, value, what it counts): the figures at the top of every format."""
    c, d, sl, a = r["cost"], r["demand"], r["notices"]["slo"], r["advisories"]
    cur = c["currency"]
    w = d["wait_s"]
    return [
        (f"spend ({cur})", _m(c["spend"]), f"{c['node_hours']:,.1f} node-hours × the rate-card price in force"),
        (f"on demand ({cur})", _m(c["on_demand"]), "the same node time at each pool's on-demand price"),
        (f"savings ({cur})", f"{_m(c['savings'])} ({_p(c['savings_pct'])})", "on demand − spend"),
        ("demand (units)", f"{d['left_queue']} of {d['seen']} left the queue ({_p(d['left_queue_pct'])})",
         f"{d['still_waiting']} still waiting at the end"),
        ("wait (duration)", f"p50 {_s(w['p50'])}, p95 {_s(w['p95'])}, max {_s(w['max'])}",
         f"submit to the first pass that saw it gone; {w['samples']} units"),
        ("hard notices", str(sl["hard_notices"]),
         f"lead ≥ 120 s: {sl['lead_s']['met']}; empty by the deadline: {sl['empty_s']['met']}"),
        ("advisory precision", f"{a['followed_by_reclaim']} of {a['advisories']} ({_p(a['precision_pct'])})",
         f"followed by a reclaim within {_s(a['horizon_s'])}"),
        ("drills", f"{r['drills']['count']}, mean score {_D if r['drills']['mean_score'] is None else r['drills']['mean_score']}",
         "reclaim drills started in the window"),
        ("contract degradations", str(r["contract"]["degradations"]),
         f"{r['contract']['restorations']} restorations"),
    ]


def title(r: dict) -> str:
    return f"Region {r['region']}: {fmt.ts(r['start'])} to {fmt.ts(r['end'])}"


def _stale(r: dict) -> str | None:
    s = r.get("stale_s")
    if s is None or s < 3600:
        return None
    return (f"The window ends at the last recorded pass, {fmt.duration(s)} ago (a kept simulation, or a stopped "
            "reconciler); --until now reports up to now.")


# -- tables shared by the formats ---------------------------------------------------------------------

Table = tuple[str, list[str], list[list[str]]]


def tables(r: dict) -> list[Table]:
    c = r["cost"]
    cur = c["currency"]
    out: list[Table] = []
    out.append(("Spend and savings per pool", ["pool", "node-hours", f"spend ({cur})", f"on demand ({cur})", "savings"],
                [[p, f"{v['node_hours']:,.2f}", _m(v["spend"]), _m(v["on_demand"]), _p(v["savings_pct"])]
                 for p, v in c["by_pool"].items()]))
    n = r["nodes"]
    out.append(("Nodes", ["launched", "deleted", "lost", "failed", "live at the end"],
                [[str(n["launched"]), str(n["deleted"]), str(n["lost"]), str(n["failed"]), str(n["live_at_end"])]]))
    d = r["demand"]
    out.append(("Waits to start", ["scheduler", "units", "p50", "p95", "max"],
                [[s, str(v["samples"]), _s(v["p50"]), _s(v["p95"]), _s(v["max"])]
                 for s, v in [("all", d["wait_s"]), *d["by_scheduler"].items()]]))
    out.append(("Interruptions per pool", ["pool", "after a notice", "without notice", "node-hours",
                                           "per 1000 node-hours", "monthly rate", "band"],
                [[p, str(v["after_notice"]), str(v["without_notice"]), f"{v['node_hours']:,.2f}",
                  _D if v["per_1000_node_hours"] is None else f"{v['per_1000_node_hours']:g}",
                  _p(v["monthly_pct"]), v["band"] or _D] for p, v in r["interruptions"].items()]))
    sl = r["notices"]["slo"]
    out.append(("Notice SLOs (hard notices)", ["measure", "samples", "p50", "p95", "max", "target", "met"],
                [[name, str(v["samples"]), _sec(v["p50"]), _sec(v["p95"]), _sec(v["max"]), v.get("target", _D),
                  str(v["met"]) if "met" in v else _D]
                 for name, v in (("lead at receipt", sl["lead_s"]), ("delivery", sl["delivery_s"]),
                                 ("receipt to cordon", sl["cordon_s"]), ("receipt to empty", sl["empty_s"]))]))
    k = r["notices"]["by_kind"]
    out.append(("Notices by kind", list(k), [[str(v) for v in k.values()]]))
    a = r["advisories"]
    out.append(("Advisory precision", ["pool", "advisories", "followed by a reclaim", "precision"],
                [[p, str(v["advisories"]), str(v["followed_by_reclaim"]), _p(v["precision_pct"])]
                 for p, v in a["by_pool"].items()]
                + [["all", str(a["advisories"]), str(a["followed_by_reclaim"]), _p(a["precision_pct"])]]))
    out.append(("Drills", ["drill", "pool", "started", "status", "victims", "score"],
                [[x["id"], x["pool"] or _D, fmt.ts(x["started_at"]), x["status"] or _D, str(x["victims"]),
                  _D if x["score"] is None else f"{x['score']:g} ({x['passed']}/{x['checks']})"]
                 for x in r["drills"]["drills"]]))
    out.append(("Contract changes", ["at", "pool", "change", "state", "failing terms", "evidence"],
                [[fmt.ts(x["at"]), x["pool"], x["change"], x["state"], ", ".join(x["failing"]) or _D,
                  _evidence(x["evidence"])] for x in r["contract"]["changes"]]))
    return out


def _evidence(e: dict) -> str:
    if not e:
        return _D
    parts = []
    for term, v in sorted(e.items()):
        if isinstance(v, dict):
            why = v.get("reason") or v.get("why") or v.get("status") or ", ".join(f"{a}={b}" for a, b in sorted(v.items())
                                                                                 if not isinstance(b, (dict, list)))
            parts.append(f"{term}: {why}")
        else:
            parts.append(f"{term}: {v}")
    return "; ".join(parts)[:300]


# -- terminal -----------------------------------------------------------------------------------------


def table(console, r: dict) -> None:
    from rich.table import Table as RichTable

    t = RichTable(title=title(r), title_justify="left")
    for col in ("figure", "value", "what it counts"):
        t.add_column(col)
    for head in headline(r):
        t.add_row(*head)
    console.print(t)
    for name, cols, rows in tables(r):
        if not rows:
            continue
        x = RichTable(title=name, title_justify="left")
        for col in cols:
            x.add_column(col)
        for cells in rows:
            x.add_row(*cells)
        console.print(x)
    note = _stale(r)
    if note:
        console.print(note)


# -- markdown -----------------------------------------------------------------------------------------


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(cols: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "---|" * len(cols),
            *("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows)]


def markdown(r: dict) -> str:
    lines = [f"# Spot capacity report — {title(r)}", ""]
    note = _stale(r)
    if note:
        lines += [f"> {note}", ""]
    lines += _md_table(["figure", "value", "what it counts"], [list(x) for x in headline(r)]) + [""]
    for name, cols, rows in tables(r):
        lines += [f"## {name}", ""]
        lines += (_md_table(cols, rows) if rows else ["None in the window."]) + [""]
    lines += [f"State database: `{r['state_db']}`; {r['passes']['count']} passes in the window "
              f"({fmt.counts(r['passes']['by_status'])}). How each figure is computed: docs/report.md.", ""]
    return "\n".join(lines)


# -- html ---------------------------------------------------------------------------------------------

_CSS = """
:root { --ink:#1d2433; --muted:#5b6478; --line:#e3e7ef; --bg:#f6f8fb; --card:#fff; --accent:#2f6fdf; --good:#1f9d6a; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:var(--ink);
       background:var(--bg); }
header { background:linear-gradient(120deg,#17326b,#2f6fdf 60%,#3fa3c9); color:#fff; padding:28px 40px 22px; }
header h1 { margin:0 0 4px; font-size:26px; font-weight:650; }
header p { margin:0; opacity:.85; }
.kpis { display:grid; grid-template-columns:repeat(auto-fit,minmax(170px,1fr)); gap:14px; padding:20px 40px 0; }
.kpi { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.kpi .v { font-size:21px; font-weight:650; white-space:nowrap; }
.kpi .l { color:var(--muted); font-size:13px; }
.kpi.good .v { color:var(--good); }
main { padding:10px 40px 40px; }
section { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:16px 20px;
          margin-top:18px; }
section h2 { margin:0 0 10px; font-size:18px; }
.grid { display:grid; grid-template-columns:repeat(2,minmax(0,1fr)); gap:18px; align-items:start; }
@media (max-width: 900px) { .grid { grid-template-columns:1fr; } }
h3 { font-size:15px; margin:14px 0 6px; }
.grid h3:first-child { margin-top:0; }
figure { margin:0; }
figure svg { width:100%; height:auto; display:block; }
table { border-collapse:collapse; width:100%; font-size:14px; }
th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line); vertical-align:top;
         white-space:nowrap; }
td:last-child { white-space:normal; }
.scroll { overflow-x:auto; }
th { color:var(--muted); font-weight:600; background:#fafbfd; }
.note { background:#fff7e0; border:1px solid #f1d58a; border-radius:8px; padding:10px 14px; margin:16px 40px 0; }
footer { color:var(--muted); font-size:13px; padding:0 40px 30px; }
"""

_COLORS = ("#2f6fdf", "#f08c2e", "#1f9d6a", "#c8445a", "#8a5cd1", "#3fa3c9", "#b59a1b", "#6b7a90")


def _style():
    from pygal.style import Style  # type: ignore[import-untyped]

    return Style(background="white", plot_background="white", foreground="#1d2433", foreground_strong="#1d2433",
                 foreground_subtle="#8a93a6", colors=_COLORS, font_family="system-ui, 'DejaVu Sans', sans-serif",
                 label_font_size=12, major_label_font_size=12, legend_font_size=13, title_font_size=16,
                 value_font_size=11, tooltip_font_size=12)


def _chart(factory: Callable[..., Any], title_: str, **kw: Any) -> Any:
    return factory(title=title_, style=_style(), js=[], disable_xml_declaration=True, width=760, height=340,
                   explicit_size=False, legend_at_bottom=True, legend_at_bottom_columns=4, print_values=False,
                   truncate_legend=-1, truncate_label=-1, **kw)


def _labels(r: dict) -> list[str]:
    import datetime as dt

    step = r["series"]["step_s"]
    f = "%H:%M" if step < 86400 else "%m-%d"
    if r["window_s"] > 2 * 86400 and step < 86400:
        f = "%m-%d %H:%M"
    return [dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(f) for t in r["series"]["t"]]


def charts(r: dict) -> list[tuple[str, str]]:
    """(section, inline SVG) of every chart."""
    import pygal  # type: ignore[import-untyped]

    s = r["series"]
    labels = _labels(r)
    every = max(1, len(labels) // 6)  # six labelled ticks: a half-width chart holds them unrotated
    out = []
    cur = r["cost"]["currency"]
    c = _chart(pygal.Line, f"Spend vs on demand ({cur} per {fmt.duration(s['step_s'])})", fill=False,
               show_dots=False, show_minor_x_labels=False)
    c.x_labels = labels
    c.x_labels_major = labels[::every]
    c.add("spend", s["spend"], stroke_style={"width": 3})
    if s["on_demand"] is not None:
        c.add("on demand", s["on_demand"], stroke_style={"width": 3, "dasharray": "6, 4"})
    out.append(("cost", c.render(is_unicode=True)))
    c = _chart(pygal.StackedLine, "Nodes by pool (average over each step)", fill=True, show_dots=False,
               show_minor_x_labels=False)
    c.x_labels = labels
    c.x_labels_major = labels[::every]
    for pool, v in s["nodes"].items():
        c.add(pool, v)
    out.append(("nodes", c.render(is_unicode=True)))
    it = r["interruptions"]
    c = _chart(pygal.Bar, "Interruptions per pool (and per 1000 node-hours)")
    c.x_labels = list(it)
    c.add("after a notice", [v["after_notice"] for v in it.values()])
    c.add("without notice", [v["without_notice"] for v in it.values()])
    c.add("per 1000 node-hours", [v["per_1000_node_hours"] or 0 for v in it.values()])
    out.append(("interruptions", c.render(is_unicode=True)))
    sl = r["notices"]["slo"]
    c = _chart(pygal.Bar, "Notice SLO percentiles (seconds)")
    measures = (("lead", sl["lead_s"]), ("delivery", sl["delivery_s"]), ("cordon", sl["cordon_s"]),
                ("empty", sl["empty_s"]))
    c.x_labels = [m for m, _ in measures]
    for q in ("p50", "p95", "max"):
        c.add(q, [v[q] for _, v in measures])
    out.append(("notices", c.render(is_unicode=True)))
    d = r["demand"]
    c = _chart(pygal.Bar, "Wait to start percentiles (minutes)")
    groups = [("all", d["wait_s"]), *d["by_scheduler"].items()]
    c.x_labels = [g for g, _ in groups]
    for q in ("p50", "p95", "max"):
        c.add(q, [None if v[q] is None else round(v[q] / 60.0, 1) for _, v in groups])
    out.append(("waits", c.render(is_unicode=True)))
    return out


def _html_table(cols: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "<p>None in the window.</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def page(r: dict) -> str:
    """One self-contained HTML page: a header with the region, window and headline figures, then sections
    with charts and tables. No script, font or style is fetched from anywhere."""
    c = r["cost"]
    svg = dict(charts(r))
    tabs = {name: (cols, rows) for name, cols, rows in tables(r)}

    def tab(name: str) -> str:
        cols, rows = tabs[name]
        return f"<h3>{html.escape(name)}</h3>{_html_table(cols, rows)}"

    kpi = [(f"{_m(c['savings'])} {c['currency']}", f"saved vs on demand ({_p(c['savings_pct'])})", "good"),
           (f"{_m(c['spend'])} {c['currency']}", f"spent on {c['node_hours']:,.0f} node-hours", ""),
           (_p(r["demand"]["left_queue_pct"]), f"of {r['demand']['seen']} waiting units left the queue", ""),
           (_s(r["demand"]["wait_s"]["p95"]), f"p95 wait (p50 {_s(r['demand']['wait_s']['p50'])})", ""),
           (str(sum(v["interruptions"] for v in r["interruptions"].values())), "interruptions", ""),
           (_p(r["advisories"]["precision_pct"]), "advisory precision", ""),
           (str(r["contract"]["degradations"]), "contract degradations", "")]
    note = _stale(r)
    sections = [
        ("Spend and savings", [svg["cost"], svg["nodes"]], ["Spend and savings per pool", "Nodes"]),
        ("Demand and waits", [svg["waits"]], ["Waits to start"]),
        ("Interruptions", [svg["interruptions"]], ["Interruptions per pool"]),
        ("Notices and advisories", [svg["notices"]], ["Notice SLOs (hard notices)", "Notices by kind",
                                                      "Advisory precision"]),
        ("Drills and the provider contract", [], ["Drills", "Contract changes"]),
    ]
    body = []
    for name, figs, names in sections:
        figures = "".join(f"<figure>{f}</figure>" for f in figs)
        tabs_html = "".join(tab(n) for n in names)
        if len(figs) == 1:  # the chart and its tables side by side
            inner = f"<div class='grid'>{figures}<div>{tabs_html}</div></div>"
        elif figs:
            inner = f"<div class='grid'>{figures}</div>{tabs_html}"
        else:
            inner = f"<div class='grid'>{''.join(f'<div>{tab(n)}</div>' for n in names)}</div>"
        body.append(f"<section><h2>{html.escape(name)}</h2>{inner}</section>")
    kpis = "".join(f"<div class='kpi {cls}'><div class='v'>{html.escape(v)}</div><div class='l'>{html.escape(lab)}"
                   "</div></div>" for v, lab, cls in kpi)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>spotctl report — {html.escape(r['region'])}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>Spot capacity report — region {html.escape(r['region'])}</h1>"
            f"<p>{html.escape(fmt.ts(r['start']))} to {html.escape(fmt.ts(r['end']))} "
            f"({html.escape(fmt.duration(r['window_s']))}) · {r['passes']['count']} reconcile passes</p></header>"
            + (f"<div class='note'>{html.escape(note)}</div>" if note else "")
            + f"<div class='kpis'>{kpis}</div><main>{''.join(body)}</main>"
            f"<footer>From the state database {html.escape(r['state_db'])}. How each figure is computed: "
            "docs/report.md.</footer></body></html>\n")
