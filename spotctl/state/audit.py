"""The audit ledger: chained records appended in the caller's transaction (each also queued in the
outbox for the audit service), and the queries over them.

The chain itself — what is hashed, how, and the one walk that checks it — is
:mod:`spotctl.core.audit`; this module only stores and reads it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from spotctl.core.audit import GENESIS, audit_hash, canonical, walk
from spotctl.core.errors import NotFoundError
from spotctl.state.dbfile import loads
from spotctl.state.outbox import Outbox


class AuditLog(Outbox):
    """The audit methods of :class:`spotctl.state.store.Store`."""

    def audit(self, *, actor: str, action: str, target: str, result: str, inputs: dict, at: float) -> dict:
        """Append a chained audit record and queue it in the outbox (same transaction)."""
        with self.tx() as c:
            prev = c.execute("SELECT hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            prev_hash = prev[0] if prev else GENESIS
            rec: dict[str, Any] = {"id": str(uuid.uuid4()), "at": at, "actor": actor, "action": action,
                                   "target": target, "result": result, "inputs": inputs}
            rec["inputs"] = json.loads(canonical(inputs))
            h = audit_hash(rec, prev_hash)
            c.execute("INSERT INTO audit (id, at, actor, action, target, result, inputs, prev_hash, hash) "
                      "VALUES (?,?,?,?,?,?,?,?,?)",
                      (rec["id"], at, actor, action, target, result, canonical(rec["inputs"]), prev_hash, h))
            rec.update(prev_hash=prev_hash, hash=h, region=self.region)
            self.outbox("audit", rec["id"], rec, at)
        return rec

    def audit_records(self, limit: int | None = None) -> list[dict]:
        sql = "SELECT * FROM audit ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else "")
        return [{**dict(r), "inputs": loads(self.path, "audit", r["id"], "inputs", r["inputs"])}
                for r in self.conn.execute(sql)]

    def verify_audit(self) -> tuple[bool, dict | None, int]:
        """Walk the chain (:func:`spotctl.core.audit.walk`); return (ok, first bad record, records checked)."""
        w = walk(self.audit_records())
        return w.ok, (dict(w.first_bad) if w.first_bad is not None else None), w.checked

    def audit_delivered(self) -> dict[str, float | None]:
        """Audit record id -> when its outbox row was delivered (None: still queued)."""
        return {r[0]: r[1] for r in self.conn.execute("SELECT key, delivered_at FROM outbox WHERE kind='audit'")}

    def audit_query(self, *, since: float | None = None, actor: str | None = None, action: str | None = None,
                    target: str | None = None, limit: int | None = None) -> list[dict]:
        """Audit records matching every given filter, oldest first (``action`` may end with ``*``)."""
        sql = "SELECT * FROM audit WHERE 1=1"
        args: list[object] = []
        if since is not None:
            sql, args = sql + " AND at >= ?", args + [since]
        if actor:
            sql, args = sql + " AND actor = ?", args + [actor]
        if action:
            if action.endswith("*"):
                sql, args = sql + " AND action LIKE ? ESCAPE '\\'", args + [
                    action[:-1].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"]
            else:
                sql, args = sql + " AND action = ?", args + [action]
        if target:
            sql, args = sql + " AND target = ?", args + [target]
        sql += " ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else "")
        return [{**dict(r), "inputs": loads(self.path, "audit", r["id"], "inputs", r["inputs"])}
                for r in self.conn.execute(sql, args)]

    def audit_record(self, record_id: str) -> dict:
        """One audit record by id (a unique prefix of at least 8 characters also works)."""
        rows = self.conn.execute("SELECT * FROM audit WHERE id = ?", (record_id,)).fetchall()
        if not rows and len(record_id) >= 8:
            rows = self.conn.execute("SELECT * FROM audit WHERE id LIKE ? LIMIT 2",
                                     (record_id.replace("%", "").replace("_", "") + "%",)).fetchall()
        if len(rows) != 1:
            raise NotFoundError(f"no audit record {record_id!r} in region {self.region!r}" if not rows else
                                f"audit record id prefix {record_id!r} is ambiguous",
                                hint="`spotctl audit list` shows record ids")
        return {**dict(rows[0]), "inputs": loads(self.path, "audit", rows[0]["id"], "inputs", rows[0]["inputs"])}

