"""A randomized fault run of lock semaphores: lost, duplicated, delayed calls, holder evictions and
crashes, stalled holders, two opens with different limits; checked against ground truth."""

import asyncio
import random

import pytest

from campaign.checks import overlaps_beyond_limits
from durability.testing import Faults
from support import locks_runtime

KEYS = ["alice", "bob", "carol"]


def test_the_checker_sees_an_overlap():
    holds = [{"id": "a", "key": "k", "limit": 2, "admitted": 0, "start": 0, "end": 10},
             {"id": "b", "key": "k", "limit": 2, "admitted": 1, "start": 1, "end": 10},
             {"id": "c", "key": "k", "limit": 3, "admitted": 2, "start": 2, "end": 5},
             {"id": "d", "key": "k", "limit": 2, "admitted": 3, "start": 3, "end": 4},
             {"id": "e", "key": "other", "limit": 1, "admitted": 3, "start": 3, "end": 4},
             {"id": "f", "key": "k", "limit": 3, "admitted": 4.5, "start": 5, "end": 6},
             # g (limit 1) and h (limit 3) admitted at one instant, g first: h may join g.
             {"id": "g", "key": "t", "limit": 1, "admitted": 7, "start": 7, "end": 9},
             {"id": "h", "key": "t", "limit": 3, "admitted": 7, "start": 7, "end": 9}]
    for seq, hold in enumerate(holds):
        hold["seq"] = seq
    assert overlaps_beyond_limits(holds) == [("d", 2, ["a", "b", "c"]), ("f", 3, ["a", "b", "c"])]
    holds[-2]["seq"], holds[-1]["seq"] = holds[-1]["seq"], holds[-2]["seq"]  # h first: g joined h
    assert ("g", 1, ["h"]) in overlaps_beyond_limits(holds)


def jobs(rng, count):
    for i in range(count):
        job = {"id": f"j{i}", "key": rng.choice(KEYS), "limit": rng.choice([1, 2, 3]), "ttl": "2s",
               "work_ms": rng.choice([0, 300, 1_500, 4_000]), "at": rng.uniform(0, 30_000)}
        kind = rng.random()
        if kind < 0.15:
            job["try"] = True
        elif kind < 0.35:
            job["wait"] = "5s"
        if rng.random() < 0.05:
            job["stall_ms"] = 2_500  # past its lease: it must be told, and its place given on
        if rng.random() < 0.1:
            job["max_hold"] = "2.5s"
        yield job


@pytest.mark.parametrize("seed", range(6))
def test_holders_never_exceed_the_limit_of_the_open_that_admitted_them(seed):
    faults = Faults(lost_request=0.05, lost_reply=0.05, duplicate=0.05, latency_ms=(0, 40), evict=0.03,
                    crash_before_commit=0.03, targets={"Slots"})
    with locks_runtime(seed=seed, faults=faults) as runtime:
        world = runtime.module.WORLD
        rng = random.Random(seed)
        work = list(jobs(rng, 80))

        async def one(job):
            await asyncio.sleep(job.pop("at") / 1000)
            return await runtime.env.UPLOADER.getByName(f"uploader-{rng.randrange(4)}").upload(job)

        async def scenario():
            results = await asyncio.gather(*(one(job) for job in work))
            await asyncio.sleep(10)  # every lease left behind ends
            with runtime.no_faults():
                left = [await runtime.env.SLOTS.getByName(f"uploads:{key}").semaphore_usage() for key in KEYS]
            return results, left

        results, left = runtime.run(scenario())
        holds = [dict(hold, admitted=world["admitted_at"][hold["token"]], seq=world["admission_seq"][hold["token"]])
                 for hold in world["holds"]]
        assert all(hold["admitted"] <= hold["start"] for hold in holds)
        assert overlaps_beyond_limits(holds) == []
        statuses = {}
        for result in results:
            statuses[result["status"]] = statuses.get(result["status"], 0) + 1
        assert set(statuses) <= {"done", "timeout", "busy", "lost"} and statuses.get("done", 0) > 10
        # A holder whose code ran past its lease (a stall did it here) is told.
        outran = {hold["id"] for hold in holds if hold["ran_until"] > hold["end"]}
        for result in results:
            if result["id"] in outran:
                assert result["status"] == "lost", result
        assert [(u["held"], u["waiting"]) for u in left] == [(0, 0)] * len(KEYS)  # nothing leaks
        assert runtime.errors == []
        assert sum(host.stats.evictions for host in runtime.hosts()) > 0
