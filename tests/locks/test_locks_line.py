"""The lock semaphore's pure parts: the line's admission rules, options and the wire format."""

import itertools
import random
from datetime import timedelta

import pytest

from durability.locks import messages as m
from durability.locks.line import Line, NotHolder
from durability.locks.options import (
    InvalidOption,
    check_key,
    check_limit,
    check_name,
    parse_duration_ms,
    parse_ttl_ms,
)

TTL = 30_000


def tokens():
    counter = itertools.count()
    return lambda: f"t{next(counter)}"


def join(line, request_id, now, *, limit=2, wait=10_000, max_hold=None, ttl=TTL):
    return line.join(request_id, limit=limit, ttl_ms=ttl, max_hold_ms=max_hold, now=now, leave_at=now + wait)


def granted_ids(settled):
    return [p.request_id for p in settled.granted]


# -- admission -------------------------------------------------------------------
def test_first_come_first_served_within_the_limit():
    line, new = Line(), tokens()
    for name in "abcd":
        join(line, name, 0)
    settled = line.settle(0, new)
    assert granted_ids(settled) == ["a", "b"]
    assert [w.request_id for w in line.waiters] == ["c", "d"]
    first = line.place_of("a")
    assert line.release(first.token) is first
    assert granted_ids(line.settle(1, new)) == ["c"]


def test_a_place_is_free_only_once_its_lease_has_ended():
    line, new = Line(), tokens()
    join(line, "a", 0, limit=1)
    join(line, "b", 0, limit=1, wait=60_000)
    line.settle(0, new)
    assert granted_ids(line.settle(TTL - 1, new)) == []
    assert line.next_wakeup() == TTL
    settled = line.settle(TTL, new)
    assert [p.request_id for p in settled.expired] == ["a"] and granted_ids(settled) == ["b"]


def test_the_head_blocks_later_waiters_with_larger_limits():
    line, new = Line(), tokens()
    join(line, "a", 0, limit=3)
    join(line, "b", 0, limit=3)
    line.settle(0, new)
    join(line, "small", 1, limit=2)
    join(line, "large", 2, limit=3)
    assert granted_ids(line.settle(2, new)) == []  # 2 held: "small" may not enter; "large" may not pass it
    line.release(line.place_of("a").token)
    assert granted_ids(line.settle(3, new)) == ["small", "large"]
    assert line.held() == 3 and not line.waiters


def test_a_smaller_limit_sends_nobody_away():
    line, new = Line(), tokens()
    for name in "abc":
        join(line, name, 0, limit=3)
    line.settle(0, new)
    join(line, "d", 1, limit=1)
    line.settle(1, new)
    assert line.held() == 3 and [w.request_id for w in line.waiters] == ["d"]
    for name in "ab":
        line.release(line.place_of(name).token)
    assert granted_ids(line.settle(2, new)) == []  # one still holds: a limit of 1 lets none in
    line.release(line.place_of("c").token)
    assert granted_ids(line.settle(3, new)) == ["d"]


def test_a_try_is_admitted_only_at_the_head_and_leaves_at_once():
    line, new = Line(), tokens()
    join(line, "a", 0, limit=1)
    line.settle(0, new)
    join(line, "try", 5, limit=1, wait=0)
    settled = line.settle(5, new)
    assert granted_ids(settled) == [] and [w.request_id for w in settled.left] == ["try"]
    line.release(line.place_of("a").token)
    join(line, "try2", 6, limit=1, wait=0)
    assert granted_ids(line.settle(6, new)) == ["try2"]


def test_a_try_never_jumps_the_line():
    line, new = Line(), tokens()
    join(line, "a", 0, limit=1)
    line.settle(0, new)
    join(line, "waiter", 1, limit=1)
    join(line, "try", 2, limit=2, wait=0)  # its own limit has room, but someone waits before it
    settled = line.settle(2, new)
    assert granted_ids(settled) == [] and [w.request_id for w in settled.left] == ["try"]


def test_waiters_leave_at_their_time_and_a_rejoin_keeps_its_place():
    line, new = Line(), tokens()
    join(line, "a", 0, limit=1)
    line.settle(0, new)
    join(line, "b", 0, limit=1, wait=1_000)
    join(line, "c", 0, limit=1, wait=5_000)
    join(line, "b", 900, limit=1, wait=10_000)  # b calls again: same place in line, more time
    assert line.settle(1_000, new).left == []
    assert [w.request_id for w in line.waiters] == ["b", "c"]
    assert [w.request_id for w in line.settle(5_000, new).left] == ["c"]


def test_renewal_moves_the_lease_and_writes_about_every_other_time():
    line, new = Line(), tokens()
    join(line, "a", 0)
    place = line.settle(0, new).granted[0]
    assert (place.expires_at, place.stored_until) == (TTL, 1.5 * TTL)
    writes = []
    for now in range(10_000, 200_001, 10_000):
        renewed, write = line.renew(place.token, now)
        assert renewed.expires_at == now + TTL <= renewed.stored_until
        writes.append(write)
    assert sum(writes) == 10


def test_renewal_of_an_unknown_or_expired_token_is_refused_and_changes_nothing():
    line, new = Line(), tokens()
    join(line, "a", 0)
    place = line.settle(0, new).granted[0]
    with pytest.raises(NotHolder):
        line.renew("nope", 1)
    with pytest.raises(NotHolder):
        line.renew(place.token, TTL)
    assert line.held() == 1 and place.expires_at == TTL


def test_max_hold_caps_the_lease():
    line, new = Line(), tokens()
    join(line, "a", 0, max_hold=45_000)
    place = line.settle(0, new).granted[0]
    assert place.expires_at == TTL and not place.final
    renewed, _ = line.renew(place.token, 20_000)
    assert renewed.expires_at == 45_000 and renewed.final and renewed.stored_until == 45_000


def test_release_and_cancel_are_idempotent_and_touch_only_their_own():
    line, new = Line(), tokens()
    join(line, "a", 0)
    join(line, "b", 0)
    line.settle(0, new)
    a = line.place_of("a")
    assert line.release(a.token) is a and line.release(a.token) is None
    assert line.held() == 1 and line.place_of("b") is not None
    waiter, place = line.cancel("b")
    assert waiter is None and place.request_id == "b"
    assert line.cancel("b") == (None, None)
    join(line, "c", 1)
    join(line, "d", 1)
    join(line, "e", 1)
    line.settle(1, new)
    waiter, place = line.cancel("e")
    assert waiter.request_id == "e" and place is None and line.held() == 2


def test_a_restarted_line_keeps_the_stored_places():
    line, new = Line(), tokens()
    join(line, "a", 0)
    join(line, "b", 0)
    line.settle(0, new)
    restarted = Line(line.places.values())
    assert restarted.held() == 2 and restarted.place_of("b").token == line.place_of("b").token


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_never_admit_beyond_the_waiters_limit(seed):
    rng = random.Random(seed)
    line, new = Line(), tokens()
    now, names = 0.0, itertools.count()
    order = []
    for _ in range(400):
        now += rng.choice([0, 1, 100, 5_000])
        op = rng.random()
        if op < 0.4:
            name = f"r{next(names)}"
            join(line, name, now, limit=rng.choice([1, 2, 3]), wait=rng.choice([0, 1_000, 50_000]),
                 ttl=rng.choice([1_000, 10_000]))
            order.append(name)
        elif op < 0.6 and line.places:
            line.release(rng.choice(list(line.places)))
        elif op < 0.8 and line.places:
            try:
                line.renew(rng.choice(list(line.places)), now)
            except NotHolder:
                pass
        elif op < 0.85 and order:
            line.cancel(rng.choice(order))
        before = {p.token for p in line.places.values() if p.expires_at > now}
        settled = line.settle(now, new)
        held = len(before)
        for place in settled.granted:
            assert held < place.limit  # admitted by its own limit
            held += 1
        assert all(p.expires_at > now for p in line.places.values())
        positions = [order.index(w.request_id) for w in line.waiters]
        assert positions == sorted(positions)  # the line stays in arrival order
        if line.waiters:
            assert line.held() >= line.waiters[0].limit  # the head is blocked only by its own limit


# -- options -----------------------------------------------------------------------
@pytest.mark.parametrize("text, ms", [("30s", 30_000), ("500ms", 500), ("2m", 120_000), ("1.5h", 5_400_000),
                                      ("1d", 86_400_000), (" 2 s ", 2_000), (30, 30_000), (0.5, 500), (0, 0),
                                      (99, 99_000), (timedelta(seconds=3), 3_000), ("0s", 0)])
def test_durations_are_seconds_and_go_on_as_milliseconds(text, ms):
    assert parse_duration_ms(text, "wait") == ms


@pytest.mark.parametrize("bad", ["-1s", "30", "thirty seconds", "1e3s", "5 sec", "", -5, float("nan"),
                                 float("inf"), True, None, [], "1y", timedelta(seconds=-1), 10**400, 100, 2_500.0])
def test_bad_durations_are_clear_errors(bad):
    with pytest.raises(InvalidOption, match="wait"):
        parse_duration_ms(bad, "wait")


def test_ttl_bounds_and_limits_names_keys():
    assert parse_ttl_ms("100ms") == 100 and parse_ttl_ms(0.1) == 100 and parse_ttl_ms(30) == 30_000
    for bad in (0, "50ms", 0.05, "2d"):
        with pytest.raises(InvalidOption, match="ttl"):
            parse_ttl_ms(bad)
    assert check_limit(1) == 1 and check_limit(1_000) == 1_000
    for bad in (0, 1_001, -3, 2.0, True, "3", None):
        with pytest.raises(InvalidOption, match="limit must be an integer from 1 to 1,000"):
            check_limit(bad)
    for bad in ("", "a:b", 3, "x" * 129):
        with pytest.raises(InvalidOption, match="name"):
            check_name(bad)
    for bad in ("", None, 42, "k" * 513):
        with pytest.raises(InvalidOption, match="key"):
            check_key(bad)


# -- messages ----------------------------------------------------------------------
def acquire(**fields):
    message = {"v": 1, "requestId": "r1", "limit": 3, "ttlMs": 30_000, "waitMs": 0}
    message.update(fields)
    return message


def test_a_good_acquire_parses():
    parsed = m.parse_acquire(acquire(waitMs=50_000, more=True, maxHoldMs=60_000))
    assert (parsed.request_id, parsed.limit, parsed.wait_ms, parsed.more, parsed.max_hold_ms) == (
        "r1", 3, 50_000, True, 60_000)


@pytest.mark.parametrize("fields, code", [
    ({"v": 2}, "unsupported"), ({"v": True}, "unsupported"), ({"requestId": ""}, "invalid_message"),
    ({"requestId": "x" * 129}, "invalid_message"), ({"limit": 0}, "invalid_message"),
    ({"limit": 1_001}, "invalid_message"), ({"limit": 2.5}, "invalid_message"),
    ({"ttlMs": 10}, "invalid_message"), ({"ttlMs": "30s"}, "invalid_message"),
    ({"waitMs": -1}, "invalid_message"), ({"waitMs": 50_001}, "invalid_message"),
    ({"waitMs": float("nan")}, "invalid_message"), ({"more": "yes"}, "invalid_message"),
    ({"maxHoldMs": 0}, "invalid_message"), ({"maxHoldMs": -5}, "invalid_message"),
])
def test_bad_acquires_are_refused_with_a_code(fields, code):
    with pytest.raises(m.ProtocolError) as raised:
        m.parse_acquire(acquire(**fields))
    assert raised.value.code == code
    assert raised.value.reply() == {"type": "error", "v": 1, "code": code, "message": str(raised.value)}


def test_tokens_and_cancels_need_their_identifier():
    assert m.parse_token({"v": 1, "token": "abc"}) == "abc"
    assert m.parse_cancel({"v": 1, "requestId": "r"}) == "r"
    for bad in ({"v": 1}, {"v": 1, "token": 5}, [], "token"):
        with pytest.raises(m.ProtocolError):
            m.parse_token(bad)
