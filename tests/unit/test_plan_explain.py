"""What the planner's explanations say: they name only units that were in fact left unplaced, say why a
node is advised, where the calendar takes capacity back, and write values the way the tables do."""

from __future__ import annotations

from dataclasses import replace

from spotctl.core.models import NodeState, Notice, NoticeKind, Shape
from spotctl.core.plan_demand import unplaced_examples
from spotctl.core.plan_input import DemandClass
from spotctl.core.planner import plan
from spotctl.core.textfmt import duration_text, shape_text

from ..factories import NOW, hosts, job, node, plan_input, pool, reservation


def unplaced_lines(p):
    return [e for e in p.explain if " unplaced" in e]


def test_unplaced_examples_are_the_units_left_over_not_the_placed_ones():
    # 5 identical 8-vCPU jobs, room for 2 nodes of 8 vCPU: 2 placed, 3 left
    p = plan(plan_input([pool(max_nodes=2)], hosts("p1", 4), [job(i, vcpu=8) for i in range(1, 6)]))
    assert sum(a.units for a in p.actions) == 2
    (line,) = unplaced_lines(p)
    assert "×3 unplaced (2 of the 5 placed)" in line
    # the schedulers start units of a class in id order: slurm/1 and slurm/2 are the placed ones
    assert "slurm/3, slurm/4, slurm/5" in line and "slurm/1" not in line and "slurm/2" not in line


def test_a_class_whose_kept_examples_were_all_placed_names_no_example():
    d = DemandClass(key="k", scheduler="slurm", shape=Shape(1, 1024), priority=0, expected_seconds=60, count=30,
                    pools=("p1",), examples=tuple(f"slurm/{i:02d}" for i in range(20)))
    assert unplaced_examples(d, 10) == ()  # the 20 kept ids are among the 20 placed
    assert unplaced_examples(d, 12) == ("slurm/18", "slurm/19")
    assert unplaced_examples(d, 30) == d.examples


def test_a_replacement_launch_names_only_the_nodes_it_replaces():
    from spotctl.core.models import NodeUsage, Scheduler

    nodes = [node(1), node(2)]
    # each node's work fills one p2 node, and p2 may hold one: n1's work moves there, n2's cannot
    usage = [NodeUsage(node=f"n{i}", scheduler=Scheduler.SLURM, used=Shape(4, 16384), running=1, last_busy_at=NOW)
             for i in (1, 2)]
    notices = [Notice(id=f"hn{i}", instance_id=f"i{i}", kind=NoticeKind.HARD, issued_at=NOW - 10,
                      deadline=NOW + 150, reason="reclaim") for i in (1, 2)]
    p = plan(plan_input([pool("p1"), pool("p2", vcpu=4, ram=16384, max_nodes=1)], hosts("p1", 2) + hosts("p2", 2),
                        [], nodes=nodes, usage=usage, notices=notices))
    (launch,) = [a for a in p.actions if a.kind == "launch"]
    assert (launch.pool, launch.count) == ("p2", 1)
    assert "replacement capacity for n1:" in launch.reason and "n2" not in launch.reason


def test_values_are_written_as_the_tables_write_them():
    assert shape_text(Shape(8, 32768)) == "8 vCPU/32 GiB"
    assert shape_text(Shape(32, 262144, 4)) == "32 vCPU/256 GiB/4 GPU"
    assert shape_text(Shape(1, 512)) == "1 vCPU/512 MiB"
    assert [duration_text(s) for s in (45, 720, 23400, 200_000)] == ["45s", "12m", "6h30m", "2d07h"]
    p = plan(plan_input([pool()], hosts("p1", 2), [job(1)], prices={"p1": 0.18666}))
    (launch,) = p.actions
    assert "(8 vCPU/32 GiB) at 0.1867 EUR/node-hour" in launch.reason
    assert not any("c/" in e and "M/" in e for e in p.explain)  # no 8c/32768M/0g


def test_a_launch_into_a_pool_the_calendar_shrinks_says_so():
    res = [reservation("p1", ["p1-h0"], NOW + 17 * 3600, NOW + 20 * 3600)]
    p = plan(plan_input([pool()], hosts("p1", 2), [job(i) for i in range(3)], reservations=res))
    assert [a.kind for a in p.actions] == ["launch"]
    (note,) = [e for e in p.explain if "the calendar lowers" in e]
    assert "from 16 to 8 nodes at" in note and "(in 17h00m)" in note and "a node that lands on one of those is advised" in note
    drop = next(x for x in p.pools if x["name"] == "p1")["calendar_next_drop"]
    assert (drop["capacity_before"], drop["capacity"], drop["at"]) == (16, 8, NOW + 17 * 3600)


def test_why_a_node_is_advised_is_explained_with_its_host_and_deadline():
    deadline = NOW + 50 * 60  # within the hour before it (calendar_advisory_seconds): advised
    cal = Notice(id="ntc-1", instance_id="i1", kind=NoticeKind.CALENDAR, issued_at=NOW - 60, deadline=deadline,
                 reason="reservation r1 takes host p1-h0")
    n1 = replace(node(1), host="p1-h0")
    n2 = replace(node(2), host="p1-h0", state=NodeState.ADVISED, cordoned=True)
    p = plan(plan_input([pool()], hosts("p1", 2), [], nodes=[n1, n2],
                        notices=[cal, replace(cal, id="ntc-2", instance_id="i2")]))
    assert [(a.kind, a.node) for a in p.actions] == [("cordon", "n1")]
    (line,) = [e for e in p.explain if " on host " in e]
    assert line.startswith("p1: 2 nodes on host p1-h0 advised (cordoned: no new work) for the provider's "
                           "calendar notices (reservation r1 takes host p1-h0)")
    assert "the host is taken back at 2027-01-15 08:50:00Z (in 50m)" in line
    assert "drained from 2027-01-15 08:38:00Z" in line  # drain_seconds + advisory_drain_margin_seconds before


def test_the_calendar_advisory_of_our_own_calendar_is_explained_too():
    n = replace(node(1), host="p1-h0", idle_since=NOW)  # busy until now: not scaled down
    inp = replace(plan_input([pool()], hosts("p1", 2), [], nodes=[n]), host_reclaims={"p1-h0": NOW + 1800})
    p = plan(inp)
    assert ("cordon", "n1") in [(a.kind, a.node) for a in p.actions]
    (line,) = [e for e in p.explain if " on host " in e]
    assert line.startswith("p1: 1 node on host p1-h0 advised (cordoned: no new work) for the calendar advisory "
                           "(a reservation takes the host; announced 60m ahead)")
