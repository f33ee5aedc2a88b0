"""Retry decisions: pure functions of a policy, an attempt number and a random draw.

Lives here: ``Backoff`` (exponential backoff with jitter and an optional
attempt limit) and ``decide_retry``. Must not know: clocks, storage, I/O.
The caller reads the clock and draws the jitter, so every decision can be
tested exhaustively and replayed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """How long to wait before attempt ``n + 1`` after attempt ``n`` failed."""

    initial_ms: float = 1_000.0  #: delay after the first failure
    multiplier: float = 2.0  #: growth per further failure
    max_ms: float = 5 * 60_000.0  #: ceiling on one delay
    jitter: float = 0.2  #: up to this fraction is added at random, to spread retries
    max_attempts: int | None = None  #: give up after this many attempts (None: never)

    def __post_init__(self) -> None:
        if not self.initial_ms > 0:
            raise ValueError(f"Backoff.initial_ms must be positive, not {self.initial_ms!r}")
        if not self.multiplier >= 1:
            raise ValueError(f"Backoff.multiplier must be at least 1, not {self.multiplier!r}")
        if not self.max_ms >= self.initial_ms:
            raise ValueError("Backoff.max_ms must be at least initial_ms")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff.jitter must be from 0 to 1, not {self.jitter!r}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("Backoff.max_attempts must be at least 1 (or None)")

    def delay_ms(self, failures: int, draw: float) -> float:
        """The wait after ``failures`` consecutive failures (1 or more); ``draw`` in [0, 1)."""
        if failures < 1:
            raise ValueError("delay_ms needs at least one failure")
        base = min(self.max_ms, self.initial_ms * self.multiplier ** (failures - 1))
        return base * (1 + self.jitter * draw)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    at_ms: float | None  # when to try again, if retry


def decide_retry(policy: Backoff, failures: int, now_ms: float, draw: float) -> RetryDecision:
    """After ``failures`` consecutive failures at ``now_ms``: try again, and when?"""
    if policy.max_attempts is not None and failures >= policy.max_attempts:
        return RetryDecision(False, None)
    return RetryDecision(True, now_ms + policy.delay_ms(failures, draw))
