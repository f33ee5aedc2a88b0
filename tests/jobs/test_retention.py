"""The retention rules (pure): which finished jobs are due, and when the next comes due."""

import pytest

from durability import JobRetention
from durability.jobs.retention import DAY_MS, HOUR_MS, MIN_AGE_MS

NOW = 1_000 * DAY_MS


def test_the_defaults_keep_30_days_and_the_newest_100_000():
    rules = JobRetention()
    assert (rules.max_age_ms, rules.max_count) == (30 * DAY_MS, 100_000)
    assert rules.cutoffs(NOW) == (NOW - 30 * DAY_MS, NOW - HOUR_MS)


@pytest.mark.parametrize("options", [
    {"max_age_ms": HOUR_MS - 1}, {"max_age_ms": 0}, {"max_age_ms": -5}, {"max_age_ms": float("nan")},
    {"max_age_ms": float("inf")}, {"max_age_ms": "30d"}, {"max_age_ms": True},
    {"max_count": 0}, {"max_count": -1}, {"max_count": 1.5}, {"max_count": True}, {"max_count": "10"},
])
def test_bad_options_are_refused_with_a_clear_error(options):
    with pytest.raises(ValueError, match="max_age_ms|max_count"):
        JobRetention(**options)


def test_an_hour_is_the_shortest_age_and_one_the_smallest_count():
    assert JobRetention(max_age_ms=MIN_AGE_MS, max_count=1).max_age_ms == HOUR_MS


def test_a_job_is_due_past_its_age():
    rules = JobRetention(max_age_ms=2 * HOUR_MS, max_count=None)
    assert rules.due_count(finished=10, past_max_age=3, past_min_age=8) == 3
    assert rules.due_count(finished=10, past_max_age=0, past_min_age=8) == 0


def test_a_job_beyond_the_newest_max_count_is_due_once_an_hour_old():
    rules = JobRetention(max_age_ms=None, max_count=5)
    assert rules.due_count(finished=10, past_max_age=0, past_min_age=10) == 5
    assert rules.due_count(finished=10, past_max_age=0, past_min_age=2) == 2  # the rest are too young
    assert rules.due_count(finished=5, past_max_age=0, past_min_age=5) == 0


def test_either_limit_makes_a_job_due():
    rules = JobRetention(max_age_ms=DAY_MS, max_count=5)
    assert rules.due_count(finished=10, past_max_age=7, past_min_age=9) == 7  # by age, more than by count
    assert rules.due_count(finished=10, past_max_age=1, past_min_age=9) == 5  # by count


def test_without_limits_nothing_is_ever_due():
    rules = JobRetention(max_age_ms=None, max_count=None)
    assert rules.keeps_all
    assert rules.due_count(finished=10**6, past_max_age=10**6, past_min_age=10**6) == 0
    assert rules.next_due_at(10**6, NOW) is None


def test_the_next_purge_is_due_when_the_oldest_job_comes_due():
    rules = JobRetention(max_age_ms=DAY_MS, max_count=5)
    assert rules.next_due_at(0, None) is None
    assert rules.next_due_at(3, NOW) == NOW + DAY_MS
    assert rules.next_due_at(6, NOW) == NOW + MIN_AGE_MS  # beyond the count: an hour after it finished
    assert JobRetention(max_age_ms=None, max_count=5).next_due_at(5, NOW) is None


def test_a_purge_runs_a_while_after_its_oldest_job_comes_due_so_the_jobs_of_that_while_go_together():
    assert JobRetention().slack_ms == DAY_MS  # a thirtieth of 30 days
    assert JobRetention(max_age_ms=90 * DAY_MS).slack_ms == DAY_MS  # a day at most
    assert JobRetention(max_age_ms=3 * DAY_MS).slack_ms == DAY_MS / 10
    assert JobRetention(max_age_ms=2 * HOUR_MS).slack_ms == HOUR_MS  # an hour at least
    assert JobRetention(max_age_ms=None, max_count=5).slack_ms == DAY_MS
    rules = JobRetention(max_age_ms=3 * DAY_MS, max_count=5)
    assert rules.purge_at(3, NOW) == NOW + 3 * DAY_MS + DAY_MS / 10
    assert rules.purge_at(6, NOW) == NOW + MIN_AGE_MS + DAY_MS / 10
    assert rules.purge_at(0, None) is None
