"""The audit chain: how a record is hashed, and the one walk that checks a chain.

Every audit record carries ``prev_hash`` (the hash of the record before it, :data:`GENESIS` for the
first) and ``hash`` = SHA-256 of ``prev_hash`` followed by the :func:`canonical` JSON of the record's
:data:`HASHED_FIELDS`. The state store writes records with :func:`audit_hash`, ``spotctl audit
verify`` and ``Store.verify_audit`` check them with :func:`walk`, and the reference audit receiver
recomputes each record's hash from its content with :func:`record_hash` — one definition, so that a
database written by any version and the audit service verify the same way.

A walk need not start at the first record ever written: :class:`Mark` is a point in the chain (the
checkpoint a successful verify leaves, or the anchor pruning leaves), and :func:`verify_start`
decides where ``audit verify`` starts from them (incremental after the checkpoint, or ``--full`` from
the first kept record).

**Never change these bytes**: a different separator, key order, float format or ASCII escaping
changes every hash, and every existing chain (local and at the audit service) would stop verifying.
``tests/unit/test_audit.py`` pins the hash of a fixed record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GENESIS = "0" * 64
HASHED_FIELDS = ("id", "at", "actor", "action", "target", "result", "inputs")

BROKEN_LINK = ("its prev_hash is not the hash of the record before it "
               "(a record before it was altered, removed or inserted)")
ALTERED = "its content does not match its hash (the record was altered)"


#: the encoder ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)``
#: builds on every call, built once (``encode`` keeps no state between calls: safe from any thread)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode


def canonical(obj: Any) -> str:
    """The canonical JSON of a value: sorted keys, no spaces, UTF-8 kept (not ``\\u`` escaped)."""
    return _CANONICAL(obj)


def audit_hash(record: Mapping[str, Any], prev_hash: str) -> str:
    """The hash of a record chained after ``prev_hash``."""
    body = {k: record[k] for k in HASHED_FIELDS}
    return hashlib.sha256((prev_hash + canonical(body)).encode()).hexdigest()


def record_hash(record: Mapping[str, Any]) -> str:
    """The hash a record should carry, from its own ``prev_hash`` (how the audit receiver checks one)."""
    return audit_hash(record, record["prev_hash"])


@dataclass(frozen=True)
class ChainWalk:
    """What a walk of a chain found: ``ok``, or the first record that breaks it and why. Constant size
    whatever the length of the chain (the walk keeps only the last record it verified)."""

    ok: bool
    checked: int                              # records read, the bad one included
    first_bad: Mapping[str, Any] | None = None
    reason: str | None = None                 # BROKEN_LINK or ALTERED
    last: Mapping[str, Any] | None = None     # the last record verified (None: none was)
    head: str = GENESIS                       # the hash of the last verified record (the start when none was)


def walk(records: Iterable[Mapping[str, Any]], start: str = GENESIS) -> ChainWalk:
    """Walk a chain (oldest first) whose first record must chain to ``start`` (:data:`GENESIS`, a
    checkpoint's hash or the anchor left by pruning); stop at the first record that breaks it. Reads the
    records one at a time: an iterator over any number of records walks in constant memory."""
    prev = start
    checked = 0
    last: Mapping[str, Any] | None = None
    for rec in records:
        checked += 1
        if rec["prev_hash"] != prev:
            return ChainWalk(False, checked, rec, BROKEN_LINK, last, prev)
        if audit_hash(rec, prev) != rec["hash"]:
            return ChainWalk(False, checked, rec, ALTERED, last, prev)
        last = rec
        prev = rec["hash"]
    return ChainWalk(True, checked, None, None, last, prev)


# -- marks: where an incremental or a pruned chain starts ---------------------------------------------

CHECKPOINT_GONE = "the checkpoint record (the last one verified before) is gone (records were removed)"
CHECKPOINT_CHANGED = "the checkpoint record changed since it was verified (its hash or content differs)"


@dataclass(frozen=True)
class Mark:
    """A point in the chain: a record's ``seq`` and ``hash`` — the checkpoint of the last successful
    verify, or the anchor pruning leaves (the last pruned record; ``outbox_id``: its outbox row)."""

    seq: int
    hash: str
    outbox_id: int = 0

    def to_text(self) -> str:
        return canonical({"seq": self.seq, "hash": self.hash, "outbox_id": self.outbox_id})

    @classmethod
    def from_text(cls, text: str) -> Mark:
        """Read a stored mark; ValueError when it is not one (the caller names where it came from)."""
        try:
            d = json.loads(text)
        except ValueError:
            raise ValueError("not JSON") from None
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        seq, h, oid = d.get("seq"), d.get("hash"), d.get("outbox_id", 0)
        if not (type(seq) is int and seq >= 1 and type(oid) is int and oid >= 0):
            raise ValueError("seq must be an integer >= 1 and outbox_id an integer >= 0")
        if not (isinstance(h, str) and len(h) == 64 and all(ch in "0123456789abcdef" for ch in h)):
            raise ValueError("hash must be 64 lowercase hex digits")
        return cls(seq, h, oid)


def verify_start(*, full: bool, checkpoint: Mark | None, anchor: Mark | None) -> tuple[str, Mark | None, bool]:
    """Where a verify starts: (mode, mark, check_mark_record). ``mode`` is "full" (from the first kept
    record, chained to the pruning anchor or GENESIS) or "incremental" (after the checkpoint, whose own
    record must still carry the checkpoint's hash: ``check_mark_record``). A checkpoint at or before the
    anchor was pruned away: the walk resumes after the anchor."""
    if full or checkpoint is None:
        return "full", anchor, False
    if anchor is not None and checkpoint.seq <= anchor.seq:
        return "incremental", anchor, False
    return "incremental", checkpoint, True


def check_mark_record(rec: Mapping[str, Any] | None, mark: Mark) -> str | None:
    """Why the record a checkpoint names no longer matches it (None: it does)."""
    if rec is None:
        return CHECKPOINT_GONE
    if rec["hash"] != mark.hash or audit_hash(rec, rec["prev_hash"]) != rec["hash"]:
        return CHECKPOINT_CHANGED
    return None
