"""How a holder round's work grows with its clients, counted rather than timed.

A round is pure (``allocation.run_round``, then the line mark of
``holder_line`` for every reply that hands out permits), so the Python lines
it executes are a count that no machine's noise changes. The same contended
workload is driven at two scales, ten times apart, and the lines of one
round at each are counted with ``sys.settrace``; their ratio must stay near
n log n (x14.0 from 300 to 3,000 clients; the round counts about x10).
The round as it stood with a pass per served client over every held request
(the line mark) and over the whole book (its held grants) counted x87.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable

import pytest

from durability.semaphore.holder.pure.allocation import ClientOutcome, Grant, Limits, news_for, run_round
from durability.semaphore.holder.pure.fairness import FairPolicy, Share
from durability.semaphore.holder.pure.line_mark import Line
from durability.semaphore.messages import MAX_DEMAND_TIMES, Demand, Report, Request

GROUPS = [f"g{i:02d}" for i in range(20)]
TIMEOUT_MS = 30_000
ROUND_MS = 2_000.0
T0 = 1_700_000_000_000.0


class Workload:
    """``n`` clients that claim what they are granted and release it a few
    rounds later, on a limit of n: about half of the demand waits."""

    def __init__(self, n: int, seed: int = 1, fair: FairPolicy | None = None) -> None:
        self.rng = random.Random(seed)
        self.fair = fair
        self.limits = Limits(n, {}, {})
        self.book: dict[str, Grant] = {}
        self.queued = {f"c{i:05d}": {} for i in range(n)}  # client -> group -> oldest waiting item times
        self.mine: dict[str, dict[str, list[int]]] = {c: {} for c in self.queued}  # grant -> [claimed, released]
        self.now = T0
        self.ids = (f"g{i:08d}" for i in range(10**9))

    def requests(self) -> list[Request]:
        requests = []
        for client, queued in self.queued.items():
            if self.rng.random() < 0.25:
                for group in self.rng.sample(GROUPS, self.rng.randint(1, 3)):
                    queued.setdefault(group, []).extend(self.now + k for k in range(self.rng.randint(1, 4)))
            for counts in self.mine[client].values():
                if counts[1] < counts[0] and self.rng.random() < 0.4:
                    counts[1] = counts[0]
            # As the queue sends it: the times of its oldest items (the round serves items oldest first).
            demand = tuple(Demand(g, len(items), items[0], tuple(items[:MAX_DEMAND_TIMES]))
                           for g, items in queued.items() if items)
            reports = tuple(Report(gid, c, r) for gid, (c, r) in self.mine[client].items())
            if demand or reports:
                requests.append(Request(client, demand, reports, claims=True, heard_up_to=self.now + TIMEOUT_MS))
        return requests

    def round(self, requests: list[Request]) -> tuple[dict[str, ClientOutcome], list[Request]]:
        result = run_round(self.book, requests, self.limits, self.now, TIMEOUT_MS, lambda: next(self.ids),
                           fair=self.fair)
        result.changes.apply_to(self.book)
        for client, outcome in result.outcomes.items():
            for grant in outcome.new_grants:
                self.mine[client][grant.grant_id] = [grant.permits, 0]
                del self.queued[client][grant.group][:grant.permits]
            settled = {r.grant_id for r in outcome.reports if r.released >= r.permits}
            for grant_id in settled:
                self.mine[client].pop(grant_id, None)
        held = [r for r in requests if result.outcomes[r.client_id].blocked
                and not news_for(r, result.outcomes[r.client_id])]
        return result.outcomes, held

    def settle(self, rounds: int) -> None:
        for _ in range(rounds):
            self.round(self.requests())
            self.now += ROUND_MS


def holder_round(workload: Workload, requests: list[Request]) -> None:
    """What a holder decides in one round: the allocation, then the line mark of every served reply."""
    outcomes, held = workload.round(requests)
    line = Line.of(held, workload.limits)
    for request in requests:
        outcome = outcomes[request.client_id]
        if outcome.new_grants:
            line.ahead_of(request.client_id, (d.group for d in request.demand))


def lines_run(fn: Callable[[], None]) -> int:
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(previous)
    return count


#: a fair-share policy over the groups: four tenants, weights, a floor and two priority classes
FAIR = FairPolicy({g: f"t{i % 4}" for i, g in enumerate(GROUPS)},
                  {"t0": Share(3.0), "t1": Share(1.0, floor=20), "t2": Share(1.0, priority=1), "t3": Share(2.0)})


def lines_per_round(n: int, fair: FairPolicy | None = None) -> tuple[int, int]:
    """Lines one holder round runs at ``n`` clients, once the workload has
    settled, and the requests it served."""
    workload = Workload(n, fair=fair)
    workload.settle(6)
    requests = workload.requests()
    return lines_run(lambda: holder_round(workload, requests)), len(requests)


@pytest.mark.parametrize("fair", [None, FAIR], ids=["oldest_first", "fair_share"])
def test_a_round_grows_as_n_log_n_in_its_clients(fair):
    small, large = 300, 3_000
    lines_small, requests_small = lines_per_round(small, fair)
    lines_large, requests_large = lines_per_round(large, fair)
    # The workload scales with its clients, and demand waits at both scales.
    assert 8 < requests_large / requests_small < 12
    n_log_n = (large * math.log(large)) / (small * math.log(small))
    assert lines_large / lines_small < 1.25 * n_log_n, (lines_small, lines_large, round(n_log_n, 1))
    print(f"lines per round x{lines_large / lines_small:.1f} from {small:,} to {large:,} clients"
          f" (n log n x{n_log_n:.1f})")
