"""Rows for many writes at once: the outbox rows of many lifecycle events and the chained audit rows of
many records, built in Python for one ``executemany`` each (:meth:`spotctl.state.store.Store.adopt_nodes`).

They are the rows :meth:`Outbox.event <spotctl.state.outbox.Outbox.event>` and :meth:`AuditLog.audit
<spotctl.state.audit.AuditLog.audit>` write one at a time, byte for byte the same shape: an event's
payload is the structured-mode CloudEvent the ``cloudevents`` SDK makes (the SDK builds and validates
the first event of each type and source; the others of the batch differ from it only in ``id``,
``subject`` (checked non-empty), ``time`` (written as the SDK writes it) and ``data``), and an audit
record is hashed as :func:`spotctl.core.audit.audit_hash` hashes it, chained after the one before it.

Each document is written with one encoding of its free-form part (an event's ``data``, a record's
``inputs``): the rest of it is put around that text in canonical order (sorted keys, every value
written by :func:`spotctl.core.audit.canonical`), the bytes ``canonical`` would write for the whole.
:meth:`AuditLog.audit <spotctl.state.audit.AuditLog.audit>` and :meth:`Outbox.cloud_event
<spotctl.state.outbox.Outbox.cloud_event>` write their rows through these builders too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring  # what canonical writes for a str (ensure_ascii=False)
from typing import Any

from spotctl.core.audit import canonical
from spotctl.core.lifecycle import check_transition, event_type
from spotctl.core.models import Node, NodeState
from spotctl.state.outbox import cloud_event, structured

#: one row of the outbox: (kind, key, payload, created_at)
OutboxRow = tuple[str, str, str, float]


#: the attributes of a CloudEvent that differ between the events of one template
_PER_EVENT = ("data", "id", "subject", "time")


def new_id() -> str:
    """A random (version 4) UUID as text: what ``str(uuid.uuid4())`` gives, without the ``UUID`` object."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _json(value: Any) -> str:
    """``canonical(value)``; a string, None or a finite float directly (as the encoder writes them)."""
    t = type(value)
    if t is str:
        return encode_basestring(value)
    if value is None:
        return "null"
    if t is float and math.isfinite(value):
        return float.__repr__(value)
    return canonical(value)


class EventRows:
    """Outbox rows of lifecycle events from one source (a region), built without one SDK object each."""

    def __init__(self, region: str, extensions: dict[str, str] | None = None):
        self.source = f"spotctl/{region}"
        self.extensions = extensions or {}  # the same on every event of this source (the actor's)
        self._templates: dict[str, tuple[list[str], list[str]]] = {}  # type -> (literal pieces, attributes between)
        self._times: dict[float, str] = {}

    def _time(self, at: float) -> str:
        text = self._times.get(at)
        if text is None:  # as structured() writes it: RFC 3339, "Z", microseconds only when there are any
            if len(self._times) >= 1024:  # a long-lived store (the watcher) meets ever new times
                self._times.clear()
            text = self._times[at] = datetime.fromtimestamp(at, tz=UTC).isoformat().removesuffix("+00:00") + "Z"
        return text

    def event(self, type_: str, subject: str, data: dict | None, at: float, data_text: str | None = None,
              ) -> OutboxRow:
        """The outbox row of one CloudEvent (keyed by its subject, as ``Outbox.cloud_event`` keys it);
        ``data_text``: ``canonical(data)``, when the caller has it (``data`` is then needed only for the
        first event of its type, which the SDK builds: None when the type has its template)."""
        template = self._templates.get(type_)
        if template is None:  # the SDK builds and validates the first one of its type
            if data is None:
                data = json.loads(data_text or "null")
            doc = structured(cloud_event(source=self.source, type_=type_, subject=subject, data=data, at=at,
                                         extensions=self.extensions))
            # its text around the attributes that differ per event (_PER_EVENT), in canonical (sorted) order:
            # the literal pieces, and which attribute goes after each
            pieces, slots, text = [], [], ""
            for i, (k, v) in enumerate(sorted(doc.items())):
                text += ("," if i else "{") + _json(k) + ":"
                if k in _PER_EVENT:
                    pieces.append(text)
                    slots.append(k)
                    text = ""
                else:
                    text += canonical(v)
            pieces.append(text + "}")
            self._templates[type_] = (pieces, slots)
            return ("event", subject, canonical(doc), at)
        if not isinstance(subject, str) or not subject:
            raise ValueError(f"a CloudEvent's subject must be a non-empty string, not {subject!r}")
        pieces, slots = template
        own = {"data": canonical(data) if data_text is None else data_text, "id": f'"{new_id()}"',
               "subject": encode_basestring(subject), "time": f'"{self._time(at)}"'}
        out = [pieces[0]]
        for slot, piece in zip(slots, pieces[1:]):
            out.append(own[slot])
            out.append(piece)
        return ("event", subject, "".join(out), at)

    def transition(self, node: Node, src: NodeState | None, dst: NodeState, reason: str, at: float) -> OutboxRow:
        """The event of a node's transition ``src`` -> ``dst`` (the data ``Outbox.event`` gives it)."""
        frm, to = _STATE_JSON[src], _STATE_JSON[dst]
        text = (f'{{"action_id":{_json(node.action_id)},"from":{frm},"instance_id":{_json(node.instance_id)},'
                f'"node":{_json(node.id)},"pool":{_json(node.pool)},"reason":{_json(reason)},"to":{to}}}')
        type_ = _EVENT_TYPE.get(dst) or event_type(dst)
        data = None if type_ in self._templates else {
            "node": node.id, "pool": node.pool, "from": src.value if src else None, "to": dst.value,
            "reason": reason, "instance_id": node.instance_id, "action_id": node.action_id}
        return self.event(type_, node.id, data, at, text)


#: each state's JSON text (``"active"``; no state: ``null``) and its event's type, looked up once
_STATE_JSON: dict[NodeState | None, str] = {None: "null", **{st: encode_basestring(st.value) for st in NodeState}}
_EVENT_TYPE: dict[NodeState, str] = {st: event_type(st) for st in NodeState}


class AuditRows:
    """Chained audit records, each with its outbox row, after the chain's current head."""

    def __init__(self, region: str, head: str):
        self.region = region
        self.head = head  # the hash of the last record (the next one's prev_hash)

    def record(self, *, actor: str, action: str, target: str, result: str, inputs: dict,
               at: float) -> tuple[tuple, OutboxRow]:
        """(the audit table's row, the outbox row) of one record, as ``AuditLog.audit`` writes them."""
        _, row, queued = self.make(actor=actor, action=action, target=target, result=result, inputs=inputs, at=at)
        return row, queued

    def make(self, *, actor: str, action: str, target: str, result: str, inputs: dict | SharedInputs,
             at: float) -> tuple[dict[str, Any], tuple, OutboxRow]:
        """(the record as ``AuditLog.audit`` returns it, its audit row, its outbox row); the chain moves on."""
        if isinstance(inputs, SharedInputs):
            text = inputs.text
            inputs = inputs.value
        else:
            text = canonical(inputs)
            if not _flat(inputs):  # the record keeps the inputs as JSON gives them back
                inputs = json.loads(text)
                text = canonical(inputs)
        rid = new_id()
        prev = self.head
        # the canonical JSON of the hashed fields (HASHED_FIELDS, in sorted order), as audit_hash writes it
        a, b, t, i, r, g = _json(action), _json(actor), _json(at), f'"{rid}"', _json(result), _json(target)
        body = f'{{"action":{a},"actor":{b},"at":{t},"id":{i},"inputs":{text},"result":{r},"target":{g}}}'
        h = self.head = hashlib.sha256((prev + body).encode()).hexdigest()
        queued = (f'{{"action":{a},"actor":{b},"at":{t},"hash":"{h}","id":{i},"inputs":{text},'
                  f'"prev_hash":{_json(prev)},"region":{_json(self.region)},"result":{r},"target":{g}}}')
        rec: dict[str, Any] = {"id": rid, "at": at, "actor": actor, "action": action, "target": target,
                               "result": result, "inputs": inputs, "prev_hash": prev, "hash": h, "region": self.region}
        return rec, (rid, at, actor, action, target, result, text, prev, h), ("audit", rid, queued, at)


class SharedInputs:
    """The inputs of one of many records that share most of them (the nodes of one launch): ``{**base,
    **own}`` as JSON gives it back (``value``) and its canonical text (``text``), the base encoded once
    (:meth:`with_own`) — the text ``canonical(json.loads(canonical({**base, **own})))`` is."""

    __slots__ = ("_parts", "text", "value")

    def __init__(self, base: dict, *, value: dict | None = None, text: str = "",
                 parts: dict[str, str] | None = None):
        if value is None:
            value = json.loads(canonical(base))
            if all(type(k) is str for k in base):
                parts = {k: canonical(v) for k, v in value.items()}
        self.value, self.text, self._parts = value, text, parts

    def with_own(self, **own: str) -> SharedInputs | dict:
        """The inputs ``{**base, **own}`` (own: strings); a plain dict when the base cannot be shared (a key
        that is not a string: JSON writes it as one, and would sort it elsewhere)."""
        if self._parts is None or any(type(v) is not str for v in own.values()):
            return {**self.value, **own}
        parts = {**self._parts, **{k: encode_basestring(v) for k, v in own.items()}}
        text = "{" + ",".join(f"{encode_basestring(k)}:{parts[k]}" for k in sorted(parts)) + "}"
        return SharedInputs({}, value={**self.value, **own}, text=text, parts=None)


def _flat(inputs: dict) -> bool:
    """Inputs JSON gives back unchanged: string keys, and strings, finite numbers, booleans or None (a check
    of the top level only: walking nested values in Python costs more than JSON's own round trip)."""
    return all(type(k) is str and (v is None or type(v) in (str, bool, int) or (type(v) is float and math.isfinite(v)))
               for k, v in inputs.items())


def adoption_rows(adopted: list[tuple[Node, NodeState]], *, at: float, actor: str, events: EventRows,
                  chain: AuditRows, row: Callable[[Node], tuple]) -> tuple[list, list, list, list]:
    """The rows of adopting these nodes (each ``intended``, then moved to its state): (nodes, transitions,
    audit, outbox), each in the order ``Store.add_node``, ``Store.transition`` and ``Store.audit`` called
    node by node would write them; each node is changed as the transition changes it."""
    nodes: list[tuple] = []
    moves: list[tuple] = []
    audit: list[tuple] = []
    outbox: list[OutboxRow] = []
    for node, to in adopted:
        check_transition(node.id, NodeState.INTENDED, to)
        born, first = node.created_at, node.reason
        moves.append((node.id, None, NodeState.INTENDED.value, born, first, actor))
        outbox.append(events.transition(node, None, NodeState.INTENDED, first, born))
        node.state, node.updated_at, node.reason = to, at, "adopted"
        nodes.append(row(node))
        moves.append((node.id, NodeState.INTENDED.value, to.value, at, "adopted", actor))
        outbox.append(events.transition(node, NodeState.INTENDED, to, "adopted", at))
        record, queued = chain.record(actor=actor, action="node.adopt", target=node.id, result="ok",
                                      inputs={"instance_id": node.instance_id, "pool": node.pool}, at=at)
        audit.append(record)
        outbox.append(queued)
    return nodes, moves, audit, outbox
