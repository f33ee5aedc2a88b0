"""A budget tree's pure rules: which holder a client reaches, and what a child holder borrowed.

Lives here: the names of a tree's holders (``holder_for``, ``parent_of``),
the stable choice of a child for a client id, the beat its holders' rounds
keep (``beat_phase``, ``on_beat``), and ``Borrowed``: the grants a
child holder holds from its parent, what they let it hand out per group,
what it gives back, and the cumulative reports that say so.
Must not know: storage, RPC, clocks, or how a round allocates.

A child is a client of its parent that takes what it is granted (its
grants come claimed), and a holder to its own clients, within what it
holds. The parent counts a child's grant until the child reports it
released, as it counts any client's: a child cut off or restarted keeps its
budget counted at the parent, and the sum of what a parent lent never
exceeds its own limit. A child hands out no more than it holds, and gives
back only permits none of its clients holds, so ground truth never
exceeds the root's limit.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ...holder.pure.allocation import ClientOutcome, ResolutionFailed
from ...messages import (
    GROUP_LIMIT,
    LIMIT,
    MAX_COUNT,
    MAX_DEMAND_ENTRIES,
    MAX_DEMAND_TIMES,
    MAX_ID_LENGTH,
    MAX_REPORTS,
    MAX_TREE_DEMAND_TIMES,
    NOT_FOUND,
    Demand,
    GrantEntry,
    Report,
    ReportOutcome,
    Request,
)

CHILD_MARK = "~child-"  #: a child holder's name is its parent's, this, and its index
MAX_FAN_OUT = 1_024
MAX_DEPTH = 4


def check_shape(fan_out: int, depth: int) -> None:
    for value, name, most in ((fan_out, "fan_out", MAX_FAN_OUT), (depth, "depth", MAX_DEPTH)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{name} must be an int from 1 to {most}, not {value!r}")
    if fan_out == 1:
        raise ValueError("fan_out must be at least 2: one child per parent spreads nothing")


def holder_for(key: str, client_id: str, fan_out: int, depth: int = 1) -> str:
    """The name of the leaf holder that serves ``client_id`` under ``key``:
    the same for every caller and every process (a hash of the id, not
    Python's ``hash``, which changes per process)."""
    number = int.from_bytes(hashlib.blake2b(client_id.encode(), digest_size=8).digest(), "big")
    name = key
    for _ in range(depth):
        name += f"{CHILD_MARK}{number % fan_out}"
        number //= fan_out
    return name


def parent_of(name: str) -> str | None:
    """The parent of a child holder's name; None for a name that is no child's."""
    parent, mark, index = name.rpartition(CHILD_MARK)
    if not mark or not parent or not index.isdigit() or str(int(index)) != index:
        return None
    return parent


def key_of(name: str) -> str:
    """The key a tree's holder ``name`` serves, as its clients know it: its root's name."""
    for _ in range(MAX_DEPTH):
        parent = parent_of(name)
        if parent is None:
            break
        name = parent
    return name


def depth_of(name: str) -> int:
    """How many levels below its root the holder ``name`` is (0: the root)."""
    depth = 0
    while (name := parent_of(name) or "") and depth <= MAX_DEPTH:
        depth += 1
    return depth


def beat_phase(name: str, period_ms: float) -> float:
    """Where in each period a tree's holder runs its rounds (``on_beat``):
    a parent half a period after its children, so that what a child asked
    for right after its round is at the parent's next round, and what the
    parent lent there reaches the child half a period before its own. The
    leaves of a one-level tree are at 0, its root at a half; a level down
    alternates."""
    return 0.0 if depth_of(name) % 2 else period_ms / 2


def on_beat(at: float, period_ms: float, phase_ms: float) -> float:
    """The first beat (a time ``phase_ms`` past a whole number of periods
    since the epoch) at or after ``at``. Every holder of a tree keeps the
    same beats by its clock, without a message: clocks a few milliseconds
    apart only move the beats as much."""
    periods = math.ceil((at - phase_ms) / period_ms - 1e-6)  # a beat a rounding error away is this one
    return periods * period_ms + phase_ms


def longest_key(depth: int) -> int:
    """The longest key a tree of ``depth`` can name children for."""
    return MAX_ID_LENGTH - depth * (len(CHILD_MARK) + len(str(MAX_FAN_OUT - 1)))


def left_waiting(requests: Iterable[Request], outcomes: dict[str, ClientOutcome],
                 ) -> Iterator[tuple[str, Demand, int]]:
    """(client, its demand, the count left waiting) for each demand of each
    client's latest request that a round left waiting for capacity."""
    latest = {request.client_id: request for request in requests}
    for client_id, request in latest.items():
        outcome = outcomes.get(client_id)
        if outcome is None:
            continue  # refused
        for demand in request.demand:
            blocked = outcome.blocked.get(demand.group)
            if blocked is not None and blocked[0] in (LIMIT, GROUP_LIMIT):
                yield client_id, demand, blocked[1]


def unmet_demand(requests: Iterable[Request], outcomes: dict[str, ClientOutcome]) -> dict[str, Demand]:
    """Per group, what a round left waiting for capacity, as one demand for
    the parent: the count left waiting, and the enqueue times of its oldest
    items (each client's youngest items are the ones left; at most the
    ``MAX_DEMAND_ENTRIES`` oldest groups: one request carries no more)."""
    counts: dict[str, int] = {}
    times: dict[str, list[float]] = {}
    for _, demand, count in left_waiting(requests, outcomes):
        counts[demand.group] = counts.get(demand.group, 0) + count
        times.setdefault(demand.group, []).extend(_left_times(demand, count))
    oldest = {group: heapq.nsmallest(MAX_TREE_DEMAND_TIMES, at) for group, at in times.items()}
    groups = sorted(counts, key=lambda group: (oldest[group][0], group))[:MAX_DEMAND_ENTRIES]
    return {group: Demand(group, min(counts[group], MAX_COUNT), oldest[group][0], tuple(oldest[group]))
            for group in groups}


def _left_times(demand: Demand, left: int) -> tuple[float, ...]:
    """The times of a demand's ``left`` youngest items that its times name,
    or the last time it names (the rest stand there)."""
    known = demand.times[demand.count - left:]
    return known or ((demand.times or (demand.oldest_at,))[-1],)


def waiting_before(demands: Iterable[Demand], cutoff: float) -> int:
    """How many items of ``demands`` have waited since ``cutoff`` or
    earlier. A demand names the times of its oldest items only; when all
    it names are that old, its items past them are counted too (they came
    after the last one named, and a round treats them as at its time)."""
    count = 0
    for demand in demands:
        times = demand.times or (demand.oldest_at,)
        named = bisect.bisect_right(times, cutoff)
        count += demand.count if named == len(times) else named
    return count


def oldest_of_both(here: dict[str, tuple[float, ...]],
                   above: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """Per group, the ``MAX_DEMAND_TIMES`` oldest of two lists of the oldest
    items waiting (each oldest first): a holder's other children's, and
    those its parent said wait elsewhere in the tree."""
    return {group: tuple(heapq.nsmallest(MAX_DEMAND_TIMES, here.get(group, ()) + above.get(group, ())))
            for group in sorted(set(here) | set(above))}


class OldestWaiting:
    """Per group, the oldest items a round left waiting for capacity, with
    their clients: enough to tell each client the ``MAX_DEMAND_TIMES``
    oldest waiting at clients other than itself."""

    def __init__(self, requests: Iterable[Request], outcomes: dict[str, ClientOutcome]) -> None:
        entries: dict[str, list[tuple[float, str]]] = {}
        for client_id, demand, count in left_waiting(requests, outcomes):
            entries.setdefault(demand.group, []).extend((at, client_id) for at in _left_times(demand, count))
        # A client's own items are at most MAX_TREE_DEMAND_TIMES of them: twice as many leave enough of others'.
        self.oldest = {group: heapq.nsmallest(2 * MAX_TREE_DEMAND_TIMES, items) for group, items in entries.items()}

    def others(self, client_id: str, groups: Iterable[str]) -> dict[str, tuple[float, ...]]:
        """Per group of ``groups``, the oldest items left waiting by other clients, oldest first."""
        since = {}
        for group in groups:
            times = [at for at, other in self.oldest.get(group, ()) if other != client_id][:MAX_DEMAND_TIMES]
            if times:
                since[group] = tuple(times)
        return since


@dataclass
class Loan:
    """One grant a child holds from its parent: ``permits`` claimed, ``released`` given back."""

    grant_id: str
    group: str
    permits: int
    released: int
    confirmed: int  #: the releases the parent said it heard

    @property
    def held(self) -> int:
        return self.permits - self.released


FORGOTTEN = 4_096  #: settled loan ids remembered, so that a late listing of one does not bring it back


@dataclass
class Borrowed:
    """What a child holder holds from its parent, per group.

    A loan gets a row (``store``) once something of it is given back,
    written before the report that says so leaves: a new instance never
    counts on a permit its old one gave back, even one whose report is still
    on its way. Of the others the parent's count is the truth, and a new
    instance learns them from the parent's next reply (every reply lists a
    client's held grants). A loan
    the parent settled is forgotten, and a listing of it that was already
    on its way when it settled is ignored (``forgotten``).
    """

    loans: dict[str, Loan] = field(default_factory=dict)
    heard_up_to: float = 0.0  #: the latest claim deadline among the grants heard of
    heard: bool = False  #: a reply from the parent has been read since this instance started
    written: dict[str, Loan] = field(default_factory=dict)  #: loans to write, before the next report leaves
    deleted: set[str] = field(default_factory=set)  #: loan rows to delete
    forgotten: dict[str, None] = field(default_factory=dict)  #: settled ids, oldest first

    def capacity(self, group: str) -> int:
        return sum(loan.held for loan in self.loans.values() if loan.group == group)

    def total(self) -> int:
        return sum(loan.held for loan in self.loans.values())

    def by_group(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for loan in self.loans.values():
            held[loan.group] = held.get(loan.group, 0) + loan.held
        return held

    def take(self, entries: Iterable[GrantEntry], reports: Iterable[ReportOutcome]) -> int:
        """Read a parent's reply: the grants it lists and its answers to our
        reports. Counts only ever fall: a given-back permit that the parent
        has not heard of yet stays given back. Returns the permits added."""
        before = self.total()
        for outcome in reports:
            loan = self.loans.get(outcome.grant_id)
            if loan is None:
                continue
            if outcome.status == NOT_FOUND or outcome.released >= loan.permits:
                self._forget(outcome.grant_id)  # settled: the parent no longer counts it
            else:
                loan.confirmed = max(loan.confirmed, outcome.released)
        for entry in entries:
            if entry.grant_id in self.forgotten:
                continue
            loan = self.loans.get(entry.grant_id)
            if loan is None:  # no row: the parent's count of what was given back of it is the truth
                loan = self.loans[entry.grant_id] = Loan(entry.grant_id, entry.group, entry.claimed,
                                                         entry.released, entry.released)
            elif entry.released > loan.released:
                loan.released = entry.released
                self.written[entry.grant_id] = loan
            loan.confirmed = max(loan.confirmed, entry.released)
            self.heard_up_to = max(self.heard_up_to, entry.claim_deadline)
        self.heard = True
        return self.total() - before

    def _forget(self, grant_id: str) -> None:
        loan = self.loans.pop(grant_id)
        self.written.pop(grant_id, None)
        if loan.released > 0:  # only a loan something was given back of has a row
            self.deleted.add(grant_id)
        self.forgotten[grant_id] = None
        if len(self.forgotten) > FORGOTTEN:
            del self.forgotten[next(iter(self.forgotten))]

    def give_back(self, group: str, count: int) -> None:
        """Give back ``count`` permits of ``group``, oldest loans first, so
        that loans settle and the reports stay few."""
        for loan in self.loans.values():
            if count <= 0:
                return
            if loan.group == group and loan.held:
                returned = min(count, loan.held)
                loan.released += returned
                count -= returned
                self.written[loan.grant_id] = loan

    def changes(self) -> tuple[list[Loan], list[str]]:
        """The rows to write and to delete since the last call."""
        written, deleted = list(self.written.values()), sorted(self.deleted)
        self.written, self.deleted = {}, set()
        return written, deleted

    def unconfirmed(self) -> bool:
        """Some permit was given back that the parent has not confirmed yet."""
        return any(loan.released > loan.confirmed for loan in self.loans.values())

    def reports(self) -> tuple[Report, ...]:
        """Every loan's cumulative counts, as the next request reports them."""
        return tuple(Report(loan.grant_id, loan.permits, loan.released)
                     for loan in list(self.loans.values())[:MAX_REPORTS])

    def full(self) -> bool:
        """Too many loans for one request to report: ask for no more until some settle."""
        return len(self.loans) >= MAX_REPORTS // 2


def over_limit(total: int | ResolutionFailed, out: int) -> bool:
    """A parent's permits out exceed its limit (lowered since), or the limit
    could not be read: its children must hand out none of what they hold."""
    return not isinstance(total, int) or out > total


def closed_groups(out_by_group: dict[str, int],
                  ceiling: Callable[[str], int | None | ResolutionFailed]) -> tuple[str, ...]:
    """The groups where a parent's children must hand out none of what they
    hold: its ceiling there could not be read (a round of its own would grant
    nothing there: it fails closed), or its permits out there exceed it (the
    ceiling was lowered). Reusing a permit within a group keeps the count at
    the parent; only in these groups is that no longer within the limits."""
    closed = []
    for group, out in sorted(out_by_group.items()):
        cap = ceiling(group)
        if isinstance(cap, ResolutionFailed) or (cap is not None and out > cap):
            closed.append(group)
    return tuple(closed)
