"""Retry decisions are pure: checked exhaustively and by property."""

import pytest
from hypothesis import given, strategies as st

from durability.retry import Backoff, decide_retry


def test_delays_double_from_the_first_and_stop_at_the_ceiling():
    policy = Backoff(initial_ms=1_000, multiplier=2, max_ms=10_000, jitter=0)
    assert [policy.delay_ms(n, 0.5) for n in range(1, 7)] == [1_000, 2_000, 4_000, 8_000, 10_000, 10_000]


def test_jitter_adds_at_most_its_fraction():
    policy = Backoff(initial_ms=1_000, jitter=0.2)
    assert policy.delay_ms(1, 0.0) == 1_000
    assert policy.delay_ms(1, 0.999) == pytest.approx(1_199.8)


def test_attempt_limit():
    policy = Backoff(max_attempts=3, jitter=0)
    assert decide_retry(policy, 2, 100.0, 0.0).at_ms == 100.0 + 2_000
    decision = decide_retry(policy, 3, 100.0, 0.0)
    assert not decision.retry and decision.at_ms is None


@given(
    initial=st.floats(1, 10_000), multiplier=st.floats(1, 10), extra=st.floats(0, 1e6),
    jitter=st.floats(0, 1), failures=st.integers(1, 200), draw=st.floats(0, 1, exclude_max=True),
)
def test_a_delay_is_never_below_the_base_nor_above_the_jittered_ceiling(initial, multiplier, extra, jitter, failures,
                                                                         draw):
    policy = Backoff(initial_ms=initial, multiplier=multiplier, max_ms=initial + extra, jitter=jitter)
    delay = policy.delay_ms(failures, draw)
    assert min(initial, policy.max_ms) <= delay <= policy.max_ms * (1 + jitter)
    assert policy.delay_ms(failures + 1, draw) >= delay  # never shrinks


@pytest.mark.parametrize(
    "options",
    [{"initial_ms": 0}, {"multiplier": 0.5}, {"max_ms": 1, "initial_ms": 2}, {"jitter": 2}, {"max_attempts": 0}],
)
def test_bad_policies_are_refused(options):
    with pytest.raises(ValueError):
        Backoff(**options)
