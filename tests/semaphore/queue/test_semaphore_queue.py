"""DurabilitySemaphoreQueue on the embedded runtime, against a real holder."""

import asyncio

import pytest

from durability.testing import Faults, JsException
from support import (
    as_made_before_queue_version_9,
    assert_back_in_line_with_the_release,
    holders_runtime,
    queue_jobs as jobs,
    released_then_evicted,
    served_behind_the_line,
)


@pytest.fixture
def runtime():
    with holders_runtime(seed=1) as rt:
        yield rt


def shard(runtime, name="s1"):
    return runtime.env.SHARD.getByName(name)


def test_items_are_admitted_within_the_limit_oldest_first_and_released(runtime):
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime, "a").submit(jobs("a", 4))
        await asyncio.sleep(0.1)
        await shard(runtime, "b").submit(jobs("b", 4))
        await asyncio.sleep(2)
        early = sorted(world["running"])
        await asyncio.sleep(60)
        return early, await shard(runtime, "a").states(), await runtime.env.HOLDER.getByName("holder").usage()

    early, states, usage = runtime.run(scenario())
    assert early == ["a0", "a1", "a2"]  # the oldest three, all from the first shard
    assert set(states.values()) == {"released"}
    assert world["violations"] == [] and world["max_running"] == 3
    assert len(world["completed"]) == 8 and usage["outstanding"] == 0


def test_enqueue_is_idempotent_by_id_and_refuses_bad_items(runtime):
    async def scenario():
        first = await shard(runtime).submit(jobs("j", 2))
        again = await shard(runtime).submit([{"id": "j0", "key": "holder", "group": "g", "body": {"ms": 9}}])
        errors = []
        for bad in (
            [{"key": "holder", "body": {}}],
            [{"id": "x", "key": "", "body": {}}],
            [{"id": "x", "key": "holder", "body": {"t": {1, 2}}}],
            [{"id": "x", "key": "holder", "body": {"a": 1}}, {"id": "x", "key": "holder", "body": {"a": 2}}],
            [],
        ):
            with pytest.raises(JsException) as caught:
                await shard(runtime).submit(bad)
            errors.append(caught.value.message.strip().splitlines()[-1])
        return first, again, errors, await shard(runtime).states()

    first, again, errors, states = runtime.run(scenario())
    assert first == ["j0", "j1"] and again == ["j0"]
    assert all(e.startswith("ValueError") for e in errors)
    assert set(states) == {"j0", "j1"}  # nothing from the refused calls


def test_cancel_only_while_queued_and_status_carries_the_blocked_reason(runtime):
    async def scenario():
        await shard(runtime).submit(jobs("j", 5, ms=60_000))
        await asyncio.sleep(3)
        queued = await shard(runtime).status("j4")
        admitted = await shard(runtime).status("j0")
        cancelled = await shard(runtime).cancel("j4")
        with pytest.raises(JsException, match="only a queued item can be cancelled"):
            await shard(runtime).cancel("j0")
        return queued, admitted, cancelled, await shard(runtime).status("j4")

    queued, admitted, cancelled, after = runtime.run(scenario())
    assert queued["state"] == "queued" and queued["blocked"] == {"reason": "limit", "waiting": 2}
    assert admitted["state"] == "admitted" and admitted["via"] == "grant" and admitted["blocked"] is None
    assert cancelled is True and after["state"] == "cancelled"


def test_a_claim_holds_the_oldest_items_without_writing_them_until_the_holder_answers(runtime):
    runtime.module.CONFIG["two_phase"] = True  # a holder that grants permits unclaimed
    gate = runtime.module.CONFIG["hold_syncs"] = asyncio.Event()

    async def scenario():
        await shard(runtime).submit(jobs("j", 5, ms=60_000))
        await asyncio.sleep(3)  # granted 3; the claims' sync waits at the gate
        claiming = [(await shard(runtime).status(f"j{i}"))["state"] for i in range(5)]
        with pytest.raises(JsException, match="is claiming: only a queued item can be cancelled"):
            await shard(runtime).cancel("j0")
        await shard(runtime).cancel("j4")
        rows = await shard(runtime).states()
        gate.set()
        await asyncio.sleep(1)
        return claiming, rows, await shard(runtime).states()

    claiming, rows, answered = runtime.run(scenario())
    assert claiming == ["claiming"] * 3 + ["queued"] * 2
    assert rows == {"j0": "queued", "j1": "queued", "j2": "queued", "j3": "queued", "j4": "cancelled"}
    assert answered == {"j0": "admitted", "j1": "admitted", "j2": "admitted", "j3": "queued", "j4": "cancelled"}
    assert runtime.module.WORLD["violations"] == []


def test_items_an_older_version_wrote_as_claiming_are_admitted_when_the_holder_confirms(runtime):
    runtime.module.CONFIG["two_phase"] = True  # a holder that grants permits unclaimed
    gate = runtime.module.CONFIG["hold_syncs"] = asyncio.Event()

    async def scenario():
        await shard(runtime).submit(jobs("j", 5, ms=60_000))
        await asyncio.sleep(3)
        instance = runtime.host_of(shard(runtime)).instance
        [grant] = instance.queue.grants.grants()
        grant = {"grant_id": grant.grant_id, "claimed": grant.claimed}
        # As versions before 4 kept a claim: the grant's row, and the claimed items written as claiming.
        as_made_before_queue_version_9(instance.ctx.storage)
        sql = instance.ctx.storage.sql
        sql.exec("INSERT INTO durability_queue_grants (grant_id, key, grp, permits, claimed, confirmed, released, "
                 "claim_deadline) VALUES (?, 'holder', 'g', 3, 3, 0, 0, ?)", grant["grant_id"], 4e12)
        sql.exec("UPDATE durability_queue_items SET state = 'claiming', grant_id = ?, via = 'grant' "
                 "WHERE id IN ('j1', 'j2', 'j3')", grant["grant_id"])
        await asyncio.sleep(0.01)  # the write commits
        runtime.evict(shard(runtime))
        claiming = [(await shard(runtime).status(f"j{i}"))["state"] for i in range(5)]
        gate.set()
        await asyncio.sleep(5)
        return grant["claimed"], claiming, await shard(runtime).states()

    claimed, claiming, answered = runtime.run(scenario())
    assert claimed == 3 and claiming == ["queued"] + ["claiming"] * 3 + ["queued"]
    assert answered == {"j0": "queued", "j1": "admitted", "j2": "admitted", "j3": "admitted", "j4": "queued"}
    assert runtime.module.WORLD["violations"] == []


def test_a_grant_comes_claimed_and_its_items_are_admitted_on_the_reply(runtime):
    async def scenario():
        await shard(runtime).submit(jobs("j", 4, ms=60_000))
        await asyncio.sleep(3)
        holder = runtime.env.HOLDER.getByName("holder")
        return list(runtime.module.WORLD["messages"]), await shard(runtime).states(), await holder.usage()

    calls, states, usage = runtime.run(scenario())
    assert states == {"j0": "admitted", "j1": "admitted", "j2": "admitted", "j3": "queued"}
    assert "sync" not in calls  # no claim of its own: the reply confirmed them
    assert usage["groups"]["g"]["inUse"] == 3 and usage["grants"] >= 1


def test_a_request_whose_reply_was_lost_is_answered_from_the_listing_not_granted_twice(runtime):
    runtime.module.CONFIG["lose_replies"] = {"request": 1}
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        await shard(runtime).submit(jobs("j", 2, ms=60_000))
        await asyncio.sleep(1.5)
        granted = await holder.usage()  # the first round granted, claimed; its reply was lost
        await asyncio.sleep(10)  # the request is retried: its reply lists the grant
        return granted, await holder.usage(), await shard(runtime).states()

    granted, usage, states = runtime.run(scenario())
    assert granted["outstanding"] == 2
    assert usage["outstanding"] == 2 and usage["grants"] == 1  # the repeat got nothing new
    assert states == {"j0": "admitted", "j1": "admitted"}
    assert runtime.module.WORLD["starts"] == {"j0": 1, "j1": 1}


def test_claims_the_holder_confirmed_are_given_back_when_a_new_instance_hears_of_them_past_their_deadline(runtime):
    # A claim heard of only after the grant's claim deadline may be one an
    # earlier instance used and lost the record of: admitting on it again
    # would reuse a permit under the limit of when it was granted, so it goes
    # back, and the items wait for a grant of their own.
    config = runtime.module.CONFIG
    held = asyncio.Event()
    config["hold_replies"] = {"request": held}
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        await shard(runtime).submit(jobs("j", 2, ms=60_000))
        await asyncio.sleep(3)  # granted 2, claimed; the shard never heard
        runtime.evict(shard(runtime))  # the new instance asks again, and its reply is held too
        await asyncio.sleep(config["grant_timeout_ms"] / 1000 + 1)
        config["hold_replies"] = {}
        held.set()  # the listing reaches the new instance past the grant's claim deadline
        await asyncio.sleep(0.5)
        heard = await shard(runtime).states()
        await asyncio.sleep(10)
        return heard, await shard(runtime).states(), await holder.usage()

    heard, states, usage = runtime.run(scenario())
    assert heard == {"j0": "queued", "j1": "queued"}  # not admitted on the old claims
    assert states == {"j0": "admitted", "j1": "admitted"}  # on a grant of their own
    assert usage["outstanding"] == 2 and usage["grants"] == 1  # the old one went back
    assert runtime.module.WORLD["starts"] == {"j0": 1, "j1": 1}


@pytest.mark.parametrize("two_phase", [False, True])
@pytest.mark.parametrize("cancelled", [0, 2])
def test_claims_the_holder_confirmed_after_the_shard_lost_them_are_taken_up_by_the_next_instance(
        runtime, cancelled, two_phase):
    # No row records a claim: a shard evicted while the holder's confirmation
    # is on its way (the grant's reply, or with a holder that grants
    # unclaimed permits the claim's) learns the claims from the holder's
    # listing, admits its queued items on them, and gives back those it has
    # no item for.
    config = runtime.module.CONFIG
    config["two_phase"] = two_phase
    config["hold_replies"] = {"sync" if two_phase else "request": asyncio.Event()}  # never set
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        await shard(runtime).submit(jobs("j", 3, ms=60_000))
        await asyncio.sleep(3)  # granted 3, claimed; the holder confirmed, the shard never heard
        confirmed = (await holder.usage())["groups"]["g"]["inUse"]
        runtime.evict(shard(runtime))
        config["hold_replies"] = {}
        for i in range(cancelled):
            await shard(runtime).cancel(f"j{2 - i}")
        await shard(runtime).submit(jobs("k", 1, ms=60_000))
        await asyncio.sleep(10)
        return confirmed, await shard(runtime).states(), await holder.usage()

    confirmed, states, usage = runtime.run(scenario())
    assert confirmed == 3
    expected = {"j0": "admitted", "j1": "admitted", "j2": "admitted", "k0": "queued"}
    if cancelled:  # two claims for j0 and k0, and one with no item left: given back
        expected = {"j0": "admitted", "j1": "cancelled", "j2": "cancelled", "k0": "admitted"}
    assert states == expected
    assert usage["outstanding"] == 3 - cancelled // 2
    assert runtime.module.WORLD["starts"] == {i: 1 for i, state in expected.items() if state == "admitted"}
    assert runtime.module.WORLD["violations"] == []


def test_a_refused_claim_lets_its_items_go_back_in_line_and_they_are_admitted_later(runtime):
    runtime.module.CONFIG["two_phase"] = True  # a holder that grants permits unclaimed
    gate = runtime.module.CONFIG["hold_syncs"] = asyncio.Event()
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        await shard(runtime).submit(jobs("j", 2, ms=1_000))
        await asyncio.sleep(3)
        runtime.evict(holder)  # the grant was never claimed there: the new instance does not know it
        gate.set()
        await asyncio.sleep(0.5)
        refused = [(await shard(runtime).status(f"j{i}"))["state"] for i in range(2)]
        await asyncio.sleep(30)
        return refused, await shard(runtime).states(), await holder.usage()

    refused, states, usage = runtime.run(scenario())
    assert refused == ["queued", "queued"]
    assert set(states.values()) == {"released"} and usage["outstanding"] == 0
    assert runtime.module.WORLD["starts"] == {"j0": 1, "j1": 1}


def test_a_grant_the_holder_shrank_is_kept_with_its_new_permits(runtime):
    async def scenario():
        await shard(runtime).submit(jobs("j", 3, ms=60_000))
        await asyncio.sleep(0.5)  # asked for 3; the reply comes with the round
        await shard(runtime).cancel("j1")
        await shard(runtime).cancel("j2")
        await asyncio.sleep(12)  # 1 claimed, 2 left unclaimed past the deadline: reclaimed
        await shard(runtime).submit(jobs("k", 1, ms=60_000))
        await asyncio.sleep(5)
        grants = runtime.host_of(shard(runtime)).instance.queue.grants.grants()
        return [g.permits for g in grants], await shard(runtime).states()

    permits, states = runtime.run(scenario())
    assert 1 in permits  # the first grant, as the holder lists it after the reclaim
    assert states == {"j0": "admitted", "j1": "cancelled", "j2": "cancelled", "k0": "admitted"}


def test_done_items_are_kept_keep_done_ms_then_deleted(runtime):
    runtime.module.CONFIG["keep_done_ms"] = 60_000
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime).submit(jobs("j", 2, ms=1_000))
        await shard(runtime).submit(jobs("c", 1))
        await shard(runtime).cancel("c0")
        await asyncio.sleep(30)
        kept = await shard(runtime).states()
        await shard(runtime).submit(jobs("j", 2, ms=1_000))  # known ids: a no-op
        await asyncio.sleep(30)
        after_resubmit = await shard(runtime).states()
        await asyncio.sleep(60)
        return kept, after_resubmit, await shard(runtime).states(), await shard(runtime).status("j0")

    kept, after_resubmit, purged, status = runtime.run(scenario())
    assert kept == after_resubmit == {"j0": "released", "j1": "released", "c0": "cancelled"}
    assert world["starts"] == {"j0": 1, "j1": 1}
    assert purged == {} and status is None


def test_items_done_before_version_4_are_kept_keep_done_ms_from_the_upgrade(runtime):
    runtime.module.CONFIG["keep_done_ms"] = 60_000

    async def scenario():
        await shard(runtime).submit(jobs("j", 2, ms=1_000))
        await asyncio.sleep(5)
        sql = runtime.host_of(shard(runtime)).instance.ctx.storage.sql
        sql.exec("UPDATE durability_queue_items SET done_at = NULL")  # as version 3 left them
        await asyncio.sleep(0.01)
        runtime.evict(shard(runtime))
        await shard(runtime).status("j0")  # the new instance starts: the upgrade
        await asyncio.sleep(30)
        kept = await shard(runtime).states()
        await asyncio.sleep(60)
        return kept, await shard(runtime).states()

    kept, later = runtime.run(scenario())
    assert kept == {"j0": "released", "j1": "released"} and later == {}


def test_admit_is_retried_until_it_returns_and_registers_each_job_once(runtime):
    runtime.module.CONFIG["admit_failures"] = 2
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime).submit(jobs("j", 2))
        await asyncio.sleep(30)
        return await shard(runtime).states()

    states = runtime.run(scenario())
    assert world["admit_calls"] >= 3
    assert world["starts"] == {"j0": 1, "j1": 1}
    assert set(states.values()) == {"released"}


def test_a_crash_between_admission_and_admit_runs_admit_again_and_registers_once(runtime):
    runtime.module.CONFIG["abort_in_admit"] = 1
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime).submit(jobs("j", 2))
        await asyncio.sleep(30)
        return await shard(runtime).states()

    states = runtime.run(scenario())
    assert world["admit_calls"] >= 2
    assert world["starts"] == {"j0": 1, "j1": 1}
    assert set(states.values()) == {"released"}
    assert runtime.host_of(shard(runtime)).stats.evictions == 1
    # The new instance hands in again what the old one admitted, saying so
    # (a job runner counts the attempt that instance may have begun).
    first, again = world["resumed"][0], world["resumed"][1]
    assert {resumed for _, resumed in first} == {False} and again and {resumed for _, resumed in again} == {True}


def test_lost_claim_replies_are_repaired_by_cumulative_counts():
    runtime = holders_runtime(seed=4, faults=Faults(lost_reply=1.0, targets=frozenset({"Holder"})))
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime).submit(jobs("j", 5, ms=2_000))
        await asyncio.sleep(20)  # every reply from the holder is lost meanwhile
        lost_phase = dict(world["starts"])
        runtime.faults.enabled = False
        await asyncio.sleep(60)
        return lost_phase, await shard(runtime).states(), await runtime.env.HOLDER.getByName("holder").usage()

    lost_phase, states, usage = runtime.run(scenario())
    assert lost_phase == {}  # nothing starts without a confirmed claim
    assert world["violations"] == [] and world["starts"] == {f"j{i}": 1 for i in range(5)}
    assert set(states.values()) == {"released"} and usage["outstanding"] == 0
    runtime.close()


def test_a_lost_release_is_recovered_by_finished(runtime):
    runtime.module.CONFIG.update(lose_releases=1.0, finished_check_ms=5_000)

    async def scenario():
        await shard(runtime).submit(jobs("j", 5, ms=1_000))
        await asyncio.sleep(60)
        return await shard(runtime).states(), await runtime.env.HOLDER.getByName("holder").usage()

    states, usage = runtime.run(scenario())
    assert set(states.values()) == {"released"} and usage["outstanding"] == 0


def test_without_finished_a_lost_release_leaks(runtime):
    runtime.module.CONFIG.update(lose_releases=1.0, use_finished=False)

    async def scenario():
        await shard(runtime).submit(jobs("j", 2, ms=1_000))
        await asyncio.sleep(60)
        return await shard(runtime).states(), await runtime.env.HOLDER.getByName("holder").usage()

    states, usage = runtime.run(scenario())
    assert set(states.values()) == {"admitted"} and usage["outstanding"] == 2


def test_items_are_admitted_from_unclaimed_permits_without_a_request(runtime):
    runtime.module.CONFIG["two_phase"] = True  # a holder that grants permits unclaimed
    async def scenario():
        await shard(runtime).submit(jobs("j", 3, ms=60_000))
        await asyncio.sleep(0.5)
        await shard(runtime).cancel("j2")  # the grant will be sized for it all the same
        await asyncio.sleep(1)
        granted_at = runtime.now_ms()
        requests_before = _requests(runtime)
        await shard(runtime).submit(jobs("late", 1, ms=60_000))
        await asyncio.sleep(0.2)
        return granted_at, requests_before, _requests(runtime), await shard(runtime).status("late0")

    granted_at, before, after, status = runtime.run(scenario())
    assert status["state"] == "admitted"
    assert after == before  # admitted by a claim and its sync, with no new request


def _requests(runtime):
    host = runtime.host_of(runtime.env.HOLDER.getByName("holder"))
    return host.instance.semaphore._last_round_at


def test_a_malformed_or_old_holder_reply_is_refused_without_losing_items(runtime):
    runtime.module.CONFIG["fake_reply"] = {"type": "grants", "v": 0, "grants": "all of them"}

    async def scenario():
        await shard(runtime).submit(jobs("j", 2))
        await asyncio.sleep(10)
        return await shard(runtime).states()

    assert runtime.run(scenario()) == {"j0": "queued", "j1": "queued"}


def _grants_reply(**change):
    grant = {"grantId": "g1", "group": "g", "permits": 2, "claimed": 0, "claimDeadline": 10**13}
    reply = {"type": "grants", "v": 1, "grants": [grant], "reports": [], "leases": [], "leaseReports": [],
             "blocked": [], "contended": False, "nextRequestAt": 0}
    for path, value in change.items():
        target, _, name = path.rpartition("__")
        (grant if target == "grant" else reply)[name] = value
    return reply


@pytest.mark.parametrize("reply", [
    _grant_reply for _grant_reply in (
        _grants_reply(grant__permits=10**400),
        _grants_reply(grant__permits=-2),
        _grants_reply(grant__permits=True),
        _grants_reply(grant__claimDeadline="soon"),
        _grants_reply(grant__claimDeadline=float("nan")),
        _grants_reply(grant__grantId="\ud800"),
        _grants_reply(grant__group=None),
        _grants_reply(nextRequestAt="later"),
        _grants_reply(reports=[{"grantId": "g1", "status": "great", "claimed": 1, "released": 0, "permits": 2}]),
        _grants_reply(leases=[{"leaseId": "l1", "group": "g", "permits": 10**400, "expiresAt": 0}]),
        _grants_reply(blocked=[{"group": "g", "reason": "tired", "waiting": 1}]),
        _grants_reply(contended="yes"),
        _grants_reply(leaseReports="none"),
        _grants_reply(line={"g": "soon"}),
        _grants_reply(line=[1]),
    )
], ids=["huge-permits", "negative-permits", "bool-permits", "text-deadline", "nan-deadline", "surrogate-id",
        "no-group", "text-next-request", "unknown-status", "huge-lease", "unknown-reason", "text-contended",
        "lease-reports-not-a-list", "text-line-mark", "line-not-an-object"])
def test_a_reply_that_breaks_the_format_anywhere_admits_nothing_and_loses_nothing(runtime, reply):
    runtime.module.CONFIG["fake_reply"] = reply

    async def scenario():
        await shard(runtime).submit(jobs("j", 2))
        await asyncio.sleep(10)
        return await shard(runtime).states()

    assert runtime.run(scenario()) == {"j0": "queued", "j1": "queued"}
    assert runtime.module.WORLD["admit_calls"] == 0


def test_a_blocked_key_waits_at_the_holder_instead_of_asking_every_round(runtime):
    world = runtime.module.WORLD

    async def scenario():
        start = runtime.now_ms()
        await shard(runtime, "busy").submit(jobs("b", 3, ms=10_000))
        await asyncio.sleep(2)
        await shard(runtime, "waiting").submit(jobs("w", 2, ms=1_000))
        await asyncio.sleep(30)
        return start

    start = runtime.run(scenario())
    asked = [t for t, client in world["requests"] if client == "waiting"]
    # One request, held by the holder until the busy shard's permits came back
    # (about 12 s in), instead of one every round period.
    assert len(asked) == 1
    assert 11_000 <= world["started"]["w0"] - start <= 16_000


def test_a_key_served_behind_the_line_asks_again_with_its_release_not_before():
    world = served_behind_the_line()
    assert world["vias"]["a0"] == "grant"
    assert_back_in_line_with_the_release(world)


def test_younger_work_queued_out_of_line_waits_for_the_release_too():
    world = served_behind_the_line(later=True)
    asked = [t for t, client in world["requests"] if client == "a"]
    # a2-0, queued while a0 ran, is younger still: a asked next with a0's release.
    assert asked[1] >= world["started"]["a0"] + 5_000
    assert world["started"]["a2-0"] > world["started"]["a1-0"] > world["started"]["c1"]
    assert len(world["completed"]) == 7 and world["violations"] == []


def test_a_key_served_ahead_of_the_line_keeps_its_place():
    runtime = holders_runtime(seed=1)
    runtime.module.CONFIG["limit"] = 1
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime, "a").submit(jobs("a", 2, ms=5_000))
        await asyncio.sleep(0.1)
        await shard(runtime, "b").submit(jobs("b", 2, ms=1_000))
        await asyncio.sleep(30)

    runtime.run(scenario())
    runtime.close()
    asked = [t for t, client in world["requests"] if client == "a"]
    # a1 is older than anything b waits with: a asks again at once to keep
    # its place, and a1 runs next.
    assert len(asked) >= 2 and asked[1] < world["started"]["a0"] + 5_000
    assert world["started"]["a1"] < world["started"]["b0"]


def test_requests_are_paced_by_next_request_at():
    runtime = holders_runtime(seed=1)
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime, "busy").submit(jobs("b", 3, ms=150_000))
        await asyncio.sleep(2)
        await shard(runtime, "waiting").submit(jobs("w", 2, ms=1_000))
        await asyncio.sleep(140)  # each held request is answered empty at its deadline

    runtime.run(scenario())
    asked = [t for t, client in world["requests"] if client == "waiting"]
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert len(asked) >= 2 and min(gaps) >= runtime.module.CONFIG["round_period_ms"]
    runtime.close()


def test_failed_requests_are_retried_with_backoff():
    runtime = holders_runtime(seed=2, faults=Faults(lost_request=1.0, targets=frozenset({"Holder"})))

    async def scenario():
        await shard(runtime).submit(jobs("j", 1))
        await asyncio.sleep(60)

    runtime.run(scenario())
    times = [t for t, _, event, detail in runtime.trace if event == "lost request" and detail == "permits"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 4 and gaps[0] < gaps[-1]  # backing off, not hammering
    runtime.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_end_to_end_under_faults(seed):
    faults = Faults(lost_request=0.1, lost_reply=0.1, duplicate=0.1, latency_ms=(0, 60), evict=0.05,
                    crash_before_commit=0.02, alarm_failure=0.05, duplicate_alarm=0.05)
    runtime = holders_runtime(seed=seed, faults=faults)
    config, world = runtime.module.CONFIG, runtime.module.WORLD
    config.update(limit=4, lose_releases=0.1, finished_check_ms=10_000, grant_timeout_ms=5_000)
    names = [f"shard-{i}" for i in range(5)]

    async def scenario():
        with runtime.no_faults():
            for n, name in enumerate(names):
                await shard(runtime, name).submit(
                    jobs(f"{name}/", 8, ms=1_000 + 500 * n, group=f"wf{n % 2}"))
        await asyncio.sleep(180)
        runtime.faults.enabled = False
        await asyncio.sleep(240)
        with runtime.no_faults():
            states = {name: await shard(runtime, name).states() for name in names}
            return states, await runtime.env.HOLDER.getByName("holder").usage()

    states, usage = runtime.run(scenario())
    assert world["violations"] == []
    assert world["max_running"] == 4
    assert all(count == 1 for count in world["starts"].values())  # no job ran twice
    assert len(world["completed"]) == 40
    assert all(set(s.values()) == {"released"} for s in states.values())
    assert usage["outstanding"] == len(world["running"]) == 0  # no leaked permit
    assert runtime.totals()["evictions"] > 0
    runtime.close()


def test_an_evicted_shard_keeps_the_pacing_the_holder_asked_for():
    runtime = holders_runtime(seed=1)

    async def scenario():
        await shard(runtime, "busy").submit(jobs("b", 3, ms=150_000))
        await asyncio.sleep(2)
        await shard(runtime, "waiting").submit(jobs("w", 1, ms=1_000))
        await asyncio.sleep(60)  # its request was held, answered empty, and asked again
        runtime.evict(shard(runtime, "waiting"))
        evicted_at = runtime.now_ms()
        next_at, kept = await shard(runtime, "waiting").pacing("holder")
        return evicted_at, next_at, kept

    evicted_at, next_at, kept = runtime.run(scenario())
    period = runtime.module.CONFIG["round_period_ms"]
    assert kept == period  # written once, in whole seconds
    assert next_at >= evicted_at + period  # the new instance does not ask early
    runtime.close()


def test_finished_is_asked_about_each_item_its_interval_after_admit_returned():
    runtime = holders_runtime(seed=1)
    config, world = runtime.module.CONFIG, runtime.module.WORLD
    config.update(finished_check_ms=10_000, lose_releases=1.0)

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=1_000))
        await asyncio.sleep(4)
        await shard(runtime).submit(jobs("b", 1, ms=1_000))
        await asyncio.sleep(40)
        return await shard(runtime).states()

    states = runtime.run(scenario())
    assert states == {"a0": "released", "b0": "released"}  # every release lost: finished() returned both
    first_ask = {}
    for at, ids in world["finished_asks"]:
        for item in ids:
            first_ask.setdefault(item, at)
    for item in ("a0", "b0"):  # admit() returns at once here
        assert first_ask[item] - world["started"][item] == pytest.approx(10_000, abs=50)
    runtime.close()


def test_a_release_not_yet_reported_when_its_shard_is_evicted_still_reaches_the_holder(runtime):
    # A grant's report is its row: no outbox row holds it. The new instance
    # reports every grant with releases again (the report waited
    # report_delay_ms, 1 s).
    async def outstanding():
        return (await runtime.env.HOLDER.getByName("holder").usage())["outstanding"]

    async def scenario():
        before, after = await released_then_evicted(runtime, shard(runtime), outstanding, 10)
        return before, after, await shard(runtime).states()

    before, after, states = runtime.run(scenario())
    assert before == 1 and after == 0 and states == {"a0": "released"}


def test_a_read_starts_a_new_instance_s_asks_for_its_registered_keys(runtime):
    # keep_done_ms=0: a released item leaves its key's pacing row, and a new
    # instance asks once about every key it registers (it may hold grants no
    # row records); that first ask drops the row of a key that holds nothing.
    # A read is enough to start it, as a write is.
    runtime.module.CONFIG["keep_done_ms"] = 0

    def keys():
        sql = runtime.host_of(shard(runtime)).instance.ctx.storage.sql
        return [r["key"] for r in sql.exec("SELECT key FROM durability_queue_pacing").toArray()]

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=1_000))
        await asyncio.sleep(10)
        registered = keys()
        runtime.evict(shard(runtime))
        await shard(runtime).states()  # a read starts the new instance
        await asyncio.sleep(600)
        return registered, keys()

    registered, left = runtime.run(scenario())
    assert registered == ["holder"] and left == []


@pytest.mark.parametrize("evicted", [False, True])
def test_without_kept_done_items_a_release_deletes_its_item_and_still_reaches_the_holder(runtime, evicted):
    # keep_done_ms=0: the release deletes the item (one write, not two); the
    # key's pacing row tells a new instance to ask, and the holder's listing
    # gives back the grant's claims, counted as released.
    runtime.module.CONFIG["keep_done_ms"] = 0
    holder = runtime.env.HOLDER.getByName("holder")

    async def outstanding():
        return (await holder.usage())["outstanding"]

    async def scenario():
        if evicted:
            before, after = await released_then_evicted(runtime, shard(runtime), outstanding, 10)
        else:
            await shard(runtime).submit(jobs("a", 1, ms=5_000))
            await asyncio.sleep(3)
            before = await outstanding()
            await asyncio.sleep(10)
            after = await outstanding()
        def keys():
            sql = runtime.host_of(shard(runtime)).instance.ctx.storage.sql
            return [r["key"] for r in sql.exec("SELECT key FROM durability_queue_pacing").toArray()]

        kept = keys()
        runtime.evict(shard(runtime))
        await shard(runtime).submit(jobs("b", 1, ms=1_000, key="other"))  # the next instance starts
        await asyncio.sleep(10)
        return before, after, await shard(runtime).states(), kept, keys()

    before, after, states, kept, later = runtime.run(scenario())
    assert before == 1 and after == 0
    assert states == {}  # nothing kept: the items are gone
    # The key's row stays while anything may be held there; the first ask of
    # an instance that finds the key holding nothing drops it.
    assert kept == ["holder"] and later == ["other"]
    assert runtime.module.WORLD["starts"] == {"a0": 1, "b0": 1}
