"""The regional token budget: a token bucket with priority classes.

Every mutating call to the cloud takes a token. Lower classes may only take a
token while the bucket stays above the reserve kept for higher classes, so a
burst of launches can never starve reclaim handling. The bucket level is
persisted (by the state store) so the CLI, the timer and drills share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class Priority(IntEnum):
    """Lower value = more important."""

    RECLAIM = 0
    REPLACEMENT = 1
    OPERATOR = 2
    LAUNCH = 3
    DRILL = 4
    CONSOLIDATION = 5


# Fraction of the burst kept back for the classes above each class.
RESERVE_FRACTION: dict[Priority, float] = {
    Priority.RECLAIM: 0.0,
    Priority.REPLACEMENT: 0.05,
    Priority.OPERATOR: 0.10,
    Priority.LAUNCH: 0.20,
    Priority.DRILL: 0.30,
    Priority.CONSOLIDATION: 0.40,
}


@dataclass(frozen=True)
class Bucket:
    """An immutable bucket state: ``tokens`` at time ``at``."""

    rate: float
    burst: int
    tokens: float
    at: float

    @classmethod
    def full(cls, rate: float, burst: int, at: float) -> "Bucket":
        return cls(rate, burst, float(burst), at)

    def refill(self, now: float) -> "Bucket":
        if now <= self.at:
            return self
        tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        return Bucket(self.rate, self.burst, tokens, now)

    def reserve(self, priority: Priority) -> float:
        return self.burst * RESERVE_FRACTION[priority]

    def available(self, priority: Priority, now: float) -> int:
        """Whole tokens this class may take now."""
        b = self.refill(now)
        return max(0, int(b.tokens - b.reserve(priority) + 1e-9))

    def take(self, n: int, priority: Priority, now: float) -> tuple["Bucket", int]:
        """Take up to ``n`` tokens; return the new bucket and how many were granted."""
        b = self.refill(now)
        granted = min(n, b.available(priority, now))
        return Bucket(b.rate, b.burst, b.tokens - granted, b.at), granted

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst, "tokens": self.tokens, "at": self.at}
