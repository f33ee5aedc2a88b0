"""The demo's workload as a list of arrivals, so that several systems get exactly the same one.

Lives here: ``arrivals(seed, jobs, accounts)``: bursts of 5 to 60 jobs
every 1 to 8 s, each for a random account and workflow, working 1 to 30 s
(or 100 ms to 2 s with ``short``), 5% failing; the accounts' limits; and
the shard a job goes to. Must not know: any system that runs them.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

LIMITS = [3, 5, 8, 4, 6, 2]


@dataclass(frozen=True)
class Arrival:
    at_ms: float  #: after the start of the run
    job: dict  #: {id, account, workflow, work_ms, fail}


def arrivals(seed: int, jobs: int, accounts: list[str], short: bool = False) -> list[Arrival]:
    rng = random.Random(seed)
    found, at = [], 0.0
    while len(found) < jobs:
        for _ in range(min(jobs - len(found), rng.randint(5, 60))):
            work_ms = rng.randint(100, 2_000) if short else rng.randint(1_000, 30_000)
            job = {"id": f"job-{len(found):05d}", "account": rng.choice(accounts),
                   "workflow": f"wf-{rng.randint(0, 2)}", "work_ms": work_ms, "fail": rng.random() < 0.05}
            found.append(Arrival(at, job))
        at += rng.uniform(1_000, 8_000)
    return found


def limits_of(accounts: list[str]) -> dict[str, int]:
    return dict(zip(accounts, LIMITS))


def shard_of(job_id: str, shards: int) -> str:
    """The example Worker's own placement (``entry._shard``)."""
    return f"shard-{zlib.crc32(job_id.encode()) % shards}"


class LostReleases:
    """Lose the application's release of a share of jobs on every path it
    takes (each ``release()`` call for a chosen job does nothing, and each
    ``release_keeping()`` answers that it kept nothing, so the job's runner
    keeps its outcome in a row of its own), so that only the queue's
    ``finished()`` sweep can return their permits.

    Use it as a context manager around the run: it patches the queue class
    the example Worker uses and puts it back after.
    """

    def __init__(self, queue_class: type, rate: float, rng: random.Random) -> None:
        self.queue_class, self.rate, self.rng = queue_class, rate, rng
        self.chosen: dict[str, bool] = {}  #: job id -> its releases are lost
        self._real: tuple | None = None

    @property
    def lost(self) -> int:
        """Jobs whose release was asked for and lost."""
        return sum(self.chosen.values())

    def _lost(self, item_id: str) -> bool:
        if item_id not in self.chosen:
            self.chosen[item_id] = self.rng.random() < self.rate
        return self.chosen[item_id]

    def __enter__(self) -> LostReleases:
        real, real_keeping = self._real = self.queue_class.release, self.queue_class.release_keeping
        lost = self._lost

        async def release(queue, item_id):
            if lost(item_id):
                return True  # the caller believes it released; the permit is still out
            return await real(queue, item_id)

        def release_keeping(queue, item_id, record):
            if lost(item_id):
                return False  # nothing kept: the caller keeps the outcome itself; the permit is still out
            return real_keeping(queue, item_id, record)

        self.queue_class.release, self.queue_class.release_keeping = release, release_keeping
        return self

    def __exit__(self, *exc) -> None:
        assert self._real is not None
        self.queue_class.release, self.queue_class.release_keeping = self._real
