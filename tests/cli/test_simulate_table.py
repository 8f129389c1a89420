"""``spotctl simulate``'s table: a golden file at a fixed seed and width, with no Python repr in any cell.

``SPOTCTL_UPDATE_GOLDEN=1 pytest tests/cli/test_simulate_table.py`` rewrites ``golden/simulate.txt``."""

from __future__ import annotations

import re
from types import SimpleNamespace

from .goldens import assert_golden

ENV = {"COLUMNS": "120", "NO_COLOR": "1"}
REPR = re.compile(r"[{}\[\]]|\bNone\b|\bTrue\b|\bFalse\b")  # a dict, a list, None, a bool


def test_simulate_table_golden(cli, monkeypatch):
    # the one figure that is not a function of the seed: the wall time the run took
    monkeypatch.setattr("spotctl.ops.simulate.time", SimpleNamespace(perf_counter=lambda: 100.0))
    r = cli("-o", "table", "simulate", "--hours", "6", "--seed", "3", env=ENV)
    assert r.code == 0, r.stderr
    assert "200 of 200 servable (100.0 %)" in r.stdout and "8 of 208 arrived (3.9 %)" in r.stdout
    assert "calendar notices" in r.stdout
    assert_golden("simulate", r.stdout)


def test_no_python_repr_in_a_cell(cli):
    r = cli("-o", "table", "simulate", "--hours", "2", "--seed", "11", env=ENV)
    assert r.code == 0, r.stderr
    cells = [c.strip() for line in r.stdout.splitlines() for c in re.split(r"[│┃]", line)[1:-1]]
    assert cells and not [c for c in cells if REPR.search(c)], r.stdout
