"""`spotctl audit list|show|verify|export` on real state databases, through the CLI."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from spotctl.cli.main import app
from spotctl.core.audit import audit_hash
from spotctl.ops.audit import parse_since
from spotctl.services.audit_receiver import record_hash
from spotctl.state.store import Store


def cli(*args):
    r = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "state.db"
    s = Store.open(path, "demo")
    for i in range(6):
        with s.tx():
            s.audit(actor="alice@host" if i % 2 else "spot-reconciler@ctl", action="node.launch" if i < 4 else
                    "node.drain", target=f"spot-gp-{i % 3}", result="ok", inputs={"i": i, "budget_tokens": 3},
                    at=1767571200.0 + 3600 * i)
    s.close()
    return path


def records(path):
    s = Store.open(path, "demo")
    try:
        return s.audit_records()
    finally:
        s.close()


def test_list_filters(db):
    code, out, _ = cli("-o", "json", "audit", "list", "--state-db", str(db))
    assert code == 0
    assert json.loads(out)["data"]["count"] == 6
    code, out, _ = cli("-o", "json", "audit", "list", "--state-db", str(db), "--actor", "alice@host",
                       "--action", "node.launch")
    got = json.loads(out)["data"]["records"]
    assert [r["inputs"]["i"] for r in got] == [1, 3]
    code, out, _ = cli("-o", "json", "audit", "list", "--state-db", str(db), "--action", "node.*", "--node",
                       "spot-gp-1", "--since", "2026-01-05T02:00:00Z")
    assert [r["inputs"]["i"] for r in json.loads(out)["data"]["records"]] == [4]
    assert json.loads(out)["data"]["records"][0]["delivered_at"] is None  # no audit service: still queued


def test_since_accepts_durations_iso_and_epoch():
    assert parse_since("2h", 10000.0) == 10000.0 - 7200
    assert parse_since("2026-01-05T00:00:00", 0) == 1767571200.0
    assert parse_since("1767571200", 0) == 1767571200.0


def test_bad_since_is_a_usage_error(db):
    code, _, err = cli("audit", "list", "--state-db", str(db), "--since", "yesterday-ish")
    assert code == 2 and "--since" in err


def test_show_by_id_and_prefix(db):
    rec = records(db)[2]
    code, out, _ = cli("-o", "json", "audit", "show", rec["id"][:8], "--state-db", str(db))
    assert code == 0 and json.loads(out)["data"]["hash"] == rec["hash"]
    code, _, err = cli("audit", "show", "no-such-record", "--state-db", str(db))
    assert code == 5 and "no audit record" in err


def test_verify_passes_on_an_intact_chain(db):
    code, out, _ = cli("-o", "json", "audit", "verify", "--state-db", str(db))
    d = json.loads(out)["data"]
    assert code == 0 and d["ok"] and d["records"] == 6 and d["service"] is None


@pytest.mark.parametrize("how", ["content", "rehashed", "deleted"])
def test_a_tampered_row_fails_verify_naming_the_first_bad_record(db, how):
    recs = records(db)
    victim = recs[3]
    import sqlite3

    c = sqlite3.connect(db)
    if how == "content":  # change what happened: the record no longer matches its hash
        c.execute("UPDATE audit SET result='failed' WHERE id=?", (victim["id"],))
        expect = victim
    elif how == "rehashed":  # change it and recompute its hash: the next record's link breaks
        forged = dict(victim, result="failed")
        c.execute("UPDATE audit SET result='failed', hash=? WHERE id=?",
                  (audit_hash(forged, victim["prev_hash"]), victim["id"]))
        expect = recs[4]
    else:  # remove it: the next record's link breaks
        c.execute("DELETE FROM audit WHERE id=?", (victim["id"],))
        expect = recs[4]
    c.commit()
    c.close()
    code, out, err = cli("-o", "json", "audit", "verify", "--state-db", str(db))
    d = json.loads(out)
    assert code == 9 and d["exit_code"] == 9 and d["status"] == "failed"
    assert d["data"]["first_bad"]["id"] == expect["id"]
    assert f"audit chain broken at record {expect['id']}" in err


def test_export_jsonl_and_csv(db):
    code, out, _ = cli("audit", "export", "--format", "jsonl", "--state-db", str(db))
    lines = [json.loads(x) for x in out.splitlines()]
    assert code == 0 and len(lines) == 6 and lines[0]["prev_hash"] == "0" * 64
    # an exported record re-verifies on its own (the hash covers exactly these fields)
    assert all(audit_hash(r, r["prev_hash"]) == r["hash"] for r in lines)
    code, out, _ = cli("audit", "export", "-f", "csv", "--actor", "alice@host", "--state-db", str(db))
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 3 and json.loads(rows[0]["inputs"]) == {"budget_tokens": 3, "i": 1}


def test_receiver_and_store_hash_records_the_same_way(db):
    """The receiver checks a record with the store's one chain hash (spotctl.core.audit; its bytes are
    pinned in tests/unit/test_audit_chain.py, and docs/audit/openapi.yaml's example hashes below)."""
    import spotctl.core.audit as chain
    import spotctl.services.audit_receiver as receiver

    assert receiver.record_hash is chain.record_hash and receiver.canonical is chain.canonical
    for r in records(db):
        assert record_hash(r) == r["hash"]


def test_audit_verify_passes_after_a_simulated_day_of_the_demo_region(tmp_path):
    keep = tmp_path / "kept"
    code, out, _ = cli("-o", "json", "simulate", "--hours", "24", "--keep-state", str(keep))
    assert code == 0
    report = json.loads(out)["data"]
    db = report["state_db"]
    code, out, _ = cli("-o", "json", "audit", "verify", "--state-db", db)
    d = json.loads(out)["data"]
    assert code == 0 and d["ok"] and d["records"] == report["reconciler"]["audit"]["records"] > 50
    # the demo region configures no Kafka and no audit service: the ledger holds every record, and nothing
    # is queued for relays that do not exist (the outbox does not grow with the simulated history)
    s = Store.open(db, "demo")
    try:
        assert s.outbox_pending("audit")[0] == 0 and s.outbox_pending("event")[0] == 0
        assert s.counts()["outbox"] == 0 and report["reconciler"]["outbox_kinds"] == []
    finally:
        s.close()


def test_the_openapi_example_batch_is_accepted_by_the_reference_receiver(tmp_path):
    """docs/audit/openapi.yaml and the receiver agree: the example's hashes are real and it is stored."""
    from pathlib import Path

    import yaml

    from spotctl.services.audit_receiver import Ledger

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "audit" / "openapi.yaml").read_text())
    batch = doc["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]["examples"][
        "two-records"]["value"]
    ledger = Ledger(tmp_path / "r.db")
    try:
        assert [r["status"] for r in ledger.append(batch["records"])] == ["created", "created"]
        assert [r["status"] for r in ledger.append(batch["records"])] == ["duplicate", "duplicate"]
    finally:
        ledger.close()
