"""The audit chain: how a record is hashed, and the one walk that checks a chain.

Every audit record carries ``prev_hash`` (the hash of the record before it, :data:`GENESIS` for the
first) and ``hash`` = SHA-256 of ``prev_hash`` followed by the :func:`canonical` JSON of the record's
:data:`HASHED_FIELDS`. The state store writes records with :func:`audit_hash`, ``spotctl audit
verify`` and ``Store.verify_audit`` check them with :func:`walk`, and the reference audit receiver
recomputes each record's hash from its content with :func:`record_hash` — one definition, so that a
database written by any version and the audit service verify the same way.

**Never change these bytes**: a different separator, key order, float format or ASCII escaping
changes every hash, and every existing chain (local and at the audit service) would stop verifying.
``tests/unit/test_audit.py`` pins the hash of a fixed record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GENESIS = "0" * 64
HASHED_FIELDS = ("id", "at", "actor", "action", "target", "result", "inputs")

BROKEN_LINK = ("its prev_hash is not the hash of the record before it "
               "(a record before it was altered, removed or inserted)")
ALTERED = "its content does not match its hash (the record was altered)"


def canonical(obj: Any) -> str:
    """The canonical JSON of a value: sorted keys, no spaces, UTF-8 kept (not ``\\u`` escaped)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def audit_hash(record: Mapping[str, Any], prev_hash: str) -> str:
    """The hash of a record chained after ``prev_hash``."""
    body = {k: record[k] for k in HASHED_FIELDS}
    return hashlib.sha256((prev_hash + canonical(body)).encode()).hexdigest()


def record_hash(record: Mapping[str, Any]) -> str:
    """The hash a record should carry, from its own ``prev_hash`` (how the audit receiver checks one)."""
    return audit_hash(record, record["prev_hash"])


@dataclass(frozen=True)
class ChainWalk:
    """What a walk of a chain found: ``ok``, or the first record that breaks it and why."""

    ok: bool
    checked: int                              # records read, the bad one included
    first_bad: Mapping[str, Any] | None = None
    reason: str | None = None                 # BROKEN_LINK or ALTERED
    verified: dict[str, str] = field(default_factory=dict)  # record id -> hash, for the records before the break
    head: str = GENESIS                       # the hash of the last verified record


def walk(records: Iterable[Mapping[str, Any]]) -> ChainWalk:
    """Walk a chain from its first record (oldest first); stop at the first record that breaks it."""
    prev = GENESIS
    checked = 0
    verified: dict[str, str] = {}
    for rec in records:
        checked += 1
        if rec["prev_hash"] != prev:
            return ChainWalk(False, checked, rec, BROKEN_LINK, verified, prev)
        if audit_hash(rec, prev) != rec["hash"]:
            return ChainWalk(False, checked, rec, ALTERED, verified, prev)
        verified[rec["id"]] = rec["hash"]
        prev = rec["hash"]
    return ChainWalk(True, checked, None, None, verified, prev)
