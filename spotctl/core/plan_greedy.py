"""A price-greedy reference planner (issue 18): cheapest pool first, blind to the calendar and to risk.

It is the baseline the planner-quality benchmark (``benchmarks/planner_quality.py``) measures
spotctl's planner against: what a lowest-price spot allocator does. It has the planner's interface,
``plan(PlanInput) -> Plan``, and is the planner itself run on what such an allocator sees of the input:

- no forward calendar (every pool keeps its capacity for the whole horizon) and no hosts a
  reservation takes (``host_reclaims``): work is packed as if no reservation were coming, and the
  schedulers are not told by when work on a soon-reserved host must end;
- no risk: no advisories, no recent reclaims (so the pool order is price per vCPU-hour alone), and
  no pool under the no-notice policy (a pool whose provider contract is degraded is used like any other).

Everything else is the planner's: notices are handled, headroom (host by host), pool limits, quota,
the spend cap, launches per pass and the token budget are respected, failed pools are skipped until
their TTL. So the gap between the two planners is what the calendar and the risk terms are worth.
Pure and deterministic, like the planner (stdlib only, nothing above core).
"""

from __future__ import annotations

from dataclasses import replace

from .actions import Plan
from .plan_input import PlanInput
from .planner import plan as spotctl_plan


def blind(inp: PlanInput) -> PlanInput:
    """What a price-greedy allocator sees of ``inp``: no calendar, no reservations ahead, no risk."""
    return replace(inp, calendars={}, host_reclaims={}, advisories={}, recent_reclaims={},
                   no_notice_pools=frozenset())


def plan(inp: PlanInput) -> Plan:
    """The price-greedy plan for ``inp`` (see the module's docstring)."""
    return spotctl_plan(blind(inp))
