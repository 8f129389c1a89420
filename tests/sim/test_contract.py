"""The provider feed: rate card every 5 minutes, notices, the reclaim API."""

from __future__ import annotations

from spotctl.core.models import NoticeKind
from spotctl.sim import Knobs, SimWorld

from .conftest import START, NaiveOperator


def test_rate_card_changes_every_five_minutes(world, region):
    card = world.contract.rate_card()
    assert card.version == f"rc-{int(START // 300)}"
    assert card.valid_from <= world.now < card.valid_until == card.valid_from + 300
    assert card.currency == "EUR"
    assert set(card.prices) == set(region.pools)
    world.advance(card.valid_until - 1)
    assert world.contract.rate_card() == card
    versions = {card.version}
    for _ in range(6):
        world.advance(world.now + 300)
        versions.add(world.contract.rate_card().version)
    assert len(versions) == 7


def test_a_pinned_price_is_what_the_rate_card_of_its_slot_quotes(world):
    import math

    import pytest

    from spotctl.core.errors import NotFoundError

    slot = int(world.now // 300)
    before = world.contract.rate_card()
    world.provider.pin_price("gp-az1", slot, 0.1234)  # the card in force is made again with it
    world.provider.pin_price("gp-az2", slot + 1, 9.0)
    now = world.contract.rate_card()
    assert now.prices["gp-az1"] == 0.1234 and now.prices["gp-az2"] == before.prices["gp-az2"]
    world.advance(world.now + 300)
    assert world.contract.rate_card().prices["gp-az2"] == 9.0
    for bad in (-1.0, math.nan, math.inf, True):
        with pytest.raises(ValueError):
            world.provider.pin_price("gp-az1", slot, bad)
    with pytest.raises(NotFoundError):
        world.provider.pin_price("nope", slot, 1.0)


def test_prices_by_kind_and_class_and_bounded_swing(world):
    seen: dict[str, list[float]] = {}
    for _ in range(24 * 12):  # a day of rate cards
        for pool, price in world.contract.rate_card().prices.items():
            seen.setdefault(pool, []).append(price)
        world.advance(world.now + 300)
    mean = {p: sum(v) / len(v) for p, v in seen.items()}
    assert mean["bm-gpu-az2"] > mean["bm-cpu-az1"] > mean["mem-az1"] > mean["gp-az1"]
    assert mean["gp-rsv-az2"] < mean["gp-az2"]  # reserved-idle is cheaper than headroom
    for pool, values in seen.items():
        lo, hi = min(values), max(values)
        assert lo >= mean[pool] * 0.75 and hi <= mean[pool] * 1.25
        assert hi > lo * 1.1  # it does move over the day


def test_a_card_is_a_copy(world):
    card = world.contract.rate_card()
    card.prices["gp-az1"] = -1
    assert world.contract.rate_card().prices["gp-az1"] > 0


def _reclaim(world, instance_id, lead):
    """The reclaim API (ReclaimPort) for one instance; the hard notice it issued."""
    rec = world.contract.reclaim([instance_id], lead)
    (receipt,) = rec.instances
    assert receipt.ok and receipt.notice_id, receipt
    return next(n for n in world.contract.notices() if n.id == receipt.notice_id)


def test_reclaim_api_gives_a_hard_notice_and_deletes_at_the_deadline(world, region):
    inst = world.cloud.create_instance(region.pools["gp-az1"], "n1", "a1")
    world.advance(world.now + 120)
    notice = _reclaim(world, inst.id, 150)
    assert notice.kind is NoticeKind.HARD and notice.deadline - notice.issued_at == 150
    assert world.contract.notices() == [notice]
    world.advance(notice.deadline - 1)
    assert world.cloud.find_instance("a1") is not None
    world.advance(notice.deadline)
    assert world.cloud.find_instance("a1") is None
    assert world.contract.notices() == []
    rep = world.report()
    assert rep["notices"]["hard"] == 1 and rep["notices"]["missed"] == 1
    assert rep["instances"]["reclaimed"] == 1


def test_a_drained_node_counts_as_handled(world, region):
    inst = world.cloud.create_instance(region.pools["gp-az1"], "n1", "a1")
    world.advance(world.now + 120)
    notice = _reclaim(world, inst.id, 200)
    for s in world.schedulers:
        s.drain("n1", "notice", notice.deadline)
    world.advance(notice.deadline + 1)
    rep = world.report()
    assert rep["notices"]["handled_before_deadline"] == 1 and rep["notices"]["missed"] == 0
    # drained in one scheduler only is not enough
    inst2 = world.cloud.create_instance(region.pools["gp-az1"], "n2", "a2")
    world.advance(world.now + 120)
    notice2 = _reclaim(world, inst2.id, 200)
    world.schedulers[0].drain("n2", "notice", notice2.deadline)
    world.advance(notice2.deadline + 1)
    assert world.report()["notices"]["missed"] == 1


def test_random_surges_advise_and_sometimes_reclaim(region):
    w = SimWorld.new(region, START, knobs=Knobs(surges_per_day=150))
    op = NaiveOperator(w)
    hard, advisories, cleared = [], {}, 0
    end = w.now + 6 * 3600
    while w.now < end:
        w.advance(w.now + 30)
        current = {n.id: n for n in w.contract.notices()}
        alive = {i.id for i in w.cloud.instances()}
        for nid, n in advisories.items():
            if nid not in current and n.instance_id in alive:
                cleared += 1  # cleared while its instance still runs: it expired
        advisories = {nid: n for nid, n in current.items() if n.kind is NoticeKind.ADVISORY}
        for n in current.values():
            if n.kind is NoticeKind.HARD and n not in hard:
                hard.append(n)
        if int(w.now) % 300 == 0:
            op.step()
    surge_hard = [n for n in hard if "surge" in n.reason]
    assert surge_hard, "no surge ended in a hard notice"
    for n in hard:
        assert n.deadline - n.issued_at >= 120
    assert cleared > 0  # advisories expire
    assert w.report()["notices"]["advisory"] > len(surge_hard)


def test_reclaim_with_an_advisory_lead_advises_first_then_notices(world, region):
    inst = world.cloud.create_instance(region.pools["gp-az1"], "n1", "a1")
    world.advance(world.now + 120)
    t0 = world.now
    rec = world.contract.reclaim([inst.id, "no-such-instance"], 150, advisory_lead_seconds=600, drill_id="d1")
    mine, unknown = rec.instances
    assert mine.advisory_id and mine.notice_id is None and unknown.error and not unknown.ok
    (adv,) = world.contract.notices()
    assert adv.id == mine.advisory_id and adv.kind is NoticeKind.ADVISORY and adv.deadline == t0 + 750
    world.advance(t0 + 599)
    assert [n.kind for n in world.contract.notices()] == [NoticeKind.ADVISORY]
    world.advance(t0 + 600)
    hard = [n for n in world.contract.notices() if n.kind is NoticeKind.HARD]
    assert len(hard) == 1 and hard[0].issued_at == t0 + 600 and hard[0].deadline == t0 + 750
