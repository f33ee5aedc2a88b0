"""A budget tree's pure rules: which holder a client reaches, and what a child holder borrowed.

Lives here: the names of a tree's holders (``holder_for``, ``parent_of``),
the stable choice of a child for a client id, and ``Borrowed``: the grants a
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
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .allocation import ClientOutcome, ResolutionFailed
from .messages import (
    GROUP_LIMIT,
    LIMIT,
    MAX_COUNT,
    MAX_DEMAND_ENTRIES,
    MAX_DEMAND_TIMES,
    MAX_ID_LENGTH,
    MAX_REPORTS,
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
    the parent: the count left waiting, and when its items were enqueued,
    folded into runs (each client's youngest items are the ones left; at
    most the ``MAX_DEMAND_ENTRIES`` oldest groups: one request carries no more)."""
    runs: dict[str, list[tuple[float, int]]] = {}
    for _, demand, count in left_waiting(requests, outcomes):
        runs.setdefault(demand.group, []).extend(left_runs(demand, count))
    for group_runs in runs.values():
        group_runs.sort()
    groups = sorted(runs, key=lambda group: (runs[group][0][0], group))[:MAX_DEMAND_ENTRIES]
    unmet = {}
    for group in groups:
        count = min(sum(n for _, n in runs[group]), MAX_COUNT)
        folded = fold_runs(runs[group], MAX_DEMAND_TIMES, count)
        unmet[group] = Demand(group, count, folded[0][0], tuple(at for at, _ in folded),
                              tuple(n for _, n in folded))
    return unmet


def left_runs(demand: Demand, left: int) -> list[tuple[float, int]]:
    """The demand's ``left`` youngest items as (time, items) runs, oldest
    first: past the times it gives, the rest stand at the last one."""
    runs = demand.runs() or [(demand.oldest_at, 0)]
    unlisted = demand.count - sum(n for _, n in runs)
    youngest = [(runs[-1][0], min(left, unlisted))] if unlisted > 0 else []
    left -= youngest[0][1] if youngest else 0
    for at, n in reversed(runs):
        if left <= 0:
            break
        youngest.append((at, min(n, left)))
        left -= n
    return _merged(reversed(youngest))


def _merged(runs: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """Runs, oldest first, with those of one time made one (and empty ones dropped)."""
    merged: list[tuple[float, int]] = []
    for at, n in runs:
        if merged and merged[-1][0] == at:
            merged[-1] = (at, merged[-1][1] + n)
        elif n > 0:
            merged.append((at, n))
    return merged


def fold_runs(runs: Iterable[tuple[float, int]], most: int, total: int) -> list[tuple[float, int]]:
    """Runs (time, items), oldest first, folded into at most ``most`` runs of
    at most ``total`` items in all, each standing at its oldest item's time.
    Runs grow by one factor from a single item at the head of the line to
    hold the whole line in ``most`` (``run_sizes``): exact where the next
    permits go and where a child's line is compared with others', coarser
    far behind. Items of one time stay one run however many they are."""
    merged = _merged(runs)
    sizes = run_sizes(min(total, sum(n for _, n in merged)), most)
    folded: list[tuple[float, int]] = []
    at_head: float | None = None  #: the open run's time (None: none is open)
    filled = 0
    for at, n in merged:
        n = min(n, total)
        total -= n
        while n > 0:
            if at_head is None and folded and folded[-1][0] == at:  # the run just closed stands here too
                folded[-1], n = (at, folded[-1][1] + n), 0
                break
            at_head = at if at_head is None else at_head
            size = sizes[min(len(folded), len(sizes) - 1)]
            take = min(n, size - filled) if len(folded) < len(sizes) - 1 else n
            filled, n = filled + take, n - take
            if filled == size and len(folded) < len(sizes) - 1:
                folded.append((at_head, filled))
                at_head, filled = None, 0
    if at_head is not None:
        folded.append((at_head, filled))
    return folded


def run_sizes(items: int, most: int) -> list[int]:
    """How many items each of at most ``most`` runs holds, ``items`` in all:
    the k-th ends at item items ** ((k + 1) / most), rounded down (one each
    while the line is no longer than ``most``)."""
    sizes, end = [], 0
    for k in range(most):
        if end >= items:
            break
        next_end = min(items, max(end + 1, math.floor(items ** ((k + 1) / most))))
        sizes.append(next_end - end)
        end = next_end
    return sizes or [0]


class OlderElsewhere:
    """Per group, the items a round left waiting for capacity, oldest first:
    enough to tell each child how many items of others wait that are older
    than its own by more than ``margin_ms`` (see ``holder_tree.ParentLink.decide``).
    A child left nothing stands at the youngest item it asked for: its
    next items are younger still."""

    def __init__(self, requests: Iterable[Request], outcomes: dict[str, ClientOutcome], margin_ms: float) -> None:
        self.margin_ms = margin_ms
        runs: dict[str, list[tuple[float, int]]] = {}
        self.stands: dict[tuple[str, str], float] = {}  #: (client, group) -> where its line stands
        latest = {request.client_id: request for request in requests}
        for client_id, request in latest.items():
            for demand in request.demand:
                self.stands[client_id, demand.group] = (demand.times or (demand.oldest_at,))[-1]
        for client_id, demand, count in left_waiting(latest.values(), outcomes):
            left = left_runs(demand, count)
            runs.setdefault(demand.group, []).extend(left)
            if left:
                self.stands[client_id, demand.group] = left[0][0]
        self.times: dict[str, list[float]] = {}
        self.before: dict[str, list[int]] = {}  #: per group, the items older than each time
        self._behind_counts: dict[str, int] = {}  #: per group, the clients with older work elsewhere
        for group, group_runs in runs.items():
            group_runs.sort()
            self.times[group] = [at for at, _ in group_runs]
            self.before[group] = list(itertools.accumulate((n for _, n in group_runs), initial=0))

    def older(self, client_id: str, group: str) -> int:
        """The items of other clients older than this client's line by the margin."""
        stands = self.stands.get((client_id, group))
        if stands is None or group not in self.times:
            return 0
        return self.before[group][bisect.bisect_left(self.times[group], stands - self.margin_ms)]

    def counts(self, client_id: str, groups: Iterable[str]) -> dict[str, int]:
        """Per group of ``groups``, this client's share of the older work
        elsewhere: what waits older than its line, over the number of
        clients behind it too. Each client behind counts the same old
        items; owing all of them each, together they would give back many
        times what those items need, and capacity would swing."""
        shares = {}
        for group in groups:
            older = self.older(client_id, group)
            if older:
                shares[group] = -(-older // self._behind(group))
        return shares

    def _behind(self, group: str) -> int:
        if group not in self._behind_counts:
            self._behind_counts[group] = sum(
                1 for client_id, other in self.stands if other == group and self.older(client_id, group))
        return self._behind_counts[group]


def yield_margin_ms(period_ms: float) -> float:
    """How much older work elsewhere must be for a child to give it its
    freed permits: half a round period. Lower, and capacity moves for work
    a round would not put ahead; higher, and the lines of children drift
    apart by as much."""
    return period_ms / 2


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
