"""Retention of finished jobs: which of them may be purged, and when the next is due.

Lives here: ``JobRetention`` (how long and how many finished jobs are kept,
checked when it is made) and its two decisions, how many of the oldest
finished jobs are due now and when the oldest one left comes due. Must not
know: storage, clocks, the scheduler, or what a job is for (the counts and
times it decides on are handed to it).

A finished job (completed or failed for good) is kept until it is
``max_age_ms`` old, counted from when it finished, and while it is among
the newest ``max_count`` finished jobs of its object. Past either, it is
due. A job is never purged less than ``MIN_AGE_MS`` after it finished, even
beyond ``max_count``: a caller that asks again about a job it just ran (a
retried request, say) still finds it. ``None`` for either limit lifts it.

A purge runs a while (``slack_ms``: a thirtieth of ``max_age_ms``, from an
hour to a day; a day by default) after the oldest finished job comes due,
so that the jobs that finish within that while go together. Each firing
scans the jobs' table (no index on when a job finished, which would cost
rows written): with a firing per job the scans would cost more than the
deletes, and with one a day they cost about 60 rows read per job while
a day's purge fits one batch, ``K``/250 past that (``docs/jobs.md``). A
job is gone within ``slack_ms`` past its window, and
``max_count`` may be exceeded by the jobs of one ``slack_ms``.

Finished jobs come due oldest first, so the due ones are always a prefix of
the finished jobs ordered by when they finished: the decisions deal in how
long that prefix is, never in ids.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
#: the least a finished job is kept, whatever the options say
MIN_AGE_MS = HOUR_MS
#: finished jobs deleted per firing of the purge timer (one transaction); more come at once after
PURGE_BATCH = 500


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


@dataclass(frozen=True)
class JobRetention:
    """How long finished jobs are kept: by age and by count.

    Args:
        max_age_ms: a finished job is purged once this old (from when it
            finished); 30 days by default, at least ``MIN_AGE_MS`` (an
            hour). ``None``: no limit by age.
        max_count: only the newest this many finished jobs of an object are
            kept (older ones go once an hour old); 100,000 by default, at
            least 1. ``None``: no limit by count.
    """

    max_age_ms: float | None = 30 * DAY_MS
    max_count: int | None = 100_000

    def __post_init__(self) -> None:
        age, count = self.max_age_ms, self.max_count
        if age is not None and not (_is_number(age) and MIN_AGE_MS <= age < float("inf")):
            raise ValueError(f"max_age_ms must be None or a number of milliseconds of at least "
                             f"{MIN_AGE_MS} (an hour), not {age!r}")
        if count is not None and not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ValueError(f"max_count must be None or an integer of at least 1, not {count!r}")

    @property
    def keeps_all(self) -> bool:
        """Neither limit is set: nothing is ever purged."""
        return self.max_age_ms is None and self.max_count is None

    def cutoffs(self, now: float) -> tuple[float | None, float]:
        """(finished at or before this is past ``max_age_ms``, or None; at or
        before this is at least ``MIN_AGE_MS`` old)."""
        return (None if self.max_age_ms is None else now - self.max_age_ms), now - MIN_AGE_MS

    def due_count(self, finished: int, past_max_age: int, past_min_age: int) -> int:
        """How many of the oldest finished jobs are due, of ``finished`` in
        all, ``past_max_age`` of them past ``max_age_ms`` and ``past_min_age``
        at least ``MIN_AGE_MS`` old (counted at the ``cutoffs``)."""
        by_age = past_max_age if self.max_age_ms is not None else 0
        beyond = 0 if self.max_count is None else max(0, finished - self.max_count)
        return max(by_age, min(beyond, past_min_age))

    @property
    def slack_ms(self) -> float:
        """How long after the oldest finished job comes due the purge runs: a
        thirtieth of ``max_age_ms``, from an hour to a day (a day without it)."""
        return DAY_MS if self.max_age_ms is None else min(DAY_MS, max(HOUR_MS, self.max_age_ms / 30))

    def purge_at(self, finished: int, oldest_at: float | None) -> float | None:
        """When to purge next: ``slack_ms`` after the oldest comes due."""
        due = self.next_due_at(finished, oldest_at)
        return None if due is None else due + self.slack_ms

    def next_due_at(self, finished: int, oldest_at: float | None) -> float | None:
        """When the oldest of ``finished`` jobs, finished at ``oldest_at``,
        comes due (None if never, or none is finished)."""
        if oldest_at is None or finished <= 0:
            return None
        if self.max_count is not None and finished > self.max_count:
            return oldest_at + MIN_AGE_MS  # beyond the newest max_count: due once an hour old
        return None if self.max_age_ms is None else oldest_at + self.max_age_ms
