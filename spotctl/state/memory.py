"""What the reconciler remembers between passes, beside its nodes: the token bucket, pool failure
memory, reclaims, the notices seen, small persistent values (feed cursors, ETags) and the plan
history with the input each plan was made from (what ``spotctl plan --history``/``--replay`` read).
"""

from __future__ import annotations

import json
import zlib

from spotctl.core.audit import canonical
from spotctl.core.budget import Bucket, Priority
from spotctl.core.errors import NotFoundError, StateError
from spotctl.state.connection import inserted
from spotctl.state.dbfile import bad_value, loads
from spotctl.state.metrics import Metrics


class Memory(Metrics):
    """The budget, notice, value and plan methods of :class:`spotctl.state.store.Store`."""

    # -- budget --------------------------------------------------------------

    def bucket(self, rate: float, burst: int, now: float) -> Bucket:
        r = self.conn.execute("SELECT * FROM budget WHERE region=?", (self.region,)).fetchone()
        if r is None:
            return Bucket.full(rate, burst, now)
        tokens = min(float(burst), r["tokens"])
        return Bucket(rate, burst, tokens, r["at"]).refill(now)

    def take_tokens(self, n: int, priority: Priority, rate: float, burst: int, now: float) -> int:
        """Atomically take up to n tokens from the shared bucket; return how many were granted."""
        with self.tx() as c:
            b = self.bucket(rate, burst, now)
            b, granted = b.take(n, priority, now)
            c.execute(
                "INSERT INTO budget (region, rate, burst, tokens, at, used_total) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(region) DO UPDATE SET rate=excluded.rate, burst=excluded.burst, tokens=excluded.tokens,"
                " at=excluded.at, used_total=budget.used_total+?",
                (self.region, rate, burst, b.tokens, b.at, granted, granted))
        return granted

    def tokens_used_total(self) -> int:
        r = self.conn.execute("SELECT used_total FROM budget WHERE region=?", (self.region,)).fetchone()
        return r[0] if r else 0

    # -- pool failures, reclaims, notices -----------------------------------

    def remember_failure(self, pool: str, until: float, reason: str, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO pool_failures (pool, until, reason, at) VALUES (?,?,?,?) ON CONFLICT(pool) DO "
                      "UPDATE SET until=excluded.until, reason=excluded.reason, at=excluded.at", (pool, until, reason, at))

    def pool_failures(self, now: float) -> dict[str, float]:
        return {r[0]: r[1] for r in self.conn.execute("SELECT pool, until FROM pool_failures WHERE until > ?", (now,))}

    def recent_reclaims(self, since: float) -> dict[str, int]:
        return {r[0]: r[1] for r in self.conn.execute(
            "SELECT pool, count(*) FROM reclaims WHERE at >= ? GROUP BY pool", (since,))}

    def see_notice(self, *, notice_id: str, node_id: str | None, instance_id: str, kind: str, issued_at: float,
                   deadline: float | None, reason: str, at: float, delivered_at: float | None = None,
                   pool: str | None = None) -> bool:
        """Record a notice the first time it is seen; True if new."""
        with self.tx() as c:
            cur = c.execute(
                "INSERT OR IGNORE INTO notices (id, node_id, instance_id, kind, issued_at, deadline, first_seen_at,"
                " reason, delivered_at, pool) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (notice_id, node_id, instance_id, kind, issued_at, deadline, at, reason, delivered_at, pool))
            if cur.rowcount != 1:
                return False
            if node_id is None:  # not one of ours: the metrics count what spotctl manages, not the account
                return True
            labels = {"pool": pool or "", "kind": kind}
            self.count("spotctl_notices", labels, at)
            self.observe("spotctl_notice_delivery_seconds", labels,
                         (delivered_at if delivered_at is not None else at) - issued_at, at)
            if deadline is not None:
                self.observe("spotctl_notice_lead_seconds", labels, deadline - at, at)
            return True

    def notices_since(self, t: float) -> list[dict]:
        """Notices first seen at or after ``t`` (the evidence for contract conformance)."""
        return [dict(r) for r in self.conn.execute(
            "SELECT * FROM notices WHERE first_seen_at >= ? ORDER BY first_seen_at, id", (t,))]

    def notice_handled(self, notice_id: str, at: float) -> None:
        with self.tx() as c:
            r = c.execute("UPDATE notices SET handled_at=? WHERE id=? AND handled_at IS NULL "
                          "RETURNING first_seen_at, pool, kind", (at, notice_id)).fetchone()
            if r is not None:
                self.observe("spotctl_notice_cordon_seconds", {"pool": r[1] or "", "kind": r[2]}, at - r[0], at)

    def notices(self) -> list[dict]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM notices ORDER BY first_seen_at, id")]

    # -- small persistent values (feed cursors, ETags) ------------------------

    def get_value(self, key: str, default: str | None = None) -> str | None:
        r = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return default if r is None else r[0]

    def set_value(self, key: str, value: str, at: float) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO kv (key, value, updated_at) VALUES (?,?,?) ON CONFLICT(key) DO UPDATE SET "
                      "value=excluded.value, updated_at=excluded.updated_at", (key, value, at))

    # -- plans and passes ----------------------------------------------------

    def record_plan(self, *, plan_id: str, at: float, actor: str, executed: bool, summary: dict,
                    plan_input: dict | str) -> int:
        """Record a plan with its input: a value, or its JSON already written (``PlanInput.recorded_json``:
        the text its digest names, not encoded twice)."""
        text = plan_input if isinstance(plan_input, str) else canonical(plan_input)
        blob = zlib.compress(text.encode(), 6)
        with self.tx() as c:
            cur = c.execute("INSERT INTO plans (plan_id, at, actor, executed, summary, input) VALUES (?,?,?,?,?,?)",
                            (plan_id, at, actor, int(executed), canonical(summary), blob))
            c.execute("DELETE FROM plans WHERE seq <= (SELECT max(seq) - 500 FROM plans)")
            return inserted(cur)

    def plans(self, limit: int = 20) -> list[dict]:
        rows = self.conn.execute("SELECT seq, plan_id, at, actor, executed, summary FROM plans ORDER BY seq DESC LIMIT ?",
                                 (limit,))
        return [{**dict(r), "summary": loads(self.path, "plans", r["seq"], "summary", r["summary"])} for r in rows]

    def plan_input(self, seq: int) -> dict:
        return self.plan_record(seq)["input"]

    def plan_record(self, seq: int) -> dict:
        """A recorded plan: its id, time, actor, summary and the full input it was made from."""
        r = self.conn.execute("SELECT * FROM plans WHERE seq=?", (seq,)).fetchone()
        if r is None:
            raise NotFoundError(f"no recorded plan #{seq} in region {self.region!r}",
                                hint="`spotctl plan --history` lists the recorded plans")
        d = dict(r)
        d["summary"] = loads(self.path, "plans", seq, "summary", d["summary"])
        if not isinstance(d["summary"], dict):
            raise bad_value(self.path, "plans", seq, "summary", d["summary"])
        try:
            d["input"] = json.loads(zlib.decompress(d["input"]))
        except (zlib.error, TypeError, ValueError) as e:
            why = "cannot be decompressed" if isinstance(e, (zlib.error, TypeError)) else "is not valid JSON"
            raise StateError(f"state database {self.path}: recorded plan #{seq} is corrupt: its input {why} "
                             f"({str(e)[:80]})",
                             hint="nothing was changed; the other recorded plans can still be replayed "
                                  "(`spotctl plan --history`)",
                             details={"path": str(self.path), "table": "plans", "row": seq}) from None
        return d

