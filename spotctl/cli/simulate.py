"""spotctl simulate"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import render
from .context import state
from .options import finite

app = typer.Typer(rich_markup_mode=None, add_completion=False)


@app.command()
def simulate(
    ctx: typer.Context,
    hours: Annotated[float, typer.Option(
        "--hours", "-H", callback=finite(gt=0, hi=336), help="Simulated hours to replay (max 336).")] = 24.0,
    seed: Annotated[Optional[int], typer.Option("--seed", "-s", help="World seed (default: the region's seed).")] = None,
    interval: Annotated[int, typer.Option(
        "--interval", min=1, max=86400, help="Seconds between reconcile passes, as the timer would.")] = 60,
    keep_state: Annotated[Optional[str], typer.Option(
        "--keep-state", help="Keep the simulation's state database in this directory (for `audit` and inspection).")] = None,
) -> None:
    """Replay hours of the region on a virtual clock and report the outcome.

    Runs the reconciler against a fresh simulated world built from the
    region's pools and policy (the demo region by default): cost, demand
    served, wait times, interruptions, notices handled before their deadline.
    The region's own state is not touched. Same seed, same report.

    Example: spotctl simulate --hours 24 --seed 7
    """
    st = state(ctx)
    from spotctl.ops.simulate import simulate as run_sim
    from spotctl.wiring import sim_world_factory

    show = _hourly(st, hours)
    report = run_sim(st.config().region(st.region), sim_world_factory, hours=hours, seed=seed, interval=interval,
                     state_dir=keep_state, progress=show)
    show.done()
    render.emit(st.fmt(), "simulate", report, table=_table)


class _hourly:
    """Progress on stderr: one updating line on a terminal, a line every few hours otherwise."""

    def __init__(self, st, hours: float):
        import sys

        self.st, self.err = st, sys.stderr
        self.tty = self.err.isatty()
        self.every = max(1, int(hours // 6))
        self.n = 0

    def __call__(self, message: str) -> None:
        self.n += 1
        if self.st.quiet:
            return
        if self.tty:
            self.err.write(f"\rspotctl: {message}   ")
            self.err.flush()
        elif self.n % self.every == 0:
            self.st.progress(message)

    def done(self) -> None:
        if self.tty and self.n and not self.st.quiet:
            self.err.write("\n")


def _table(console, r: dict) -> None:
    from rich.table import Table

    t = Table(title=f"Simulated {r.get('hours')} h (seed {r.get('seed')})", title_justify="left", show_header=False)
    t.add_column("metric")
    t.add_column("value")
    cost = r.get("cost", {})
    dm = r.get("demand", {})
    w = r.get("wait_seconds", {})
    it = r.get("interruptions", {})
    no = r.get("notices", {})
    rec = r.get("reconciler", {})
    t.add_row("cost", f"{cost.get('total', 0):.2f} {cost.get('currency', '')}")
    t.add_row("demand served", f"{dm.get('completed')} completed, {dm.get('started')} started of {dm.get('arrived')} arrived "
              f"({dm.get('served_pct')}%), {dm.get('pending')} still pending")
    t.add_row("wait", f"p50 {render.duration(w.get('p50'))}, p95 {render.duration(w.get('p95'))}, "
              f"max {render.duration(w.get('max'))}")
    t.add_row("interruptions", f"{it.get('requeued_units')} requeued, {it.get('lost_units')} lost, "
              f"{it.get('nodes_lost_without_notice')} nodes lost without notice")
    t.add_row("notices", f"{no.get('hard')} hard ({no.get('handled_before_deadline')} handled before the deadline, "
              f"{no.get('missed')} missed), {no.get('advisory')} advisories")
    t.add_row("reconciler", f"{rec.get('passes')} passes, actions {rec.get('actions')}, tokens {rec.get('tokens_used')}")
    audit = rec.get("audit", {})
    t.add_row("audit", f"{audit.get('records')} records, chain {'ok' if audit.get('chain_ok') else 'BROKEN'}")
    t.add_row("wall time", f"{r.get('wall_seconds')} s")
    console.print(t)
