"""The one percentile definition (stdlib only): every p50/p95/p99 spotctl reports uses it.

Nearest rank: the ``q``-th percentile of n values is the smallest value that at least
``q`` of them are less than or equal to — the value at (1-based) rank ``ceil(q * n)``. It
never interpolates, so a reported percentile is always a value that was observed (a
latency that happened), and p100 is the maximum. For n = 200, p99 is the 198th smallest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (``0 < q <= 1``) of ``values``; None when there are none."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"a percentile is a fraction in (0, 1], not {q!r}")
    v = sorted(values)
    if not v:
        return None
    return float(v[max(0, math.ceil(q * len(v)) - 1)])
