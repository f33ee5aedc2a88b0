"""The queue's pure decisions (semaphore/queue/pure/core.py), without any runtime."""

import pytest
from hypothesis import given, strategies as st

from durability.semaphore.messages import NOT_FOUND, OK, GrantEntry, ReportOutcome
from durability.semaphore.queue.pure.core import may_leave_line, pacing_interval, report_due, settle, usable_claims
from durability.semaphore.queue.pure.states import (
    ADMITTED,
    CANCELLED,
    CLAIMING,
    GONE,
    PER_KEY,
    QUEUED,
    RELEASED,
    TRANSITIONS,
    LocalGrant,
    TimerKind,
    move,
    parse_timer_key,
    timer_key,
)

STATES = [QUEUED, CLAIMING, ADMITTED, RELEASED, CANCELLED, GONE]


def grant(permits=2, claimed=0, confirmed=0, released=0):
    return LocalGrant("g1", "k", "default", permits, claimed, confirmed, released, 10_000.0)


def outcome(status=OK, claimed=0, released=0, permits=2):
    return ReportOutcome("g1", status, claimed, released, permits)


def test_the_life_cycle_allows_only_its_transitions():
    allowed = {(a, b) for a in STATES for b in STATES if b in TRANSITIONS[a]}
    assert allowed == {(QUEUED, ADMITTED), (QUEUED, CANCELLED), (CLAIMING, ADMITTED), (CLAIMING, QUEUED),
                       (ADMITTED, RELEASED), (ADMITTED, GONE), (RELEASED, GONE), (CANCELLED, GONE)}
    for a in STATES:
        for b in STATES:
            if (a, b) in allowed:
                assert move(a, b) == b
            else:
                with pytest.raises(ValueError):
                    move(a, b)


def test_a_confirmed_claim_admits_and_a_settled_grant_is_forgotten():
    claimed = settle(grant(permits=1, claimed=1), outcome(claimed=1, permits=1))
    assert (claimed.admit, claimed.requeue, claimed.forget) == (1, 0, False)
    assert claimed.grant.confirmed == 1
    released = settle(grant(permits=1, claimed=1, confirmed=1, released=1), outcome(claimed=1, released=1, permits=1))
    assert released.forget


def test_claims_beyond_the_permits_the_holder_says_go_back_in_line():
    result = settle(grant(permits=3, claimed=3), outcome(claimed=1, permits=1))  # reclaimed down to 1
    assert (result.admit, result.requeue) == (1, 2)
    assert (result.grant.claimed, result.grant.confirmed, result.grant.permits) == (1, 1, 1)


def test_a_grant_the_holder_forgot_confirms_nothing_more():
    result = settle(grant(claimed=2, confirmed=1), outcome(status=NOT_FOUND, claimed=0, permits=0))
    assert (result.admit, result.requeue) == (0, 1)
    assert result.grant.permits == 2 and not result.forget  # one confirmed item still runs here


@given(permits=st.integers(0, 5), claimed=st.integers(0, 5), confirmed=st.integers(0, 5),
       released=st.integers(0, 5), status=st.sampled_from([OK, NOT_FOUND, "expired", "forbidden"]),
       heard_claimed=st.integers(0, 8), heard_permits=st.integers(0, 5))
def test_settling_never_moves_counts_back_or_past_what_was_claimed(permits, claimed, confirmed, released, status,
                                                                    heard_claimed, heard_permits):
    confirmed = min(confirmed, claimed)
    released = min(released, confirmed)
    before = grant(permits, claimed, confirmed, released)
    result = settle(before, outcome(status, heard_claimed, released, heard_permits))
    after = result.grant
    assert before.confirmed <= after.confirmed <= after.claimed <= before.claimed
    assert result.admit == after.confirmed - before.confirmed >= 0
    assert result.admit + result.requeue == before.claimed - before.confirmed - (after.claimed - after.confirmed)
    assert after.released == before.released


def test_a_report_is_due_for_unconfirmed_claims_or_unheard_releases():
    assert report_due(grant(claimed=1), heard_released=0)
    assert not report_due(grant(claimed=1, confirmed=1), heard_released=0)
    assert report_due(grant(claimed=1, confirmed=1, released=1), heard_released=0)
    assert not report_due(grant(claimed=1, confirmed=1, released=1), heard_released=1)


def test_pacing_is_kept_in_whole_seconds_rounded_up():
    assert [pacing_interval(ms) for ms in (-5, 0, 1, 1_999.5, 2_000, 2_000.2)] == [0, 0, 1_000, 2_000, 2_000, 3_000]


@pytest.mark.parametrize("line, left, leaves", [
    ({"g": 100.0}, {"g": 150.0}, True),  # behind the mark: others' work comes first
    ({"g": 100.0}, {"g": 100.0}, True),  # as old as the mark: a tie is no one's turn before another's
    ({"g": 100.0}, {"g": 99.0}, False),  # older than the mark: its turn may come before its release
    ({"g": 100.0}, {"g": 150.0, "h": 150.0}, False),  # a group with no mark keeps the key in line
    ({"g": 100.0, "h": 200.0}, {"g": 150.0, "h": 150.0}, False),
    ({"g": 100.0, "h": 100.0}, {"g": 150.0, "h": 150.0}, True),
    ({}, {"g": 150.0}, False),  # an older holder sends no line
    ({"g": 100.0}, {}, False),  # nothing left waiting: nothing to ask for either way
])
def test_a_served_key_leaves_the_line_only_behind_the_mark_in_every_group(line, left, leaves):
    assert may_leave_line(line, left) is leaves


def test_timer_keys_spell_their_kind_and_read_back():
    for kind in TimerKind:
        key = "acct:1" if kind in PER_KEY else None
        spelled = timer_key(kind, key)
        assert parse_timer_key(spelled) == (kind, key)
    assert timer_key(TimerKind.PUMP, "k") == "pump:k" and timer_key(TimerKind.ADMIT) == "admit"  # as older instances
    for wrong in ("pump", "admit:k", "nothing"):
        with pytest.raises(ValueError):
            parse_timer_key(wrong)
    with pytest.raises(ValueError):
        timer_key(TimerKind.REPORT)


def test_claims_no_item_here_counts_are_used_only_when_no_other_instance_can_have_used_them():
    deadline, now = 2_000.0, 1_000.0
    fresh = LocalGrant("g1", "k", "g", 2, 0, 0, 0, deadline)  # heard of for the first time

    def entry(claimed, released=0, new=None):
        return GrantEntry("g1", "g", 2, claimed, deadline, released, new)

    assert usable_claims(entry(2, new=True), fresh, 2, now) == 2  # a round's new grant, claimed for this request
    assert usable_claims(entry(2), fresh, 2, now) == 2  # an older holder, which does not say
    # Listed before: an earlier instance may have used them, its releases on the way.
    assert usable_claims(entry(2, new=False), fresh, 2, now) == 0
    assert usable_claims(entry(2, released=1, new=True), fresh, 2, now) == 1  # a release heard there: gone
    assert usable_claims(entry(2, new=True), fresh, 2, deadline + 1) == 0  # past the claim deadline
    # This instance's own claims, answered by a listing before their report's reply: used.
    own = LocalGrant("g1", "k", "g", 2, 1, 0, 0, deadline)
    assert usable_claims(entry(2, new=False), own, 2, now) == 1
