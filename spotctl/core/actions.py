"""The planner's output: ordered actions, each with its reason and inputs, and the plan around them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .budget import Priority
from .models import ActionKind

__all__ = ["Action", "ActionKind", "Plan"]


@dataclass(frozen=True)
class Action:
    id: str
    kind: ActionKind
    priority: Priority
    reason: str
    pool: str | None = None
    count: int | None = None
    node: str | None = None
    units: int = 0
    price: float | None = None
    deadline: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "kind": str(self.kind), "priority": self.priority.name.lower(),
            "pool": self.pool, "reason": self.reason, "inputs": self.inputs,
        }
        if self.count is not None:
            d["count"] = self.count
        if self.node is not None:
            d["node"] = self.node
        if self.kind is ActionKind.LAUNCH:
            d["units"] = self.units
            d["price_per_node_hour"] = self.price
        if self.deadline is not None:
            d["deadline"] = self.deadline
        return d


@dataclass(frozen=True)
class Plan:
    id: str
    region: str
    now: float
    actions: tuple[Action, ...]
    unplaced: dict[str, int]
    pools: list[dict[str, Any]]
    demand: dict[str, Any]
    inputs: dict[str, Any]
    explain: tuple[str, ...]
    excluded: tuple[dict[str, Any], ...] = ()

    def actions_digest(self) -> str:
        """SHA-256 of the ordered action list (every field of every action): what a replay compares."""
        body = json.dumps([a.to_dict() for a in self.actions], sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(body.encode()).hexdigest()

    def launches(self) -> int:
        return sum(a.count or 0 for a in self.actions if a.kind is ActionKind.LAUNCH)

    def to_dict(self, explain: bool = False) -> dict[str, Any]:
        d = {
            "id": self.id, "region": self.region, "now": self.now,
            "actions": [a.to_dict() for a in self.actions],
            "unplaced": self.unplaced, "pools": self.pools, "demand": self.demand, "inputs": self.inputs,
            "excluded": list(self.excluded),
        }
        if explain:
            d["explain"] = list(self.explain)
        return d
