"""The token bucket: never exceeded; higher classes are never starved by lower ones."""

from hypothesis import given, settings
from hypothesis import strategies as st

from spotctl.core.budget import Bucket, Priority


def test_reserve_keeps_tokens_for_reclaim_handling():
    b = Bucket.full(rate=0.0001, burst=10, at=0.0)
    b, got = b.take(10, Priority.LAUNCH, 0.0)
    assert got == 8  # 20 % kept back from launches
    b, got = b.take(10, Priority.CONSOLIDATION, 0.0)
    assert got == 0
    b, got = b.take(10, Priority.RECLAIM, 0.0)
    assert got == 2


def test_refills_at_rate_up_to_burst():
    b = Bucket(rate=2.0, burst=10, tokens=0.0, at=0.0)
    assert b.refill(3.0).tokens == 6.0
    assert b.refill(100.0).tokens == 10.0


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.01, 5.0),
    burst=st.integers(1, 50),
    steps=st.lists(st.tuples(st.floats(0, 30), st.integers(0, 20), st.sampled_from(list(Priority))), max_size=60),
)
def test_never_grants_more_than_burst_plus_refill(rate, burst, steps):
    b = Bucket.full(rate, burst, 0.0)
    t = 0.0
    granted = 0
    for dt, n, prio in steps:
        t += dt
        b, got = b.take(n, prio, t)
        assert 0 <= got <= n
        assert b.tokens >= -1e-9
        granted += got
        assert granted <= burst + rate * t + 1e-6
