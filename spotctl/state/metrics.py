"""The kept counters and histograms (:mod:`spotctl.core.metrics`): written in the transaction of the
record they count, so a counter moves exactly when its record commits — a rolled-back transaction (or a
kill -9 before the commit) counts nothing, and nothing is counted twice.

Increments are summed in memory while a write transaction runs and written once per series just before
it commits (:meth:`_pre_commit`, as the outbox's pending counters are): a transaction that records a
thousand notices writes each of its few series once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from spotctl.core.metrics import SERIES_PREFIX, counter_increment, histogram_increments, merge
from spotctl.state.connection import StoreBase

log = logging.getLogger(__name__)
_UPSERT = ("INSERT INTO kv (key, value, updated_at) VALUES (?,?,?) ON CONFLICT(key) DO UPDATE SET "
           "value = CAST(kv.value AS REAL) + excluded.value, updated_at = excluded.updated_at")


class Metrics(StoreBase):
    """The metric methods of :class:`spotctl.state.store.Store`."""

    _tx_metrics: dict[str, float] | None = None
    _tx_metrics_at: float = 0.0

    def count(self, name: str, labels: Mapping[str, str], at: float, by: float = 1.0) -> None:
        """Add to a counter, in the current write transaction (or one of its own)."""
        self._add(counter_increment(name, labels, by), at)

    def observe(self, name: str, labels: Mapping[str, str], value: float, at: float) -> None:
        """One observation of a histogram, in the current write transaction (or one of its own)."""
        self._add(histogram_increments(name, labels, value), at)

    def _add(self, incs: dict[str, float], at: float) -> None:
        if not incs:
            return
        with self.tx():
            if self._tx_metrics is None:
                self._tx_metrics = {}
            merge(self._tx_metrics, incs)
            self._tx_metrics_at = max(self._tx_metrics_at, at)

    def _pre_commit(self) -> None:
        pending, self._tx_metrics = self._tx_metrics, None
        if pending:
            at = self._tx_metrics_at
            self.conn.executemany(_UPSERT, [(SERIES_PREFIX + k, v, at) for k, v in sorted(pending.items())])
        self._tx_metrics_at = 0.0
        super()._pre_commit()

    def _rolled_back(self) -> None:
        self._tx_metrics = None
        self._tx_metrics_at = 0.0
        super()._rolled_back()

    def metric_series(self) -> dict[str, float]:
        """Every kept series (key without the prefix) and its value."""
        lo, hi = SERIES_PREFIX, SERIES_PREFIX[:-1] + chr(ord(SERIES_PREFIX[-1]) + 1)
        out: dict[str, float] = {}
        for key, value in self.conn.execute("SELECT key, value FROM kv WHERE key >= ? AND key < ?", (lo, hi)):
            try:
                v = float(value)
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v) or v < 0:  # a damaged row: left out of the export, said once per read
                log.warning("state database %s: kv row %r holds %r, not a metric value: left out", self.path,
                            key, str(value)[:40])
                continue
            out[key[len(SERIES_PREFIX):]] = v
        return out
