"""What a reclaim means for a node: the notice decision, the advisory stages, the calendar's windows.

One rule for both paths that act on notices: the planner's housekeeping (every pass) and the
watcher's fast path (``spot-reconciler watch``, at once) call :func:`decide_notice` and carry out
what it says; neither has a rule of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .budget import Priority
from .config import Policy
from .lifecycle import cordonable, drainable, uncordonable
from .models import ActionKind, NodeState, Notice, NoticeKind
from .timefmt import iso


@dataclass(frozen=True)
class NoticeDecision:
    """What to do about a node's notice (or its lack of one) now.

    ``kind`` is the action (``delete`` | ``drain`` | ``cordon`` | ``uncordon``), or None when the
    notice is handled and there is nothing to do this time (already cordoned; an expired advisory).
    ``leaving``: the node is on its way out, no new work is planned onto it; ``replace``: the work
    running there needs capacity elsewhere, soon."""

    kind: ActionKind | None
    priority: Priority
    reason: str
    deadline: float | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    leaving: bool = False
    replace: bool = False


def decide_notice(notice: Notice | None, state: NodeState, now: float, policy: Policy, *,
                  cordoned: bool = False, cordoned_by_us: bool = False, known: bool = True,
                  running: int | None = None) -> NoticeDecision | None:
    """The decision about one node's notice (its strongest: a hard one first), pure.

    - a hard notice whose deadline has passed: delete (the capacity must be returned), unless the
      node is being deleted already;
    - a hard notice on a drainable node: drain now;
    - an advisory (or a calendar advisory) on a drainable node: the graduated response of
      :func:`advisory_stage` — cordon, pre-spin a replacement, drain — and, once time-boxed out,
      uncordon;
    - no notice on a node that carries our advisory cordon: the advisory cleared, uncordon.

    None when the notice does not decide the node's next step: its lifecycle does (a drain under way
    goes on round by round, a failed build is deleted), or there is nothing to do.

    ``cordoned`` counts any cordon, ``cordoned_by_us`` only ours; ``known``: some scheduler knows
    the node (a booting one that none does has nothing to cordon yet); ``running``: workloads on it,
    None when the caller did not read the schedulers (then no replacement is asked for).
    """
    seen = {} if running is None else {"running": running}
    if notice is None:
        if uncordonable(state, cordoned_by_us=cordoned_by_us):
            return NoticeDecision(ActionKind.UNCORDON, Priority.OPERATOR, "advisory cleared: accept work again")
        return None
    if notice.kind is NoticeKind.HARD:
        deadline = notice.deadline
        if deadline is not None and now >= deadline and state is not NodeState.DELETING:
            return NoticeDecision(ActionKind.DELETE, Priority.RECLAIM,
                                  f"hard notice {notice.id} deadline passed: make sure the capacity is returned",
                                  deadline=deadline, inputs={"notice": notice.id}, leaving=True)
        if drainable(state):
            left = (deadline - now) if deadline else None
            return NoticeDecision(
                ActionKind.DRAIN, Priority.RECLAIM,
                f"hard notice {notice.id} ({notice.reason or 'reclaim'})"
                + (f", deadline in {int(left)}s" if left is not None else ""),
                deadline=deadline, inputs={"notice": notice.id, **seen}, leaving=True, replace=bool(running))
        return None
    if not drainable(state):
        return None
    stage = advisory_stage(notice, now, policy)
    what = f"{notice.kind.value} advisory {notice.id} ({notice.reason or 'reclaim risk'})"
    if stage == "expired":
        # Time-boxed: an advisory that neither cleared nor became a notice stops steering us.
        if uncordonable(state, cordoned_by_us=cordoned_by_us):
            return NoticeDecision(ActionKind.UNCORDON, Priority.OPERATOR,
                                  f"{what} timed out after {int(now - notice.issued_at)}s: accept work again",
                                  inputs={"notice": notice.id})
        return NoticeDecision(None, Priority.OPERATOR, f"{what} timed out: nothing to revert")
    if stage == "early":
        due = notice.deadline - max(policy.calendar_advisory_seconds, policy.advisory_prespin_lead_seconds) \
            if notice.deadline is not None else now
        if uncordonable(state, cordoned_by_us=cordoned_by_us):  # cordoned for it before: too soon for that
            return NoticeDecision(ActionKind.UNCORDON, Priority.OPERATOR,
                                  f"{what}: not due before {iso(due, sep=' ')}: accept work until then",
                                  inputs={"notice": notice.id})
        return NoticeDecision(None, Priority.OPERATOR, f"{what}: the node takes work until {iso(due, sep=' ')}")
    if stage == "drain":
        when = f", reclaim in {int(notice.deadline - now)}s" if notice.deadline is not None else ""
        return NoticeDecision(ActionKind.DRAIN, Priority.RECLAIM, f"{what}: drain ahead of the reclaim{when}",
                              deadline=notice.deadline, inputs={"notice": notice.id, "stage": stage, **seen},
                              leaving=True, replace=bool(running))
    replace = stage == "prespin" and bool(running)
    if cordonable(state, cordoned=cordoned, known=known):
        return NoticeDecision(ActionKind.CORDON, Priority.RECLAIM, f"{what}: stop new placements",
                              inputs={"notice": notice.id, "stage": "cordon"}, leaving=True, replace=replace)
    # cordoned already, or still booting unknown to every scheduler (cordoned once it registers)
    return NoticeDecision(None, Priority.RECLAIM, f"{what}: new placements stopped already"
                          if cordoned or state is NodeState.ADVISED else f"{what}: cordoned once it registers",
                          leaving=True, replace=replace)


def advisory_stage(notice: Notice, now: float, policy: Policy) -> str:
    """Where the graduated response to an advisory stands: (early →) cordon → prespin → drain, or expired.

    With a deadline (a calendar reclaim, a lease start) the stages run back from
    it, so that the node is empty before the provider's hard notice, and begin
    ``calendar_advisory_seconds`` before it (``early`` until then: the node
    takes work); without one they run forward from the advisory, and give up
    after the time box.
    """
    if notice.deadline is not None:
        left = notice.deadline - now
        if left <= policy.drain_seconds + policy.advisory_drain_margin_seconds:
            return "drain"
        if left <= policy.advisory_prespin_lead_seconds:
            return "prespin"
        if left > max(policy.calendar_advisory_seconds, policy.advisory_prespin_lead_seconds):
            # announced long ahead (a reservation booked for tomorrow, a lease end): the node keeps taking
            # work until the reclaim is ``calendar_advisory_seconds`` away, the rule of our own calendar
            # advisories (calendar_advisory_due), not from the moment the provider tells us
            return "early"
        return "cordon"
    age = now - notice.issued_at
    if age >= policy.advisory_timeout_seconds:
        return "expired"
    if age >= policy.advisory_drain_seconds:
        return "drain"
    if age >= policy.advisory_prespin_seconds:
        return "prespin"
    return "cordon"


def calendar_advisory_due(reclaim_at: float, at: float, policy: Policy) -> bool:
    """Whether a reservation taking capacity back at ``reclaim_at`` is, at time ``at``, close enough for
    its calendar advisory (cordon, then the graduated response): ``calendar_advisory_seconds`` ahead.
    One rule for both uses: housekeeping cordons nodes by it, and launching skips capacity that it
    would cordon before a new node could take work."""
    return reclaim_at - at <= policy.calendar_advisory_seconds


def calendar_notice(host: str, pool: str, reclaim_at: float, now: float, policy: Policy) -> Notice | None:
    """The calendar advisory of a node whose host a reservation (Blazar) takes at ``reclaim_at``, once it is
    due (:func:`calendar_advisory_due`): the reclaim is predictable, so it is announced long before the
    provider's hard notice. None while it is not due yet."""
    if not calendar_advisory_due(reclaim_at, now, policy):
        return None
    return Notice(id=f"calendar-{host}-{int(reclaim_at)}", instance_id="", kind=NoticeKind.CALENDAR,
                  issued_at=reclaim_at - policy.calendar_advisory_seconds, deadline=reclaim_at,
                  reason=f"reservation takes host {host}", pool=pool)


def node_protection(reclaim_at: float | None, now: float, policy: Policy,
                    longest_seconds: int) -> tuple[float | None, bool]:
    """By when work on a node must end, and whether no new work may start at all.

    ``reclaim_at``: when a reservation takes the node's host (None: nothing does). Work must end before
    the calendar advisory's drain stage begins (``drain_seconds + advisory_drain_margin_seconds`` ahead),
    or it would be requeued. ``closed`` when what is left of that window is shorter than the longest work
    that could land (``longest_seconds``): a scheduler that knows no durations (Kubernetes) must then take
    no new work there; one that does (Slurm) judges each job by its time limit against ``until``."""
    if reclaim_at is None:
        return None, False
    until = reclaim_at - policy.drain_seconds - policy.advisory_drain_margin_seconds
    return until, until - now < longest_seconds
