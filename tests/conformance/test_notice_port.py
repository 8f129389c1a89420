"""ContractPort and NoticeStream conformance: the same checks on the simulator's contract feed and on the
HTTP contract adapter against the reference contract API service (``spotctl sim serve``, a subprocess
on a free port, as tests/integration/test_contract_api.py runs it).

ContractPort, on both sides: the feed provides notices, ``rate_card()`` prices every pool with a card
valid now, ``notices()`` lists the notices in force (a hard notice with the lead asked for, by id).

NoticeStream (the watcher's fast path, ``ops.watch``), on the sides that have a notice log: ``poll(None)``
returns the log so far and a cursor; ``poll(cursor)`` returns only what was issued after it, none twice
and none missed across polls with notices issued in between; the cursor is an opaque string that
survives a round trip through the state database (``Store.set_value``/``get_value``), so a new adapter
polling with the stored cursor goes on where the last one stopped.

**The in-process simulator has no notice log, and is not applicable for NoticeStream** (said by
``test_the_in_process_simulator_offers_no_notice_log``, not skipped): its world moves only when a pass
opens it and advances it to the pass's time, so a long-poll on it could never see a notice arrive; and
its notices leave the world when they expire or are enforced, so there is no ordered log to page
through. The log with its cursors is what the provider's API adds over the world
(``spotctl.services.contract_api.ContractAPI``); for the demo region the fast path is ``spotctl sim
serve`` + this HTTP adapter, which is the "http" side here, the same simulated world behind it.
``ops.watch`` refuses a feed without a log with a ConfigError that names ``spotctl sim serve``.

Error translation, on the HTTP adapter against the real service: a wrong token is AuthError (exit 4),
an unknown path NotFoundError (exit 5), a service that was stopped UnavailableError (exit 8).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import pytest
import requests

from spotctl.core.errors import AuthError, ExitCode, NotFoundError, UnavailableError
from spotctl.core.models import Notice, NoticeKind
from spotctl.core.ports import ContractPort, NoticeStream, ReclaimPort

START = 1_767_261_600.0
CURSOR_KEY = "contract:notice-cursor"  # the key ops.watch keeps its cursor under


@dataclass
class Side:
    port: ContractPort
    reclaim: ReclaimPort  # to issue notices the test knows of
    victims: Callable[[int], list[str]]
    pools: Callable[[], set[str]]
    now: Callable[[], float]
    fresh: Callable[[], object]  # a new adapter instance on the same feed


def _sim_side() -> Side:
    from spotctl.sim import SimWorld, demo_region

    region = demo_region()
    world = SimWorld.new(region, START, 5)
    pool = region.pools["gp-az1"]
    left = [world.cloud.create_instance(pool, f"spot-conf-{i}", f"conf-{i}").id for i in range(8)]
    world.advance(START + 300)  # booted

    def victims(n):
        out, left[:] = left[:n], left[n:]
        assert len(out) == n, "the simulated world ran out of instances"
        return out

    return Side(world.contract, world.contract, victims, lambda: set(region.pools), lambda: world.now,
                lambda: world.contract)


@dataclass
class Served:
    srv: object
    url: str


def _http_side(served: Served) -> Side:
    from spotctl.adapters.contract_http import ContractFeed
    from tests.integration.test_contract_api import TOKEN

    taken: set[str] = set()

    def world() -> dict:
        r = requests.get(served.url + "/sim/v1/world", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        r.raise_for_status()
        return r.json()

    def victims(n):
        live = [i["id"] for i in world()["instances"] if i["id"] not in taken][:n]
        taken.update(live)
        assert len(live) == n, "the served world ran out of instances"
        return live

    def fresh():
        return ContractFeed(served.url, token=TOKEN, timeout=5)

    feed = fresh()
    return Side(feed, feed, victims, lambda: set(world()["pools"]), time.time, fresh)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.integration.test_contract_api import TOKEN, Server

    srv = Server(tmp_path_factory.mktemp("conf-notices"), "--token", TOKEN, "--seed", "43", "--instances", "16",
                 "--max-wait", "5")
    yield Served(srv, srv.url)
    code, _, err = srv.stop()
    assert code == 0, err


SIDES: dict[str, Callable[..., Side]] = {"sim": _sim_side, "http": _http_side}
#: The sides whose feed has a notice log (NoticeStream). Not the in-process simulator: see the module doc.
STREAM_SIDES = ["http"]


def _param(name: str):
    return pytest.param(name, marks=pytest.mark.integration) if name == "http" else name


@pytest.fixture(scope="module", params=[_param(n) for n in SIDES])
def side(request) -> Side:
    if request.param == "http":
        return _http_side(request.getfixturevalue("served"))
    return _sim_side()


@pytest.fixture(scope="module", params=[_param(n) for n in STREAM_SIDES])
def stream_side(request) -> Side:
    s = _http_side(request.getfixturevalue("served"))
    assert isinstance(s.port, NoticeStream), f"side {request.param} must offer the notice log"
    return s


def _drain(port, cursor: str | None = None) -> tuple[list[Notice], str]:
    """Every page from ``cursor`` on (the log is paged), and the cursor after the last."""
    seen: list[Notice] = []
    while True:
        page, nxt = port.poll(cursor, 0)
        assert isinstance(nxt, str) and nxt
        seen.extend(page)
        if not page:
            return seen, nxt
        cursor = nxt


def _issue(side: Side, n: int) -> list[str]:
    """Hard notices for ``n`` fresh victims, through the reclaim API; their notice ids."""
    rec = side.reclaim.reclaim(side.victims(n), 150, drill_id="conf-notices")
    ids = [r.notice_id for r in rec.instances]
    assert all(ids) and len(ids) == n, rec
    return [i for i in ids if i]


# --- ContractPort, on every side ------------------------------------------------------------------------


def test_it_is_a_contract_port_that_provides_notices(side):
    assert isinstance(side.port, ContractPort) and side.port.provides_notices is True


def test_the_rate_card_prices_every_pool_and_is_valid_now(side):
    card = side.port.rate_card()
    assert isinstance(card.version, str) and card.version and isinstance(card.currency, str) and card.currency
    assert set(card.prices) == side.pools()
    assert all(isinstance(p, float) and math.isfinite(p) and p >= 0 for p in card.prices.values()), card.prices
    assert card.valid_from <= side.now() < card.valid_until
    again = side.port.rate_card()
    if again.version == card.version:  # not across a refresh boundary
        assert again == card


def test_notices_lists_the_notices_in_force(side):
    ids = _issue(side, 2)
    in_force = side.port.notices()
    by_id = {n.id: n for n in in_force}
    assert len(by_id) == len(in_force), "a notice listed twice"
    for nid in ids:
        n = by_id[nid]
        assert n.kind is NoticeKind.HARD and n.deadline is not None and n.deadline - n.issued_at >= 150
    for n in in_force:  # what the planner reads: a hard notice always carries its deadline
        assert n.kind in NoticeKind and n.instance_id and (n.kind is not NoticeKind.HARD or n.deadline)


def test_the_in_process_simulator_offers_no_notice_log():
    """Not applicable, said: when the simulator gains a notice log, add it to STREAM_SIDES."""
    sim = _sim_side()
    assert not isinstance(sim.port, NoticeStream)
    assert "sim" not in STREAM_SIDES


# --- NoticeStream, on the sides with a notice log -----------------------------------------------------------


def test_it_is_a_notice_stream(stream_side):
    assert isinstance(stream_side.port, NoticeStream)


def test_poll_from_no_cursor_returns_the_log_so_far_and_a_cursor(stream_side):
    port = stream_side.port
    ids = _issue(stream_side, 2)
    log, cursor = _drain(port)
    logged = [n.id for n in log]
    assert len(logged) == len(set(logged)), "a notice twice in the log"
    assert set(ids) <= set(logged)
    assert {n.id for n in port.notices()} <= set(logged)  # everything in force has been logged
    assert port.poll(cursor, 0) == ([], cursor)  # the end of the log: nothing more, the same cursor


def test_poll_after_a_cursor_returns_only_later_notices_none_twice_none_missed(stream_side):
    port = stream_side.port
    before, c0 = _drain(port)
    first_ids = _issue(stream_side, 2)
    first, c1 = _drain(port, c0)
    second_ids = _issue(stream_side, 1)
    second, c2 = _drain(port, c1)
    assert port.poll(c2, 0) == ([], c2)

    a, b = [n.id for n in first], [n.id for n in second]
    assert set(first_ids) <= set(a) and set(second_ids) <= set(b)
    assert not set(a) & set(b) and not (set(a) | set(b)) & {n.id for n in before}  # none twice
    everything, end = _drain(port)  # the log from the start: the polls saw every entry of it, in order
    assert [n.id for n in everything] == [n.id for n in before] + a + b and end == c2  # none missed


def test_a_cursor_kept_in_the_store_resumes_in_a_new_adapter(stream_side, tmp_path):
    from spotctl.state.store import Store

    before, cursor = _drain(stream_side.port)
    with Store.open(tmp_path / "state.db", "conf") as store:
        store.set_value(CURSOR_KEY, cursor, time.time())
    ids = _issue(stream_side, 2)  # issued while no adapter was polling

    with Store.open(tmp_path / "state.db", "conf") as store:
        kept = store.get_value(CURSOR_KEY)
    assert kept == cursor and isinstance(kept, str)
    port = stream_side.fresh()  # a new process's adapter: nothing in memory but the stored cursor
    assert isinstance(port, NoticeStream)
    got, nxt = _drain(port, kept)
    assert set(ids) <= {n.id for n in got} and not {n.id for n in got} & {n.id for n in before}
    everything, _ = _drain(port)
    assert [n.id for n in everything] == [n.id for n in before + got]  # exactly what came after it
    assert port.poll(nxt, 0) == ([], nxt)


# --- error translation on the HTTP adapter, against the real service ----------------------------------------


def _calls(feed) -> dict[str, Callable[[], object]]:
    return {"rate_card": feed.rate_card, "notices": feed.notices, "poll": lambda: feed.poll(None, 0)}


@pytest.mark.integration
def test_a_wrong_token_is_an_auth_error(served):
    from spotctl.adapters.contract_http import ContractFeed

    for token in ("wrong-token", None):
        for what, call in _calls(ContractFeed(served.url, token=token, timeout=5)).items():
            with pytest.raises(AuthError, match="401") as e:
                call()
            assert e.value.exit_code == ExitCode.AUTH == 4, what


@pytest.mark.integration
def test_an_unknown_path_is_not_found(served):
    from spotctl.adapters.contract_http import ContractFeed
    from tests.integration.test_contract_api import TOKEN

    feed = ContractFeed(served.url + "/no-such-prefix", token=TOKEN, timeout=5)  # a wrong base URL
    for what, call in _calls(feed).items():
        with pytest.raises(NotFoundError, match="404") as e:
            call()
        assert e.value.exit_code == ExitCode.NOT_FOUND == 5, what


@pytest.mark.integration
def test_a_stopped_service_is_unavailable(tmp_path):
    from spotctl.adapters.contract_http import ContractFeed
    from tests.integration.test_contract_api import TOKEN, Server

    srv = Server(tmp_path, "--token", TOKEN, "--instances", "1")
    feed = ContractFeed(srv.url, token=TOKEN, timeout=2)
    feed.rate_card()  # up, with a kept-alive connection
    _, cursor = feed.poll(None, 0)
    code, _, err = srv.stop()
    assert code == 0, err
    for what, call in dict(_calls(feed), poll=lambda: feed.poll(cursor, 0)).items():
        t0 = time.monotonic()
        with pytest.raises(UnavailableError, match="refused") as e:
            call()
        assert e.value.exit_code == ExitCode.UNAVAILABLE == 8, what
        assert time.monotonic() - t0 < 3, f"{what}: the adapter waited on a stopped service"
