"""The audit chain (spotctl.core.audit): the hash of a record is pinned, and the one walk finds each break.

The pinned values were computed by the chain code as it was before it moved to core (store and
receiver each had a copy). If one of these tests fails, the hash changed: every existing state
database and the audit service's copy would stop verifying. Do not update the pins; undo the change.
"""

from __future__ import annotations

import pytest

from spotctl.core.audit import ALTERED, BROKEN_LINK, GENESIS, audit_hash, canonical, record_hash, walk

FIRST = {"id": "00000000-0000-4000-8000-000000000001", "at": 1767000000.25, "actor": "svc:reconciler",
         "action": "node.drain", "target": "spot-gp-az1-0a1b2c3d", "result": "ok",
         "inputs": {"reason": "hard notice n-1 (reclaim)", "running": 2, "z": {"b": [1, 2.5, None, True], "a": "é ✓"}}}
SECOND = {"id": "00000000-0000-4000-8000-000000000002", "at": 1767000060.0, "actor": "alice@example.org",
          "action": "contract.degraded", "target": "gp-az1", "result": "degraded:notice", "inputs": {}}
FIRST_HASH = "d6882ad86c10ce08bc243efc03177359c8522767b01eb8088632409b9ed82f0e"
SECOND_HASH = "23ab5a263258526925cc357ba8282a93315b7330545200b7b25716bd3b460564"


def chain() -> list[dict]:
    return [dict(FIRST, prev_hash=GENESIS, hash=FIRST_HASH), dict(SECOND, prev_hash=FIRST_HASH, hash=SECOND_HASH)]


def test_the_hash_of_a_fixed_record_is_pinned():
    assert GENESIS == "0" * 64
    assert audit_hash(FIRST, GENESIS) == FIRST_HASH
    assert audit_hash(SECOND, FIRST_HASH) == SECOND_HASH
    # the receiver's form (from the record's own prev_hash) is the same hash
    assert [record_hash(r) for r in chain()] == [FIRST_HASH, SECOND_HASH]


def test_canonical_json_bytes_are_pinned():
    """Sorted keys, no spaces, UTF-8 kept, Python's float repr: what the hash is taken over."""
    assert canonical({"b": [1, 2.5, None, True], "a": "é ✓"}) == '{"a":"é ✓","b":[1,2.5,null,true]}'
    assert canonical({"at": 1767000060.0}) == '{"at":1767000060.0}'


def test_only_the_hashed_fields_count():
    extra = dict(FIRST, seq=7, region="demo", prev_hash="ignored", hash="ignored", delivered_at=1.0)
    assert audit_hash(extra, GENESIS) == FIRST_HASH
    with pytest.raises(KeyError):
        audit_hash({k: v for k, v in FIRST.items() if k != "inputs"}, GENESIS)


def test_a_walk_over_an_intact_chain_is_ok():
    w = walk(chain())
    assert (w.ok, w.checked, w.first_bad, w.reason) == (True, 2, None, None)
    assert w.last is not None and w.last["id"] == SECOND["id"] and w.head == SECOND_HASH
    empty = walk([])
    assert empty.ok and empty.checked == 0 and empty.head == GENESIS


def test_a_walk_names_the_first_record_whose_content_was_altered():
    recs = chain()
    recs[1]["result"] = "met"
    w = walk(recs)
    assert not w.ok and w.checked == 2 and w.first_bad["id"] == SECOND["id"] and w.reason == ALTERED
    assert w.last is not None and w.last["id"] == FIRST["id"] and w.head == FIRST_HASH


def test_a_walk_names_the_record_after_one_rehashed_or_removed():
    rehashed = chain()
    rehashed[0]["result"] = "failed"
    rehashed[0]["hash"] = audit_hash(rehashed[0], GENESIS)  # self-consistent: the next link breaks
    w = walk(rehashed)
    assert not w.ok and w.first_bad["id"] == SECOND["id"] and w.reason == BROKEN_LINK and w.checked == 2
    removed = chain()[1:]  # the first record is gone: the second no longer starts at genesis
    w = walk(removed)
    assert not w.ok and w.first_bad["id"] == SECOND["id"] and w.reason == BROKEN_LINK and w.checked == 1


def test_the_store_writes_and_verifies_with_the_chain(tmp_path):
    from spotctl.ops.audit import verify
    from spotctl.state.store import Store

    s = Store.open(tmp_path / "state.db", "demo")
    try:
        for i in range(3):
            with s.tx():
                s.audit(actor="a", action="node.launch", target=f"n{i}", result="ok", inputs={"i": i}, at=1.0 + i)
        recs = s.audit_records()
        assert recs[0]["prev_hash"] == GENESIS and all(record_hash(r) == r["hash"] for r in recs)
        assert s.verify_audit() == (True, None, 3) and verify(s)["ok"]
        s.conn.execute("UPDATE audit SET target='elsewhere' WHERE seq=2")
        ok, bad, n = s.verify_audit()
        report = verify(s, full=True)  # the first verify left a checkpoint at seq 3: only --full walks seq 2
        assert (ok, bad["id"], n) == (False, recs[1]["id"], 2)
        assert report["first_bad"] == {"id": recs[1]["id"], "seq": 2, "action": "node.launch", "target": "elsewhere",
                                       "reason": ALTERED} and report["records"] == 2
    finally:
        s.close()
