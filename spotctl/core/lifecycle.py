"""The spot-node lifecycle: which transitions are legal, and which states may be drained, cordoned or
uncordoned (one copy of each rule: the planner, the watcher and ``spotctl drain`` use these).

intended → building → active → (advised) → draining → deleting → gone,
or failed; a node that disappears without notice is lost.
"""

from __future__ import annotations

from .errors import RefusedError
from .models import Node, PoolSpec
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


#: The states a node can be drained from (a hard notice, an advisory's drain stage, ``spotctl drain``),
#: in lifecycle order: a node still building is drained too (it may have joined a scheduler already).
DRAINABLE: tuple[S, ...] = (S.BUILDING, S.ACTIVE, S.ADVISED)


def plannable(n: Node) -> bool:
    """A node the planner acts on: live, or failed with an instance to delete."""
    return n.live or (n.state is S.FAILED and bool(n.instance_id))


def drainable(state: S) -> bool:
    """Whether a node in ``state`` can be drained: it is up, or on its way up, and not leaving already."""
    return state in DRAINABLE


def drainable_states() -> str:
    """The drainable states in words ("building, active or advised"), for a refusal to say."""
    names = [s.value for s in DRAINABLE]
    return ", ".join(names[:-1]) + " or " + names[-1]


def cordonable(state: S, *, cordoned: bool, known: bool) -> bool:
    """Whether a cordon (stop new placements) would change something: an active node, or a building one
    that some scheduler knows already (``known``: one that has not registered has nothing to cordon; it is
    cordoned once it does), not cordoned yet (an advised node is cordoned by definition)."""
    return state in (S.ACTIVE, S.BUILDING) and not cordoned and (known or state is not S.BUILDING)


def uncordonable(state: S, *, cordoned_by_us: bool) -> bool:
    """Whether a node carries a cordon of ours that an uncordon lifts: advised, or building and cordoned
    for an advisory while it booted."""
    return state is S.ADVISED or (state is S.BUILDING and cordoned_by_us)


def event_type(state: S) -> str:
    """CloudEvents ``type`` for a transition into ``state``."""
    return f"io.spotctl.node.{state.value}"


def bound_schedulers(pool: PoolSpec) -> frozenset[str]:
    """The schedulers a node of this pool is expected to join, by configuration: Slurm when the pool
    names a partition (``[regions.R.pools.P.slurm] partition``), Kubernetes when it sets node labels
    or taints (``[regions.R.pools.P.kubernetes]``). A scheduler that does not know a node of a pool
    bound to it is a finding (a misnamed node, a node that never registered), not "nothing to do";
    one that the pool is not bound to may not know it, by design."""
    out = set()
    if pool.slurm.partition is not None:
        out.add("slurm")
    if pool.kubernetes.labels or pool.kubernetes.taints:
        out.add("kubernetes")
    return frozenset(out)


#: A draining node whose hard-notice deadline is this close gets its last, forced drain round (what
#: still cannot move is deleted with the time left), then its capacity is returned.
DEADLINE_NEAR_SECONDS = 30


def forced_round(deadline: float | None, now: float) -> bool:
    """Whether a drain round at ``now`` must force: a hard notice's deadline is near."""
    return deadline is not None and deadline - now <= DEADLINE_NEAR_SECONDS
