"""The one timestamp formatter/parser (``spotctl.core.timefmt``) and the one percentile (``spotctl.core.stats``).

The formats are pinned where they cross a boundary: seconds for Kubernetes annotations, Slurm and
the simulator's notice reasons, milliseconds for the contract API (``docs/contract/openapi.yaml``),
datetime's ``auto`` for the state store's event times.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotctl.core.stats import percentile
from spotctl.core.timefmt import iso, parse_ts

T = 1767225600.0  # 2026-01-01T00:00:00Z


def test_the_formats():
    assert iso(T) == "2026-01-01T00:00:00Z"
    assert iso(T + 59.9999996) == "2026-01-01T00:00:59Z"  # seconds truncate, as time.gmtime does (datetime: 01:00)
    assert iso(T + 0.25, "milliseconds") == "2026-01-01T00:00:00.250Z"
    assert iso(T + 0.25, "auto") == "2026-01-01T00:00:00.250000Z" and iso(T, "auto") == "2026-01-01T00:00:00Z"
    assert iso(T, sep=" ") == "2026-01-01 00:00:00Z"
    assert iso(None) is None and iso(math.inf) is None and iso(math.nan, "milliseconds") is None
    with pytest.raises(ValueError):
        iso(T, "minutes")


@given(st.floats(min_value=0, max_value=4102444800, allow_nan=False))
def test_each_format_is_what_it_replaced(t):
    # seconds: slurm._iso / kubernetes._rfc3339 / sim.contract.iso; milliseconds: services.contract_api.iso;
    # auto: state.store.iso
    assert iso(t) == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    dt = datetime.fromtimestamp(t, timezone.utc)
    assert iso(t, "milliseconds") == dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert iso(t, "auto") == dt.isoformat().replace("+00:00", "Z")


@given(st.floats(min_value=0, max_value=4102444800, allow_nan=False))
def test_parse_reads_what_iso_writes(t):
    assert parse_ts(iso(t, "microseconds")) == pytest.approx(t, abs=1e-6)
    assert parse_ts(iso(t)) == math.floor(t)


def test_parse_ts():
    assert parse_ts("2026-01-01T00:00:00Z") == T
    assert parse_ts("2026-01-01t00:00:00z") == T
    assert parse_ts("2026-01-01T01:00:00+01:00") == T
    assert parse_ts("2026-01-01T00:00:00.500Z") == T + 0.5
    assert parse_ts(T) == T and parse_ts(int(T)) == T and parse_ts(None) is None
    for bad in ("2026-01-01T00:00:00", "yesterday", "", True, [T], math.inf, math.nan):
        with pytest.raises(ValueError):
            parse_ts(bad)
    # APIs that document UTC but leave the zone out (OpenStack)
    assert parse_ts("2026-01-01T00:00:00.000000", assume_utc=True) == T
    assert parse_ts("2026-01-01 00:00", assume_utc=True) == T


def test_percentile_is_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([4, 1, 3, 2], 0.5) == 2.0  # the smallest value at least half are <= to
    assert percentile([4, 1, 3, 2], 0.75) == 3.0 and percentile([4, 1, 3, 2], 1.0) == 4.0
    values = list(range(1, 201))
    assert percentile(values, 0.99) == 198.0 and percentile(values, 0.95) == 190.0
    with pytest.raises(ValueError):
        percentile(values, 0)
    with pytest.raises(ValueError):
        percentile(values, 99)


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1), st.floats(0.01, 1.0))
def test_a_percentile_is_an_observed_value_with_at_least_q_at_or_below_it(values, q):
    p = percentile(values, q)
    assert p in values
    assert sum(v <= p for v in values) >= q * len(values) - 1e-9
    assert sum(v < p for v in values) < q * len(values)
