"""decide_notice: the one rule by which the planner and the watcher answer a notice."""

from __future__ import annotations

import pytest

from spotctl.core.budget import Priority
from spotctl.core.config import Policy
from spotctl.core.lifecycle import DRAINABLE, cordonable, drainable, drainable_states, uncordonable
from spotctl.core.models import NodeState as S
from spotctl.core.models import Notice, NoticeKind
from spotctl.core.notices import calendar_notice, decide_notice, node_protection
from spotctl.core.timefmt import iso

NOW = 1_800_000_000.0
POL = Policy(advisory_prespin_seconds=300, advisory_drain_seconds=900, advisory_timeout_seconds=3600,
             advisory_prespin_lead_seconds=1800, advisory_drain_margin_seconds=600, drain_seconds=120,
             calendar_advisory_seconds=3600)


def hard(deadline=NOW + 150, reason="reservation"):
    return Notice(id="hn", instance_id="i1", kind=NoticeKind.HARD, issued_at=NOW - 10, deadline=deadline,
                  reason=reason)


def advisory(issued_at=NOW, deadline=None, kind=NoticeKind.ADVISORY):
    return Notice(id="adv", instance_id="i1", kind=kind, issued_at=issued_at, deadline=deadline, reason="surge")


def test_a_hard_notice_drains_a_live_node_at_once_and_asks_for_a_replacement_of_its_work():
    d = decide_notice(hard(), S.ACTIVE, NOW, POL, running=2)
    assert (d.kind, d.priority, d.deadline) == ("drain", Priority.RECLAIM, NOW + 150)
    assert d.reason == "hard notice hn (reservation), deadline in 150s"
    assert d.inputs == {"notice": "hn", "running": 2} and d.leaving and d.replace
    for state in (S.BUILDING, S.ADVISED):  # a booting node and a cordoned one are drained too
        assert decide_notice(hard(), state, NOW, POL, running=0).kind == "drain"
    idle = decide_notice(hard(), S.ACTIVE, NOW, POL, running=0)
    assert idle.leaving and not idle.replace  # nothing runs there: nothing to replace


def test_past_its_deadline_a_hard_notice_returns_the_capacity_unless_it_is_being_deleted():
    for state in (S.ACTIVE, S.DRAINING, S.FAILED):
        d = decide_notice(hard(deadline=NOW - 1), state, NOW, POL, running=1)
        assert (d.kind, d.priority, d.inputs) == ("delete", Priority.RECLAIM, {"notice": "hn"})
        assert "deadline passed" in d.reason and d.leaving and not d.replace
    assert decide_notice(hard(deadline=NOW - 1), S.DELETING, NOW, POL) is None


def test_a_hard_notice_on_a_node_already_draining_leaves_the_drain_to_its_state_machine():
    assert decide_notice(hard(), S.DRAINING, NOW, POL, running=3) is None
    assert decide_notice(hard(), S.INTENDED, NOW, POL) is None


def test_an_advisory_cordons_prespins_drains_then_times_out():
    adv = advisory()
    first = decide_notice(adv, S.ACTIVE, NOW, POL, running=1)
    assert (first.kind, first.inputs) == ("cordon", {"notice": "adv", "stage": "cordon"})
    assert first.leaving and not first.replace and first.reason.endswith("advisory adv (surge): stop new placements")
    prespin = decide_notice(adv, S.ADVISED, NOW + 400, POL, cordoned=True, cordoned_by_us=True, running=1)
    assert prespin.kind is None and prespin.leaving and prespin.replace  # cordoned already; replacement now
    drain = decide_notice(adv, S.ADVISED, NOW + 1000, POL, cordoned=True, running=1)
    assert (drain.kind, drain.inputs["stage"], drain.priority) == ("drain", "drain", Priority.RECLAIM)
    out = decide_notice(adv, S.ADVISED, NOW + 3700, POL, cordoned=True, cordoned_by_us=True)
    assert (out.kind, out.priority, out.leaving) == ("uncordon", Priority.OPERATOR, False)
    assert "timed out after 3700s" in out.reason
    # an expired advisory on a node that carries no cordon of ours: nothing to revert, no thrash
    assert decide_notice(adv, S.ACTIVE, NOW + 3800, POL).kind is None


def test_an_advisory_with_a_deadline_runs_its_stages_back_from_it():
    cal = advisory(issued_at=NOW - 100, deadline=NOW + 660, kind=NoticeKind.CALENDAR)
    d = decide_notice(cal, S.ADVISED, NOW, POL, cordoned=True, running=1)
    assert (d.kind, d.deadline) == ("drain", NOW + 660) and d.reason.endswith("reclaim in 660s")
    assert decide_notice(advisory(deadline=NOW + 1500), S.ADVISED, NOW, POL, cordoned=True, running=1).replace
    assert decide_notice(advisory(deadline=NOW + 3000), S.ACTIVE, NOW, POL).kind == "cordon"


def test_an_advisory_announced_long_ahead_leaves_the_node_working_until_it_is_due():
    """A reclaim announced hours ahead (a reservation booked for the afternoon) is acted on from
    calendar_advisory_seconds before it, as our own calendar advisories are: until then the node takes
    work; a node cordoned for it too early (by an older spotctl) takes work again."""
    early = advisory(deadline=NOW + 13 * 3600, kind=NoticeKind.CALENDAR)
    d = decide_notice(early, S.ACTIVE, NOW, POL)
    assert d.kind is None and not d.leaving and "takes work until" in d.reason
    assert iso(NOW + 13 * 3600 - 3600, sep=" ") in d.reason
    undo = decide_notice(early, S.ADVISED, NOW, POL, cordoned=True, cordoned_by_us=True)
    assert (undo.kind, undo.priority) == ("uncordon", Priority.OPERATOR) and "not due before" in undo.reason
    assert decide_notice(early, S.ACTIVE, NOW + 12 * 3600 + 1, POL).kind == "cordon"  # an hour ahead: due


def test_a_booting_node_is_cordoned_only_once_a_scheduler_knows_it():
    assert decide_notice(advisory(), S.BUILDING, NOW, POL, known=True).kind == "cordon"
    unknown = decide_notice(advisory(), S.BUILDING, NOW, POL, known=False)
    assert unknown.kind is None and unknown.leaving and "once it registers" in unknown.reason


def test_a_cleared_advisory_uncordons_what_we_cordoned():
    d = decide_notice(None, S.ADVISED, NOW, POL, cordoned=True, cordoned_by_us=True)
    assert (d.kind, d.priority, d.reason) == ("uncordon", Priority.OPERATOR, "advisory cleared: accept work again")
    assert decide_notice(None, S.BUILDING, NOW, POL, cordoned_by_us=True).kind == "uncordon"
    assert decide_notice(None, S.BUILDING, NOW, POL) is None
    assert decide_notice(None, S.ACTIVE, NOW, POL, cordoned=True) is None  # someone else's cordon: not ours
    assert decide_notice(None, S.DRAINING, NOW, POL) is None


def test_without_a_scheduler_reading_no_running_count_is_claimed():
    """The watcher reads no scheduler: its decision records no "running" and asks for no replacement."""
    d = decide_notice(hard(), S.ACTIVE, NOW, POL)
    assert d.inputs == {"notice": "hn"} and not d.replace


@pytest.mark.parametrize("state", list(S))
def test_the_state_rules(state):
    assert drainable(state) is (state in (S.BUILDING, S.ACTIVE, S.ADVISED))
    assert cordonable(state, cordoned=False, known=True) is (state in (S.BUILDING, S.ACTIVE))
    assert not cordonable(state, cordoned=True, known=True)
    assert cordonable(state, cordoned=False, known=False) is (state is S.ACTIVE)
    assert uncordonable(state, cordoned_by_us=False) is (state is S.ADVISED)
    assert uncordonable(state, cordoned_by_us=True) is (state in (S.ADVISED, S.BUILDING))


def test_drainable_states_in_words():
    assert drainable_states() == "building, active or advised" and len(DRAINABLE) == 3


def test_the_calendar_announces_a_reservation_as_an_advisory_once_it_is_due():
    assert calendar_notice("h0", "p1", NOW + 3601, NOW, POL) is None
    n = calendar_notice("h0", "p1", NOW + 3000, NOW, POL)
    assert (n.kind, n.deadline, n.issued_at, n.pool) == (NoticeKind.CALENDAR, NOW + 3000, NOW - 600, "p1")
    assert n.id == f"calendar-h0-{int(NOW + 3000)}" and "h0" in n.reason
    assert node_protection(None, NOW, POL, 600) == (None, False)
    assert node_protection(NOW + 3000, NOW, POL, 600) == (NOW + 3000 - 720, False)
    assert node_protection(NOW + 3000, NOW, POL, 3600) == (NOW + 3000 - 720, True)
