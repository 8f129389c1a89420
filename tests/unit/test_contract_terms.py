"""The hard-notice term: what makes a notice late, and when a degraded term is restored."""

from __future__ import annotations

from spotctl.core.contract import SeenNotice, lateness, notice_term

T = 1_767_000_000.0


def on_time(i: int, at: float) -> SeenNotice:
    return SeenNotice(id=f"ok-{i}", issued_at=at, deadline=at + 150, first_seen_at=at + 0.2, delivered_at=at + 0.1)


def test_a_notice_is_late_by_its_lead_its_delivery_or_the_time_left_when_we_saw_it():
    assert lateness(on_time(1, T)) == []
    assert lateness(SeenNotice("a", T, T + 60))[0].startswith("lead 60s")
    assert "delivered 3.0s" in lateness(SeenNotice("b", T, T + 150, delivered_at=T + 3))[0]
    # issued 90 s before it reached us, no delivery stamp: 60 s left at receipt is late, whatever the lead
    seen_late = SeenNotice("c", T, T + 150, first_seen_at=T + 91)
    assert lateness(seen_late) == ["59s left when first seen"]
    assert notice_term([seen_late], T + 100)["state"] == "degraded"


def test_one_late_notice_degrades_and_on_time_notices_restore_after_the_hold_off():
    late = SeenNotice("late", T, T + 60, first_seen_at=T + 0.1)
    seen = [late]
    assert notice_term(seen, T + 10)["state"] == "degraded"
    # two on time: not yet (three in a row are needed)
    seen += [on_time(1, T + 600), on_time(2, T + 1200)]
    assert notice_term(seen, T + 4000)["state"] == "degraded"
    seen.append(on_time(3, T + 1800))
    # three on time, but the hold-off (1 h since the late one) has not passed
    t = notice_term(seen, T + 3000)
    assert t["state"] == "degraded" and t["evidence"]["on_time_since"] == 3
    t = notice_term(seen, T + 3600)
    assert t["state"] == "met" and "3 notices on time since late" in t["evidence"]["restored"]
    # a new late notice degrades again at once, and the count starts over
    seen.append(SeenNotice("late-2", T + 3700, T + 3800, first_seen_at=T + 3700))
    t = notice_term(seen, T + 3701)
    assert t["state"] == "degraded" and t["evidence"]["last_late"]["id"] == "late-2"


def test_the_rule_is_configurable():
    late = SeenNotice("late", T, T + 60)
    seen = [late, on_time(1, T + 10)]
    assert notice_term(seen, T + 20, restore_notices=1, restore_hold_seconds=0)["state"] == "met"
    assert notice_term(seen, T + 20, restore_notices=2, restore_hold_seconds=0)["state"] == "degraded"
