"""The line mark a grants reply carries: how far back the holder's line stands behind a client it served, pure.

Lives here: ``Line``, taken once per round from the requests the holder
holds over, and read once per served client (``Line.ahead_of``). Both are
cheap: building it is one pass over the held requests and a partial sort
per group, reading it costs a lookup per group the client asked for, so a
round stays O(n log n) in its clients however many it serves.
Must not know: storage, RPC, clocks, or how the round allocates.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from ...messages import Request
from .allocation import Limits, ResolutionFailed, budgets_for
from .leases import LeasePolicy


@dataclass(frozen=True)
class Mark:
    """A group's line: the oldest-item times of its k-th and (k+1)-th oldest
    waiting clients (None: only k wait), k the permits it may use at once."""

    kth: float
    after: float | None


@dataclass(frozen=True)
class Line:
    """The line in every group that has at least k clients waiting with a request held over."""

    marks: dict[str, Mark]
    waiting: dict[tuple[str, str], float]  #: (group, client) -> its oldest waiting item

    @classmethod
    def of(cls, held: Iterable[Request], limits: Limits, policy: LeasePolicy | None = None) -> Line:
        """A client is counted once per group, and only where it may be
        granted (``can_grant`` did not refuse it): work that cannot be
        served is ahead of no one."""
        waiting: dict[tuple[str, str], float] = {}
        for request in held:
            for demand in request.demand:
                if limits.permitted.get((request.client_id, demand.group), True):
                    waiter = (demand.group, request.client_id)
                    waiting[waiter] = min(demand.oldest_at, waiting.get(waiter, demand.oldest_at))
        times: dict[str, list[float]] = {}
        for (group, _), at in waiting.items():
            times.setdefault(group, []).append(at)
        marks = {}
        for group, ages in times.items():
            k = permits_at_once(group, limits, policy)
            if 0 < k <= len(ages):
                oldest = heapq.nsmallest(k + 1, ages)
                marks[group] = Mark(oldest[k - 1], oldest[k] if len(oldest) > k else None)
        return cls(marks, waiting)

    def ahead_of(self, client_id: str, groups: Iterable[str]) -> dict[str, float]:
        """Per group of ``groups``, the oldest-item time of the k-th oldest of
        the other clients waiting there; groups with fewer than k others are
        left out.

        A client whose next item is no older than that has at least k items
        of others ahead of it: about one job's length of releases (every
        permit turning over once) before its turn. It may wait for its own
        next release to ask again, instead of holding a request the whole
        time (``queue/pure/core.may_leave_line``). Only the groups it asked for
        are given: it leaves the line only if every group it waits in has a
        mark, and a group it did not ask for has no item of its in line.
        """
        line = {}
        for group in groups:
            mark = self.marks.get(group)
            if mark is None:
                continue
            own = self.waiting.get((group, client_id))
            # Without the client's own entry the k-th oldest moves one on
            # when its entry was among the k oldest, and stays otherwise.
            if own is None or own > mark.kth:
                line[group] = mark.kth
            elif mark.after is not None:
                line[group] = mark.after
        return line


def permits_at_once(group: str, limits: Limits, policy: LeasePolicy | None) -> int:
    """The permits a group may use at once: the ceiling the lease policy
    sets, or the group's own limit if lower (0: its limits did not resolve)."""
    budgets = budgets_for(policy, limits.total)
    own = limits.groups.get(group)
    if budgets is None or isinstance(own, ResolutionFailed):
        return 0
    return budgets.ceiling if own is None else min(budgets.ceiling, own)
