"""The wire formats, both directions: every semaphore message and reply round-trips through its
class unchanged (``parse(to_wire(x)) == x``, ``to_wire(parse(wire)) == wire``, key order kept),
and the semaphore and the locks refuse with one shape."""

import asyncio
import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from durability._common import wire as _wire
from durability.locks import HolderRefused, messages as lock_messages, semaphore
from durability.semaphore import messages as m
from durability.semaphore.messages import (
    Blocked,
    BlockedReason,
    Demand,
    GrantEntry,
    GroupUsage,
    LeaseEntry,
    LeaseOutcome,
    LeaseReport,
    Reply,
    Report,
    ReportOutcome,
    ReportStatus,
    Request,
    Sync,
    Usage,
    WaitingUsage,
)
from support import holders_runtime

EXAMPLES = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def same_bytes(a, b):
    """Equal as the wire carries them: the same keys in the same order, the same values, written
    as JavaScript writes them (a number is a number: ``0`` and ``0.0`` are one value there, and
    parsing a time or a ttl makes a float of it)."""
    return json.dumps(as_js(a)) == json.dumps(as_js(b))


def as_js(value):
    if isinstance(value, dict):
        return {key: as_js(entry) for key, entry in value.items()}
    if isinstance(value, list):
        return [as_js(entry) for entry in value]
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


# -- the wire as today's queue and holder send it, spelled out ------------------------------

REQUEST = {
    "type": "request", "v": 1, "clientId": "shard-1",
    "demand": [{"group": "g", "count": 3, "oldestAt": 1_000.0}],
    "grants": [{"grantId": "g1", "claimed": 2, "released": 1}],
    "wait": 240_000.0, "leases": True, "claims": True, "heardUpTo": 12_000.0,
    "leaseReports": [{"leaseId": "e.1", "group": "g", "permits": 4, "drawn": 2, "released": 1, "stopped": False}],
}
SYNC_GRANTS = {"type": "sync", "v": 1, "clientId": "shard-1",
               "grants": [{"grantId": "g1", "claimed": 2, "released": 2}]}
SYNC_LEASES = {"type": "sync", "v": 1, "clientId": "shard-1",
               "leaseReports": [{"leaseId": "e.1", "group": "g", "permits": 4, "drawn": 4, "released": 4,
                                 "stopped": True}]}
GRANTS = {
    "type": "grants", "v": 1,
    "grants": [{"grantId": "g2", "group": "g", "permits": 2, "claimed": 2, "released": 0,
                "claimDeadline": 21_000.0}],
    "reports": [{"grantId": "g1", "status": "ok", "claimed": 2, "released": 1, "permits": 2}],
    "leases": [{"leaseId": "e.2", "group": "g", "permits": 4, "drawn": 0, "ttlMs": 1_800_000.0,
                "expiresAt": 1_811_000.0, "retired": False, "new": True}],
    "allLeasesListed": True,
    "leaseReports": [{"leaseId": "e.1", "status": "retired", "drawn": 2, "released": 1, "permits": 4}],
    "blocked": [{"group": "h", "reason": "limit", "waiting": 5}],
    "contended": True, "nextRequestAt": 11_000.0, "line": {"g": 900.0},
}
SYNCED = {
    "type": "synced", "v": 1,
    "reports": [{"grantId": "g1", "status": "expired", "claimed": 1, "released": 1, "permits": 1}],
    "leaseReports": [{"leaseId": "e.1", "status": "settled", "drawn": 4, "released": 4, "permits": 4}],
    "contended": False,
    "leases": [{"leaseId": "e.3", "group": "g", "permits": 4, "drawn": 1, "ttlMs": 0, "expiresAt": 5_000.0,
                "retired": True, "new": False}],
    "grants": [],
}


@pytest.mark.parametrize("wire", [REQUEST, SYNC_GRANTS, SYNC_LEASES], ids=["request", "sync", "lease sync"])
def test_each_message_reads_and_writes_back_byte_for_byte(wire):
    parsed = m.parse(wire)
    assert same_bytes(parsed.to_wire(), wire)
    assert type(parsed).parse(wire) == parsed


@pytest.mark.parametrize("wire", [GRANTS, SYNCED], ids=["grants", "synced"])
def test_each_reply_reads_and_writes_back_byte_for_byte(wire):
    assert same_bytes(Reply.parse(wire, wire["type"]).to_wire(), wire)


def test_a_message_of_the_other_kind_is_refused_by_the_class():
    with pytest.raises(m.ProtocolError) as raised:
        Request.parse(SYNC_GRANTS)
    assert raised.value.code == "unsupported"


def test_pacing_is_read_from_a_grants_reply_only():
    assert m.pacing_in(GRANTS) == 11_000.0
    assert m.pacing_in(SYNCED) is None and m.pacing_in({**GRANTS, "nextRequestAt": "soon"}) is None


def test_an_older_queues_outbox_body_reads_as_its_report():
    assert m.queued_grant_report({"key": "k", "grantId": "g1", "claimed": 2, "released": 1}) == Report("g1", 2, 1)
    assert m.queued_grant_report({"key": "k", "leaseId": "e.1"}) is None
    assert m.queued_lease_id({"key": "k", "leaseId": "e.1"}) == "e.1"


# -- every value of every class round-trips --------------------------------------------------

ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
counts = st.integers(0, m.MAX_COUNT)
times = st.floats(0, 2.0**53, allow_nan=False)


def rising(n):
    """``n`` counts in rising order (released <= claimed, released <= drawn <= permits)."""
    return st.lists(counts, min_size=n, max_size=n).map(sorted)


@st.composite
def reports(draw):
    released, claimed = draw(rising(2))
    return Report(draw(ids), claimed, released)


@st.composite
def lease_reports(draw):
    released, drawn, permits = draw(rising(3))
    return LeaseReport(draw(ids), draw(ids), permits, drawn, released, draw(st.booleans()))


def unique(strategy, key):
    return st.lists(strategy, max_size=4, unique_by=key).map(tuple)


demands = st.builds(Demand, ids, counts, times)
requests = st.builds(Request, ids, unique(demands, lambda d: d.group), unique(reports(), lambda r: r.grant_id),
                     st.floats(0, m.MAX_WAIT_MS), st.booleans(), unique(lease_reports(), lambda r: r.lease_id),
                     claims=st.booleans(), heard_up_to=times, wake=st.booleans(), name=st.none() | ids,
                     fallback=st.booleans()).map(
    lambda r: dataclasses.replace(r, name=r.name if r.wake else None, fallback=r.fallback and r.wake))  # (with wake)
syncs = st.builds(Sync, ids, unique(reports(), lambda r: r.grant_id), unique(lease_reports(), lambda r: r.lease_id))

grant_entries = st.builds(GrantEntry, ids, ids, counts, counts, times, counts)
report_outcomes = st.builds(ReportOutcome, ids, st.sampled_from(m.REPORT_STATUSES), counts, counts, counts)
lease_entries = st.builds(LeaseEntry, ids, ids, counts, counts, times, times, st.booleans(), st.booleans())
lease_outcomes = st.builds(LeaseOutcome, ids, st.sampled_from(m.LEASE_STATUSES), counts, counts, counts)
blocked = st.builds(Blocked, ids, st.sampled_from(list(BlockedReason)), counts)


def lists(strategy):
    return st.lists(strategy, max_size=3).map(tuple)


grants_replies = st.builds(Reply, st.just("grants"), lists(report_outcomes), lists(lease_outcomes),
                           lists(lease_entries), st.booleans(), grants=lists(grant_entries), blocked=lists(blocked),
                           next_request_at=st.none() | times, all_leases_listed=st.booleans(),
                           line=st.dictionaries(ids, times, max_size=3),
                           waiting_since=st.dictionaries(ids, st.lists(times, min_size=1, max_size=3).map(
                               lambda at: tuple(sorted(at))), max_size=3), over_limit=st.booleans(),
                           closed_groups=lists(ids))
synced_replies = st.builds(Reply, st.just("synced"), lists(report_outcomes), lists(lease_outcomes),
                           lists(lease_entries), st.booleans(), grants=lists(grant_entries),
                           over_limit=st.booleans(), closed_groups=lists(ids))
limits = st.none() | st.integers(0, 2**53)
usages = st.builds(Usage, limits, limits, counts, counts, counts, counts, counts,
                   st.dictionaries(ids, st.builds(GroupUsage, counts, counts, counts, counts, limits), max_size=3),
                   lists(st.builds(WaitingUsage, ids, st.sampled_from(list(BlockedReason)).map(str), counts, counts)))


def round_trips(value, parse):
    wire = value.to_wire()
    assert parse(wire) == value
    assert same_bytes(parse(wire).to_wire(), wire)
    assert same_bytes(parse(json.loads(json.dumps(wire))).to_wire(), wire)  # as it comes off the wire


@EXAMPLES
@given(message=requests | syncs)
def test_every_message_round_trips(message):
    round_trips(message, m.parse)


@EXAMPLES
@given(reply=grants_replies | synced_replies)
def test_every_reply_round_trips(reply):
    round_trips(reply, lambda wire: Reply.parse(wire, reply.type))


@EXAMPLES
@given(usage=usages)
def test_every_usage_round_trips(usage):
    round_trips(usage, Usage.parse)


def test_statuses_and_reasons_go_out_as_their_plain_strings():
    wire = ReportOutcome("g1", ReportStatus.EXPIRED, 1, 1, 1).to_wire()
    assert same_bytes(wire, {"grantId": "g1", "status": "expired", "claimed": 1, "released": 1, "permits": 1})


# -- the holder's usage, typed and as the wire spells it --------------------------------------

def test_the_holders_typed_usage_is_its_usage_reply():
    with holders_runtime() as runtime:
        async def scenario():
            holder = runtime.env.HOLDER.getByName("holder")
            await holder.permits({"type": "request", "v": 1, "clientId": "a", "claims": True,
                                  "demand": [{"group": "g", "count": 2, "oldestAt": 0}]})
            return await holder.usage(), await holder.usage_info()

        wire, typed = runtime.run(scenario())
    usage = Usage.parse(wire)
    assert json.loads(json.dumps(dataclasses.asdict(usage))) == typed
    assert (usage.outstanding, usage.groups["g"].in_use, usage.grants) == (2, 2, 1)


@pytest.mark.parametrize("closed", ["g", [1], ["g"] * (m.MAX_REPLY_ENTRIES + 1), [""]])
def test_a_reply_closing_groups_names_them_or_is_refused(closed):
    wire = {**Reply("synced", (), (), (), False).to_wire(), "closedGroups": closed}
    with pytest.raises(m.ProtocolError) as raised:
        Reply.parse(wire, "synced")
    assert raised.value.code == "malformed_reply"


def test_a_child_reads_the_oldest_time_alone_from_a_parent_of_the_first_tree():
    wire = {**Reply("grants", (), (), (), True).to_wire(), "waitingSince": {"g": 5.0}}
    assert Reply.parse(wire, "grants").waiting_since == {"g": (5.0,)}
    with pytest.raises(m.ProtocolError):
        Reply.parse({**wire, "waitingSince": {"g": [7.0, 5.0]}}, "grants")  # not oldest first


def test_a_malformed_usage_reply_is_refused():
    with pytest.raises(m.ProtocolError) as raised:
        Usage.parse({"limit": 3, "outstanding": -1})
    assert raised.value.code == "malformed_reply"


# -- one refusal shape ------------------------------------------------------------------------

def test_the_semaphore_and_the_locks_raise_and_send_one_refusal():
    assert m.ProtocolError is lock_messages.ProtocolError is _wire.ProtocolError
    with pytest.raises(_wire.ProtocolError) as sem:
        m.parse({"type": "request", "v": 2, "clientId": "a"})
    with pytest.raises(_wire.ProtocolError) as lock:
        lock_messages.parse_acquire({"v": 2})
    for error in (sem.value, lock.value):
        assert list(error.reply()) == ["type", "v", "code", "message"]
        assert error.reply()["type"] == "error" and error.reply()["code"] == "unsupported"


def test_a_semaphore_client_reads_a_refusal_with_its_code():
    refusal = _wire.ProtocolError("forbidden", "not yours").reply()
    with pytest.raises(m.ProtocolError) as raised:
        Reply.parse(refusal, "grants")
    assert raised.value.code == "forbidden" and "not yours" in str(raised.value)
    assert _wire.ProtocolError.parse({**refusal, "code": 5}).code == "malformed_reply"
    assert _wire.ProtocolError.parse(GRANTS) is None


class OlderLockHolder:
    """A lock holder of the previous release: it refused with ``{"status": "error", ...}``."""

    def getByName(self, name):
        class Stub:
            async def semaphore_acquire(self, message):
                return {"status": "error", "v": 1, "code": "invalid_message", "message": "limit is too high"}

        return Stub()


def test_the_lock_client_reads_a_refusal_from_an_older_holder():
    async def hold():
        async with semaphore(OlderLockHolder(), "uploads", limit=1).hold("u"):
            pass

    with pytest.raises(HolderRefused) as raised:
        asyncio.run(hold())
    assert raised.value.code == "invalid_message" and "limit is too high" in str(raised.value)
    assert lock_messages.refusal(_wire.ProtocolError("not_holder", "gone").reply()).code == "not_holder"


def test_the_lock_client_reads_each_holder_reply_into_one_class():
    reply = lock_messages.HolderReply.parse
    granted = reply(lock_messages.granted("t1", 30_000, False))
    assert (granted.status, granted.token, granted.lease_ms, granted.final) == ("granted", "t1", 30_000, False)
    renewed = reply(lock_messages.renewed(5_000, True))
    assert (renewed.status, renewed.lease_ms, renewed.final) == ("renewed", 5_000, True)
    assert reply(lock_messages.status(lock_messages.TIMEOUT)).status == "timeout"
    # A refusal in this release's shape and the previous one's, and a reply no client knows.
    refusal = _wire.ProtocolError("not_holder", "no such place").reply()
    assert reply(refusal).refused.code == "not_holder"
    assert reply({"status": "error", "code": "unsupported", "message": "v9"}).refused.code == "unsupported"
    assert reply({"what": 1}).refused.code == "unknown"
    for broken in ({"status": "granted", "v": 1, "leaseMs": 1, "final": False},  # no token
                   {"status": "renewed", "v": 1, "leaseMs": -1, "final": False},
                   {"status": "granted", "v": 1, "token": "t", "leaseMs": 1, "final": "yes"}):
        with pytest.raises(_wire.ProtocolError):
            reply(broken)


@pytest.mark.parametrize("flag", ["wake", "fallback"])
def test_a_request_whose_flag_is_not_true_or_false_is_refused(flag):
    with pytest.raises(m.ProtocolError, match="must be true or false"):
        m.parse({**REQUEST, flag: "yes"})
