import pytest

from spotctl.core.errors import RefusedError
from spotctl.core.lifecycle import can_transition, check_transition, event_type
from spotctl.core.models import NodeState as S


def test_happy_path_and_terminal_states():
    path = [S.INTENDED, S.BUILDING, S.ACTIVE, S.ADVISED, S.DRAINING, S.DELETING, S.GONE]
    for a, b in zip(path, path[1:]):
        assert can_transition(a, b)
    for terminal in (S.GONE, S.LOST):
        assert not any(can_transition(terminal, s) for s in S)
    with pytest.raises(RefusedError):
        check_transition("n1", S.GONE, S.ACTIVE)
    assert event_type(S.LOST) == "io.spotctl.node.lost"
