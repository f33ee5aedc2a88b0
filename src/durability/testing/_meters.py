"""What one object is billed and limited by, counted as production counts it: its load and its awake time.

Lives here: ``LoadMeter`` (requests per second of the clock against the
soft limit, and the CPU left since the last request against the CPU
limit) and ``AwakeMeter`` (the periods the object cannot hibernate, as
duration is billed). Each writes what it counts into the object's
``ObjectStats``. Must not know: the object, its instance or its events;
the host tells each meter what happened.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._host import ObjectStats


class LoadMeter:
    def __init__(self, stats: ObjectStats, clock: Callable[[], float], max_requests_per_s: float | None,
                 cpu_limit_ms: float | None) -> None:
        self.stats = stats
        self.clock = clock  #: the loop's time, in seconds
        self.max_requests_per_s = max_requests_per_s
        self.cpu_limit_ms = cpu_limit_ms
        self._recent: collections.deque[float] = collections.deque()  # loop times of the last second's requests
        self._cpu_left_s = 0.0  # CPU the instance may still run for, topped up by each request

    def _window(self) -> collections.deque[float]:
        """The loop times of the requests taken within the last second."""
        now, recent = self.clock(), self._recent
        while recent and recent[0] <= now - 1.0:
            recent.popleft()
        return recent

    def over_rate(self) -> bool:
        return self.max_requests_per_s is not None and len(self._window()) >= self.max_requests_per_s

    def count_request(self) -> None:
        """An RPC call or an alarm taken: billed, counted against the rate (an
        alarm is never refused, but it takes the object's time), and the CPU
        time topped up to the limit."""
        self.stats.requests += 1
        if self.cpu_limit_ms is not None:
            self._cpu_left_s = self.cpu_limit_ms / 1000
        recent = self._window()
        recent.append(self.clock())
        self.stats.peak_requests_per_s = max(self.stats.peak_requests_per_s, len(recent))
        second = int(self.clock())
        self.stats.requests_by_second[second] = self.stats.requests_by_second.get(second, 0) + 1

    def charge_cpu(self, seconds: float) -> bool:
        """A step of the object's code ran for ``seconds``; True once it has run past its CPU limit."""
        self.stats.cpu_s += seconds
        self._cpu_left_s -= seconds
        return self.cpu_limit_ms is not None and self._cpu_left_s < 0


class AwakeMeter:
    """Awake periods: open while the object has anything pending (an event,
    a task, a timer its code set), closed when it has nothing; an object with
    nothing pending but its alarm may hibernate, and bills nothing."""

    def __init__(self, stats: ObjectStats, clock: Callable[[], float]) -> None:
        self.stats = stats
        self.clock = clock
        self._since: float | None = None  # loop time the current awake period began
        self.asleep_since: float | None = None  #: loop time the object last fell asleep (None: awake)

    def note(self, awake: bool) -> bool:
        """Whether the object falls asleep now (it was awake and has nothing pending any more)."""
        now = self.clock()
        if awake and self._since is None:
            self._since, self.asleep_since = now, None
        elif not awake and self._since is not None:
            start, self._since, self.asleep_since = self._since, None, now
            self.stats.awake_s += now - start
            periods = self.stats.awake_periods
            if periods and periods[-1][1] >= start:
                periods[-1] = (periods[-1][0], now)
            else:
                periods.append((start, now))
            return True
        return False

    def seconds(self) -> float:
        """Seconds awake so far, the period still open included."""
        return self.stats.awake_s + (self.clock() - self._since if self._since is not None else 0.0)

    def periods(self) -> list[tuple[float, float]]:
        """The periods awake so far, (start, end) in loop seconds, the one still open included."""
        periods = list(self.stats.awake_periods)
        if self._since is not None:
            periods.append((self._since, self.clock()))
        return periods
