"""The rows ``spotctl.state.bulk`` builds for many writes at once are byte for byte the rows the one-at-a-time
writers make: an event's payload is the SDK's structured CloudEvent in canonical JSON, an audit record's
hash and queued copy are those ``AuditLog.audit`` writes."""

from __future__ import annotations

import json

import pytest

from spotctl.core.audit import GENESIS, audit_hash, canonical
from spotctl.core.models import Node, NodeState
from spotctl.state.bulk import AuditRows, EventRows
from spotctl.state.outbox import cloud_event, structured
from spotctl.state.store import Store


def _node(i: int) -> Node:
    return Node(id=f"spot-gp-{i}", pool="gp", state=NodeState.INTENDED, action_id=f"a-{i}.0", created_at=10.0 + i,
                updated_at=10.0 + i, instance_id=f"i-é-{i}", host="hv\"1")


@pytest.mark.parametrize("at", [1767261600.0, 1767261600.25, 1767261601.123456])
def test_event_rows_are_the_sdk_documents(at):
    rows = EventRows("r1")
    for i in range(3):  # the first from the SDK, the others from its template
        node = _node(i)
        kind, key, payload, created = rows.transition(node, NodeState.INTENDED, NodeState.ACTIVE, "adopted", at)
        doc = json.loads(payload)
        data = {"node": node.id, "pool": "gp", "from": "intended", "to": "active", "reason": "adopted",
                "instance_id": node.instance_id, "action_id": node.action_id}
        sdk = structured(cloud_event(source="spotctl/r1", type_="io.spotctl.node.active", subject=node.id, data=data,
                                     at=at))
        assert (kind, key, created) == ("event", node.id, at)
        assert payload == canonical({**sdk, "id": doc["id"]})
    with pytest.raises(ValueError, match="subject"):
        rows.event("io.spotctl.node.active", "", {}, at)


@pytest.mark.parametrize("inputs", [{"instance_id": "i-1", "pool": "gp"}, {"n": 1, "x": 0.5, "ok": True, "none": None},
                                    {"nested": {"b": [1, 2], "a": "é"}}, {10: "int keys", 9: "become strings"}, {}])
def test_audit_rows_chain_as_the_ledger_does(inputs):
    chain = AuditRows("r1", GENESIS)
    prev = GENESIS
    for i in range(3):
        row, (kind, key, payload, at) = chain.record(actor="me", action="node.adopt", target=f"n{i}", result="ok",
                                                     inputs=inputs, at=100.5 + i)
        rec = {"id": row[0], "at": 100.5 + i, "actor": "me", "action": "node.adopt", "target": f"n{i}",
               "result": "ok", "inputs": json.loads(canonical(inputs))}
        h = audit_hash(rec, prev)
        assert row == (rec["id"], 100.5 + i, "me", "node.adopt", f"n{i}", "ok", canonical(rec["inputs"]), prev, h)
        assert (kind, key, at) == ("audit", rec["id"], 100.5 + i)
        assert payload == canonical({**rec, "prev_hash": prev, "hash": h, "region": "r1"})
        prev = h
    assert chain.head == prev


def test_adopted_rows_continue_the_chain_and_verify(tmp_path):
    store = Store.open(tmp_path / "s.db", "r1")
    with store.tx():
        store.audit(actor="me", action="before", target="x", result="ok", inputs={}, at=1.0)
    nodes = [(_node(i), NodeState.ACTIVE if i % 2 else NodeState.BUILDING) for i in range(5)]
    with store.tx():
        store.adopt_nodes(nodes, at=50.0, actor="me")
    with store.tx():
        store.audit(actor="me", action="after", target="x", result="ok", inputs={}, at=60.0)
    ok, bad, checked = store.verify_audit()
    assert ok and checked == 7
    assert [n.state for n in store.nodes()] == [NodeState.BUILDING, NodeState.ACTIVE] * 2 + [NodeState.BUILDING]
    store.close()


def test_records_of_one_transaction_chain_and_a_rolled_back_one_is_forgotten(tmp_path):
    """The chain's head is read once per write transaction and kept as records are appended to it; a
    transaction rolled back takes its records with it, and the next record chains to the last committed one."""
    store = Store.open(tmp_path / "s.db", "r1")
    with store.tx():
        for i in range(3):
            store.audit(actor="me", action="one", target=f"x{i}", result="ok", inputs={"i": i}, at=1.0 + i)
        store.adopt_nodes([(_node(0), NodeState.ACTIVE)], at=5.0, actor="me")
        store.audit(actor="me", action="two", target="y", result="ok", inputs={}, at=6.0)
    with pytest.raises(RuntimeError):
        with store.tx():
            store.audit(actor="me", action="gone", target="z", result="ok", inputs={}, at=7.0)
            raise RuntimeError("rolled back")
    with store.tx():
        store.audit(actor="me", action="three", target="w", result="ok", inputs={}, at=8.0)
    ok, bad, checked = store.verify_audit()
    assert ok and bad is None and checked == 6
    assert [r["action"] for r in store.audit_records()] == ["one"] * 3 + ["node.adopt", "two", "three"]
    store.close()


class _Key(str):
    pass


@pytest.mark.parametrize("inputs", [
    {"nested": {"deep": [{"x": 1.5, "y": [None, True, "é\u2028\"\\"]}], "t": (1, 2)}},   # a tuple
    {"n": {10: "a", 9: "b"}}, {"nan": [float("nan"), float("inf")]}, {"k": {_Key("s"): 1}},
    {"when": __import__("datetime").date(2026, 1, 2), "p": __import__("pathlib").Path("/x")},  # default=str
    {"big": 2 ** 70, "neg": -0.0, "tiny": 5e-324, "list": [[], {}, [[]]]}])
def test_audit_rows_write_what_the_old_writer_wrote(inputs):
    """Each record is written with one encoding of its inputs, put together with the rest: the bytes (and
    the hash) of the writer that encoded the whole record, whatever the inputs hold."""
    chain = AuditRows("r-é", GENESIS)
    rec, row, (_, _, payload, _) = chain.make(actor="ü", action="node.drain", target="n\"1", result="ok",
                                              inputs=inputs, at=1767261600.125)
    ref = {"id": row[0], "at": 1767261600.125, "actor": "ü", "action": "node.drain", "target": "n\"1",
           "result": "ok", "inputs": json.loads(canonical(inputs))}
    h = audit_hash(ref, GENESIS)
    assert row == (ref["id"], ref["at"], "ü", "node.drain", "n\"1", "ok", canonical(ref["inputs"]), GENESIS, h)
    assert payload == canonical({**ref, "prev_hash": GENESIS, "hash": h, "region": "r-é"})
    assert rec == {**ref, "prev_hash": GENESIS, "hash": h, "region": "r-é"}


@pytest.mark.parametrize("base", [{"segments": [[225, 1767348000.0, 3600]], "x": (1, "é"), "reason": "r"},
                                  {"deep": {"z": None, "a": [True, 0.1]}}, {}])
def test_shared_inputs_are_written_as_each_record_alone(base):
    from spotctl.state.bulk import SharedInputs

    shared = SharedInputs(base)
    for sub in ("a-1.0", "a-1.10", "é\"2"):
        one = shared.with_own(sub_action=sub, reason="overrides")
        full = json.loads(canonical({**base, "sub_action": sub, "reason": "overrides"}))
        assert isinstance(one, SharedInputs) and one.value == full and one.text == canonical(full)
        row, _ = AuditRows("r1", GENESIS).record(actor="a", action="node.launch", target="n", result="intended",
                                                 inputs=one, at=1.0)
        assert row[6] == canonical(full)


def test_shared_inputs_with_keys_json_turns_into_strings_are_not_shared():
    from spotctl.state.bulk import SharedInputs

    assert SharedInputs({10: "a", 9: "b"}).with_own(sub_action="s") == {"10": "a", "9": "b", "sub_action": "s"}
