"""What the planner's steps share while one plan is made.

:func:`spotctl.core.planner.plan` runs its sub-planners in order over one :class:`PlanState`; each
reads what the earlier ones decided (which nodes are leaving, what demand is left, which tokens
are spent) and adds its own actions and explanations. Nothing else is shared between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .actions import Action
from .budget import Bucket, Priority
from .capacity import calendar_id
from .models import ActionKind
from .plan_input import DemandClass, NodeView, PlanInput


@dataclass
class PlanState:
    inp: PlanInput
    plan_id: str
    prices: dict[str, float]  # pool -> price per node-hour (empty without a rate card)
    base_inputs: dict[str, Any]  # in every action's inputs: rate-card version, calendar id, budget tokens
    bucket: Bucket  # the token budget as this plan spends it: higher classes are planned first
    actions: list[Action] = field(default_factory=list)  # in the order decided (sorted by priority at the end)
    explain: list[str] = field(default_factory=list)
    # housekeeping ->
    leaving: set[str] = field(default_factory=set)  # nodes on their way out: no new work, no scale-down, no spend
    to_replace: list[NodeView] = field(default_factory=list)  # nodes whose running work needs capacity elsewhere
    demand: list[DemandClass] = field(default_factory=list)  # pending demand, then replacement demand
    remaining: dict[str, int] = field(default_factory=dict)  # demand class key -> units not placed yet
    # fill existing nodes ->
    used_nodes: set[str] = field(default_factory=set)  # our nodes that this plan puts work on
    covered: int = 0  # units placed on our existing nodes
    # pack new nodes ->
    unplaced: dict[str, int] = field(default_factory=dict)  # reason -> units that no node takes

    @classmethod
    def start(cls, inp: PlanInput) -> "PlanState":
        rc = inp.rate_card
        return cls(
            inp=inp, plan_id=inp.digest()[:12], prices=dict(rc.prices) if rc else {},
            base_inputs={"rate_card_version": rc.version if rc else None, "calendar_id": calendar_id(inp.calendars),
                         "budget_tokens": round(inp.budget.refill(inp.now).tokens, 3)},
            bucket=inp.budget.refill(inp.now), demand=list(inp.demand),
            remaining={d.key: d.count for d in inp.demand},
        )

    @property
    def now(self) -> float:
        return self.inp.now

    def add(self, kind: ActionKind, priority: Priority, reason: str, **kw: Any) -> Action:
        """Add an action; its inputs are the plan's base inputs and what ``inputs=`` adds."""
        a = Action(id=f"{self.plan_id}-{len(self.actions):03d}", kind=kind, priority=priority, reason=reason,
                   inputs={**self.base_inputs, **kw.pop("inputs", {})}, **kw)
        self.actions.append(a)
        return a

    def tokens(self, priority: Priority, n: int) -> int:
        """Take up to ``n`` tokens of the class ``priority`` from the plan's budget; how many were granted."""
        self.bucket, granted = self.bucket.take(n, priority, self.now)
        return granted

    def add_demand(self, d: DemandClass) -> None:
        self.demand.append(d)
        self.remaining[d.key] = d.count
