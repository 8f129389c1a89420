"""ReclaimPort conformance: the same checks on the simulator and on the HTTP contract adapter.

Drills call the provider's reclaim API through one port with one signature; each implementation
must behave the same for what drills rely on: one receipt per instance asked for, a hard notice
with at least the lead asked for (visible in the feed's notices), an advisory first when an
advisory lead is asked, and an unknown instance answered with an error receipt, not an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import requests

from spotctl.core.models import NoticeKind
from spotctl.core.ports import ReclaimPort

START = 1_767_261_600.0


@dataclass
class Side:
    port: ReclaimPort
    victims: Callable[[int], list[str]]
    notices: Callable[[], list]


def _sim_side() -> Side:
    from spotctl.sim import SimWorld, demo_region

    region = demo_region()
    world = SimWorld.new(region, START, 5)
    pool = region.pools["gp-az1"]
    made = [world.cloud.create_instance(pool, f"spot-conf-{i}", f"conf-{i}").id for i in range(6)]
    world.advance(START + 300)
    left = list(made)

    def victims(n):
        out, left[:] = left[:n], left[n:]
        return out
    return Side(world.contract, victims, world.contract.notices)


def _http_side(tmp_path_factory) -> tuple[Side, object]:
    from spotctl.adapters.contract_http import ContractFeed
    from tests.integration.test_contract_api import TOKEN, Server

    srv = Server(tmp_path_factory.mktemp("conf-sim"), "--token", TOKEN, "--seed", "41", "--instances", "6",
                 "--max-wait", "5")
    feed = ContractFeed(srv.url, token=TOKEN, timeout=5)
    taken: set[str] = set()

    def victims(n):
        r = requests.get(srv.url + "/sim/v1/world", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        r.raise_for_status()
        live = [i["id"] for i in r.json()["instances"] if i["id"] not in taken][:n]
        taken.update(live)
        assert len(live) == n, "the served world ran out of instances"
        return live
    return Side(feed, victims, feed.notices), srv


@pytest.fixture(params=["sim", "http"], scope="module")
def side(request, tmp_path_factory):
    if request.param == "sim":
        yield _sim_side()
        return
    s, srv = _http_side(tmp_path_factory)
    yield s
    srv.stop()


def test_it_is_a_reclaim_port(side):
    assert isinstance(side.port, ReclaimPort)


def test_a_reclaim_gives_each_instance_a_hard_notice_with_the_lead_asked_for(side):
    victims = side.victims(2)
    rec = side.port.reclaim(victims, 150, drill_id="conf-1")
    assert rec.id and [r.instance_id for r in rec.instances] == victims
    notices = {n.id: n for n in side.notices()}
    for r in rec.instances:
        assert r.ok and r.notice_id and r.advisory_id is None and r.error is None
        n = notices[r.notice_id]
        assert n.kind is NoticeKind.HARD and n.instance_id == r.instance_id
        assert n.deadline - n.issued_at >= 150


def test_an_unknown_instance_gets_an_error_receipt_not_an_exception(side):
    (victim,) = side.victims(1)
    rec = side.port.reclaim([victim, "no-such-instance"], 150)
    ok, unknown = rec.instances
    assert ok.ok and ok.instance_id == victim
    assert unknown.instance_id == "no-such-instance" and not unknown.ok and unknown.error


def test_an_advisory_lead_advises_first(side):
    (victim,) = side.victims(1)
    rec = side.port.reclaim([victim], 150, advisory_lead_seconds=600)
    (r,) = rec.instances
    assert r.ok and r.advisory_id and r.notice_id is None
    mine = [n for n in side.notices() if n.instance_id == victim]
    assert [n.kind for n in mine] == [NoticeKind.ADVISORY] and mine[0].id == r.advisory_id
