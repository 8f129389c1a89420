"""``spotctl.core.models.frozen``: frozen to the type checker, plain slots at run time (fast to make), compared
and hashed by value as a frozen dataclass is; and the pass's pause of the cyclic collector."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest

from spotctl.core.models import NodeUsage, Scheduler, Shape, frozen
from spotctl.core.plan_input import NodeView
from spotctl.ops.runtime import collector_paused


def test_records_compare_hash_order_and_replace_by_value():
    a, b = Shape(8, 32768, 0), Shape(8, 32768, 0)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert sorted([Shape(16, 1, 0), Shape(8, 2, 0)]) == [Shape(8, 2, 0), Shape(16, 1, 0)]  # order=True kept
    u = NodeUsage("n1", Scheduler.SLURM, a, 2)
    assert replace(u, running=3) == NodeUsage("n1", Scheduler.SLURM, a, 3) and u.running == 2
    assert not hasattr(u, "__dict__")  # slots: no per-object dict
    assert hash(u) == hash(NodeUsage("n1", Scheduler.SLURM, b, 2))


def test_the_type_checker_refuses_an_assignment_to_a_field():
    api = pytest.importorskip("mypy.api")
    program = ("from spotctl.core.models import Shape, frozen\n"
               "@frozen\nclass P:\n    x: int\n"
               "s = Shape(1, 2, 0)\ns.vcpu = 3\nP(1).x = 2\n")
    out, _, status = api.run(["--config-file=", "--no-incremental", "--follow-imports=silent", "-c", program])
    assert status == 1
    assert out.count("is read-only") == 2, out


def test_views_are_made_with_their_defaults():
    from spotctl.core.models import NodeState

    v = NodeView(id="n", pool="p", state=NodeState.ACTIVE, used=Shape(), running=0, cordoned=False,
                 idle_since=None, notice=None, price=0.1)
    assert v.known and v.host is None and not v.protect_closed


@frozen
class _Pair:
    a: int
    b: str = "x"


def test_a_record_of_our_own_takes_the_same_decorator():
    assert _Pair(1) == _Pair(1, "x") and _Pair(1) != _Pair(2) and hash(_Pair(1)) == hash(_Pair(1, "x"))


def test_the_collector_is_paused_inside_and_put_back_as_it_was_whatever_happens():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
