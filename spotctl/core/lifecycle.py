"""The spot-node lifecycle: which transitions are legal.

intended → building → active → (advised) → draining → deleting → gone,
or failed; a node that disappears without notice is lost.
"""

from __future__ import annotations

from .errors import RefusedError
from .models import NodeState as S

ALLOWED: dict[S, frozenset[S]] = {
    S.INTENDED: frozenset({S.BUILDING, S.ACTIVE, S.FAILED, S.DELETING, S.LOST}),
    S.BUILDING: frozenset({S.ACTIVE, S.FAILED, S.DRAINING, S.DELETING, S.LOST, S.GONE}),
    S.ACTIVE: frozenset({S.ADVISED, S.DRAINING, S.DELETING, S.LOST, S.GONE}),
    S.ADVISED: frozenset({S.ACTIVE, S.DRAINING, S.DELETING, S.LOST, S.GONE}),
    S.DRAINING: frozenset({S.DELETING, S.ACTIVE, S.LOST, S.GONE}),
    S.DELETING: frozenset({S.GONE, S.LOST}),
    S.GONE: frozenset(),
    S.FAILED: frozenset({S.DELETING, S.GONE}),
    S.LOST: frozenset(),
}


def can_transition(src: S, dst: S) -> bool:
    return dst in ALLOWED[src]


def check_transition(node_id: str, src: S, dst: S) -> None:
    if not can_transition(src, dst):
        raise RefusedError(f"node {node_id} cannot go from {src} to {dst}")


def event_type(state: S) -> str:
    """CloudEvents ``type`` for a transition into ``state``."""
    return f"io.spotctl.node.{state.value}"
