"""What a start rate did, from ground truth: the most starts in any window, the rate achieved, how late starts came.

Lives here: pure measures over start and submission times (epoch ms).
Must not know: any system that produced them.
"""

from __future__ import annotations

import bisect


def most_in_any_window(starts: list[float], period_ms: float) -> int:
    """The most starts in any half-open window ``[t, t + period_ms)``."""
    times = sorted(starts)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= period_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def windows_over(starts: list[float], period_ms: float, most: int) -> int:
    """How many starts end a window of ``period_ms`` holding more than ``most``."""
    times = sorted(starts)
    return sum(k - bisect.bisect_right(times, at - period_ms) + 1 > most for k, at in enumerate(times))


def waiting_ms(submitted: dict[str, float], started: dict[str, float]) -> float:
    """How long at least one job waited to start (the union of their waits)."""
    spans = sorted((submitted[j], started[j]) for j in started if started[j] > submitted[j])
    total, reach = 0.0, float("-inf")
    for begin, end in spans:
        if end > reach:
            total += end - max(begin, reach)
            reach = end
    return total


def achieved_per_period(submitted: dict[str, float], started: dict[str, float], period_ms: float) -> float:
    """Starts per period while work waited: the starts made while some job
    waited, over that time, times the period. A start ends the wait of its
    own job, so each waiting span counts its own start."""
    spans = sorted((submitted[j], started[j]) for j in started if started[j] > submitted[j])
    merged: list[list[float]] = []
    for begin, end in spans:
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    inside = sum(1 for at in started.values() if any(b < at <= e for b, e in merged))
    waited = sum(e - b for b, e in merged)
    return inside * period_ms / waited if waited else 0.0


def start_delays_ms(submitted: dict[str, float], started: dict[str, float], limit: int,
                    period_ms: float) -> list[float]:
    """For each start that had to wait for the rate, how long after the rate
    allowed it it came: a start of the ``limit``-th start before it plus a
    period, or its own submission, whichever is later."""
    order = sorted(started, key=started.get)
    delays = []
    for k, job in enumerate(order):
        if k < limit:
            continue
        allowed = max(started[order[k - limit]] + period_ms, submitted[job])
        if started[job] >= allowed - 1e-6 and allowed > submitted[job]:
            delays.append(started[job] - allowed)
    return delays
