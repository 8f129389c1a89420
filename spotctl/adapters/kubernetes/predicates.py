"""The Kubernetes scheduling predicates a spot pool is matched by: taints and tolerations
(:class:`Taint`, :func:`tolerates`), and nodeSelector plus required node affinity
(:func:`affinity_match`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint, as a pool declares it."""

    key: str
    value: str
    effect: str

    @classmethod
    def parse(cls, text: str) -> Taint:
        """``key=value:Effect``, ``key:Effect`` or ``key`` (NoSchedule), as pools write them."""
        rest, _, effect = text.partition(":")
        key, _, value = rest.partition("=")
        return cls(key.strip(), value.strip(), (effect or "NoSchedule").strip())


def tolerates(tolerations: list[dict], taint: Taint) -> bool:
    """The Kubernetes rule: some toleration matches the taint's key, value and effect."""
    if taint.effect == "PreferNoSchedule":
        return True
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.effect:
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t["key"] != taint.key:
            continue
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == taint.value):
            return True
    return False


def _expr_match(expr: dict, labels: dict[str, str]) -> bool:
    key: Any = expr.get("key")  # JSON as the pod has it: a malformed key raises TypeError (a malformed pod)
    op, values = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {op!r}")


def affinity_match(spec: dict, labels: dict[str, str]) -> bool:
    """nodeSelector and required node affinity (terms ORed, expressions ANDed) against node labels."""
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    for term in terms:
        if term.get("matchFields"):
            continue  # metadata.name pins a pod to a named node: never a new spot node
        exprs = term.get("matchExpressions") or []
        if exprs and all(_expr_match(e, labels) for e in exprs):
            return True
    return False

