"""Drill scoring (spotctl.core.drill): each check's evidence -> its result, and unchecked when not exercised."""

from __future__ import annotations

import pytest

from spotctl.core.contract import SeenNotice
from spotctl.core.drill import (
    CHECKS,
    DONE_GRACE_SECONDS,
    DrainRound,
    DrillFacts,
    ReplacementLaunch,
    SeenTransition,
    VictimFacts,
    deadline,
    replaced_nodes,
    replacement_seconds,
    replacement_settled,
    score,
    score_victim,
    shortfall_ready_at,
    stop_reason,
    victim_handled,
)

T = 1_767_000_000.0
NOTICE = 150.0


def hard(**kw) -> SeenNotice:
    base = dict(id="ntc-1", issued_at=T, deadline=T + NOTICE, first_seen_at=T + 0.2, delivered_at=T + 0.1,
                kind="hard", instance_id="i-1", pool="gp")
    return SeenNotice(**{**base, **kw})


def advisory(**kw) -> SeenNotice:
    base = dict(id="adv-1", issued_at=T, deadline=T + 300 + NOTICE, first_seen_at=T + 0.2, kind="advisory",
                instance_id="i-1", pool="gp")
    return SeenNotice(**{**base, **kw})


def returned(deleting_at: float = T + 60, gone_reason: str = "instance deleted, allocations freed"):
    return (SeenTransition("draining", T + 1, "hard notice"), SeenTransition("deleting", deleting_at, "drained"),
            SeenTransition("gone", deleting_at + 5, gone_reason))


def victim(**kw) -> VictimFacts:
    """A victim that passed every check: notice on time, drained in time (2 jobs), returned by us."""
    n = hard()
    base = dict(node="spot-gp-1", instance_id="i-1", reclaimed_at=T, hard_notice=n, first_notice=n,
                drain=DrainRound(at=T + 1, running=2), transitions=returned(),
                activations=(("spot-gp-1", T + 10), ("spot-gp-2", T + 40.04)))
    return VictimFacts(**{**base, **kw})


def checks(v: VictimFacts, lead: float = 0.0) -> dict:
    return score_victim(v, NOTICE, lead)[1]


def test_a_victim_with_every_piece_of_evidence_passes_every_check():
    row, results = score_victim(victim(), NOTICE)
    assert results == dict.fromkeys(CHECKS, True)
    assert row["unchecked"] == [] and row["delivery_latency_s"] == 0.1 and row["notice_lead_s"] == 150.0
    assert row["left_at_receipt_s"] == 149.8 and row["drained_before_deadline"] is True
    assert (row["jobs_requeued"], row["jobs_lost"]) == (2, 0) and row["capacity_returned_by_deadline"] is True
    assert row["time_to_replacement_s"] == 40.0  # the victim's own activation does not count
    assert row["final_state"] == "gone" and row["notice"] == "ntc-1" and row["advisory"] is None


@pytest.mark.parametrize("notice,expect", [
    (hard(delivered_at=T + 0.9), True),
    (hard(delivered_at=T + 1.5), False),
    (hard(delivered_at=None), False),  # no delivery stamp: not observed within 1 s, so not passed
])
def test_delivery_latency(notice, expect):
    assert checks(victim(hard_notice=notice, first_notice=notice))["delivery_latency"] is expect


@pytest.mark.parametrize("notice,expect", [
    (hard(deadline=T + 120), True),
    (hard(deadline=T + 90), False),
    (hard(deadline=None), False),  # no deadline: no lead observed
])
def test_notice_lead(notice, expect):
    assert checks(victim(hard_notice=notice, first_notice=notice))["notice_lead"] is expect


def test_drained_before_deadline_needs_an_accepted_round_in_time():
    assert checks(victim(drain=DrainRound(at=T + NOTICE, running=0)))["drained_before_deadline"] is True
    assert checks(victim(drain=DrainRound(at=T + NOTICE + 1, running=0)))["drained_before_deadline"] is False
    assert checks(victim(drain=None))["drained_before_deadline"] is False


def test_jobs_lost_counts_what_the_round_said_ran_and_is_unchecked_when_no_round_said():
    late = score_victim(victim(drain=DrainRound(at=T + NOTICE + 1, running=3)), NOTICE)
    assert late[1]["jobs_lost"] is False and (late[0]["jobs_requeued"], late[0]["jobs_lost"]) == (0, 3)
    # a watcher round does not say what ran there
    row, results = score_victim(victim(drain=DrainRound(at=T + 1, running=None)), NOTICE)
    assert results["jobs_lost"] is None and row["unchecked"] == ["jobs_lost"]
    # no accepted drain round at all: what ran there was not observed either (not a pass)
    row, results = score_victim(victim(drain=None), NOTICE)
    assert results["jobs_lost"] is None and "jobs_lost" in row["unchecked"]
    assert row["time_to_replacement_s"] is None  # nothing known to have moved


def test_capacity_returned_by_us_by_the_deadline():
    assert checks(victim())["capacity_returned"] is True
    assert checks(victim(transitions=returned(deleting_at=T + NOTICE + 1)))["capacity_returned"] is False
    # taken back by the provider at the deadline: not returned by us
    taken = returned(gone_reason="reclaimed after notice ntc-1")
    assert checks(victim(transitions=taken))["capacity_returned"] is False
    assert checks(victim(transitions=(SeenTransition("deleting", T + 60),)))["capacity_returned"] is False  # not gone
    assert checks(victim(transitions=()))["capacity_returned"] is False


def test_given_back_on_the_advisory_alone_the_notice_checks_are_unchecked():
    adv = advisory()
    row, results = score_victim(victim(hard_notice=None, first_notice=adv), NOTICE, 300)
    assert results["delivery_latency"] is None and results["notice_lead"] is None
    assert row["unchecked"] == ["delivery_latency", "notice_lead"] and row["advisory"] == "adv-1"
    # the advisory's deadline (when the hard notice's falls) is the one the node is held to
    assert deadline(victim(hard_notice=None, first_notice=adv), NOTICE, 300) == T + 450
    # advised but not yet gone: the hard notice never came, and that fails its checks
    still_there = (SeenTransition("advised", T + 1),)
    results = checks(victim(hard_notice=None, first_notice=adv, transitions=still_there), 300)
    assert results["delivery_latency"] is False and results["notice_lead"] is False


def test_the_deadline_without_a_notice_is_what_the_drill_asked_for():
    v = victim(hard_notice=None, first_notice=None)
    assert deadline(v, NOTICE, 30) == T + 30 + NOTICE
    assert deadline(victim(), NOTICE) == T + NOTICE
    # a hard notice without a deadline does not make one up: the drill's
    assert deadline(victim(hard_notice=hard(deadline=None)), NOTICE) == T + NOTICE


def test_replacement_time_is_the_first_other_node_active_after_the_reclaim():
    assert replacement_seconds(victim(activations=())) is None
    assert replacement_seconds(victim(activations=(("spot-gp-1", T + 5),))) is None
    assert replacement_seconds(victim(activations=(("b", T + 90), ("c", T + 30)))) == 30.0


def test_the_score_counts_refused_victims_as_failed_and_skips_those_not_reached():
    facts = DrillFacts(notice_seconds=NOTICE, victims=(
        victim(),
        VictimFacts(node="spot-gp-2", instance_id="i-2", reclaim_error="quota"),
        VictimFacts(node="spot-gp-3", instance_id="i-3"),
    ))
    got = score(facts)
    assert (got["checks"], got["passed"], got["score"]) == (6, 5, 83.3)
    assert got["victims"][1] == {"node": "spot-gp-2", "reclaim_error": "quota"}
    assert got["victims"][2] == {"node": "spot-gp-3", "skipped": "not reclaimed (drill stopped before its wave)"}


def test_no_counted_check_is_no_score_not_a_perfect_one():
    got = score(DrillFacts(notice_seconds=NOTICE, victims=(VictimFacts(node="n"),)))
    assert got == {"score": None, "checks": 0, "passed": 0, "victims": [
        {"node": "n", "skipped": "not reclaimed (drill stopped before its wave)"}]}
    assert score(DrillFacts(notice_seconds=NOTICE))["score"] is None


def test_stop_reason():
    assert stop_reason([hard()], {"pending": 20, "unplaced": 2}, 80) is None
    late = hard(id="ntc-9", first_seen_at=T + 40)
    assert stop_reason([late], None, 80) == "notice ntc-9 arrived with 110 s left (< 120 s)"
    assert stop_reason([advisory(first_seen_at=T + 440)], None, 80) is None  # advisories are not the 120 s notice
    assert stop_reason([], {"pending": 20, "unplaced": 10}, 80) == "demand served dropped to 50% (< 80%)"
    assert stop_reason([], {"pending": 9, "unplaced": 9}, 80) is None  # too little demand to judge
    assert stop_reason([], None, 80) is None


def test_a_victim_is_handled_when_refused_or_reclaimed_and_gone_or_past_its_grace():
    assert victim_handled(refused=True, reclaimed_at=None, live=True, now=T, notice_seconds=NOTICE)
    assert not victim_handled(refused=False, reclaimed_at=None, live=False, now=T, notice_seconds=NOTICE)
    assert victim_handled(refused=False, reclaimed_at=T, live=False, now=T + 1, notice_seconds=NOTICE)
    assert not victim_handled(refused=False, reclaimed_at=T, live=True, now=T + NOTICE, notice_seconds=NOTICE)
    assert victim_handled(refused=False, reclaimed_at=T, live=True, now=T + NOTICE + DONE_GRACE_SECONDS,
                          notice_seconds=NOTICE)


# -- issue 13: each check's value and threshold, replacements, when a pool's nodes will be ready ---------------

def test_each_check_row_names_its_value_threshold_and_result():
    row = score_victim(victim(), NOTICE)[0]
    by = {c["name"]: c for c in row["checks"]}
    assert list(by) == list(CHECKS) and all(c["result"] == "met" for c in by.values())
    assert (by["delivery_latency"]["observed"], by["delivery_latency"]["op"], by["delivery_latency"]["threshold"]) \
        == (0.1, "<=", 1.0)
    assert (by["notice_lead"]["observed"], by["notice_lead"]["threshold"]) == (150.0, 120)
    assert (by["drained_before_deadline"]["observed"], by["drained_before_deadline"]["threshold"]) == (1.0, 150.0)
    assert (by["jobs_lost"]["observed"], by["jobs_lost"]["note"]) == (0, "2 requeued, 0 lost")
    assert (by["capacity_returned"]["observed"], by["capacity_returned"]["gone_after_s"]) == (60.0, 65.0)
    # a missed one and an unchecked one say so, with what was (not) seen
    late = {c["name"]: c for c in score_victim(victim(drain=None), NOTICE)[0]["checks"]}
    assert late["drained_before_deadline"]["result"] == "missed" and late["drained_before_deadline"]["observed"] is None
    assert late["jobs_lost"]["result"] == "unchecked" and "no drain round" in late["jobs_lost"]["note"]
    taken = {c["name"]: c for c in score_victim(victim(transitions=returned(
        gone_reason="reclaimed after notice ntc-1")), NOTICE)[0]["checks"]}
    assert taken["capacity_returned"]["result"] == "missed" and "provider" in taken["capacity_returned"]["note"]


def test_the_replacement_is_the_launch_whose_reason_names_the_victim():
    assert replaced_nodes("replacement capacity for spot-a, spot-b: 1 × gp-az1 (8 vCPU/32 GiB) at 0.2525 EUR") \
        == ("spot-a", "spot-b")
    assert replaced_nodes("9 pending units: 5 × gp-az1 (8 vCPU/32 GiB)") == ()
    rep = ReplacementLaunch("spot-r", "gp2", launched_at=T + 2, active_at=T + 92, state="active", boot_seconds=90)
    v = victim(replacements=(rep,), activations=(("other", T + 30),))
    assert replacement_seconds(v) == 92.0  # its own replacement, not another launch that came up first
    row = score_victim(v, NOTICE)[0]
    assert row["time_to_replacement_s"] == 92.0 and row["replacements"][0]["active_after_s"] == 92.0
    booting = ReplacementLaunch("spot-r", "gp2", launched_at=T, boot_seconds=90, state="building")
    assert replacement_seconds(victim(replacements=(booting,))) is None  # launched, not active yet
    assert not replacement_settled(booting, T + 90 + DONE_GRACE_SECONDS - 1)
    assert replacement_settled(booting, T + 90 + DONE_GRACE_SECONDS)  # a slow boot does not hold a drill forever
    assert replacement_settled(rep, T) and replacement_settled(ReplacementLaunch("x", "p", T, state="failed"), T)


def test_when_enough_of_a_pools_booting_nodes_are_expected_active():
    assert shortfall_ready_at(2, [T + 90, T + 30, T + 60]) == T + 60  # the 2nd to come up
    assert shortfall_ready_at(4, [T + 90, T + 30, T + 60]) is None  # too few booting
    assert shortfall_ready_at(1, []) is None
