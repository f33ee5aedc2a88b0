"""Leases at the holder, as pure functions: the policy, the budgets, reports, retirement, sharing.

Lives here: the lease ids a holder issues (``LeaseIds``), the provisioning
policy (``LeasePolicy``) and the budgets it leaves grants and leases,
applying a client's lease reports (a lease the holder knows, one it
settled, one it never knew), retiring leases (past their ttl, under a
lowered limit, in a group no longer eligible) and sharing a round's lease
budget among candidates. The book's entry (``Lease``), what it charges,
and which of its changes need a row are in ``holder/pure/lease_entry``. Must not
know: storage, RPC, clocks or the user's callbacks.

Leases of another epoch (``LeaseIds``: issued before the holder lost its
rows) are charged only while one may still be live from before: a report
of one that has no row is charged only within ``ttl_ms`` of this epoch's
start, a row of one lasts until ``ttl_ms`` after its last report, and a
settled one is remembered until that first ``ttl_ms`` ends. Past it, a
report of one with no row is answered settled and charges nothing, so no
late or repeated report ever charges a lease again. (``docs/semaphore.md``,
"Reports the holder cannot place", gives the reasoning.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ...._common.checks import is_int, number_in
from ...messages import OK, RETIRED, SETTLED, LeaseOutcome, LeaseReport
from .lease_entry import Lease as Lease, needs_row as needs_row


class Provisioning(StrEnum):
    """Where a lease's permits come from (the ``provisioning`` option's ``mode``)."""

    STRICT = "strict"  #: the limit, shared with grants (grants first)
    UNDER = "under"  #: a reserve inside the limit, kept for leases
    OVER = "over"  #: an extra above the limit, for leases only


STRICT, UNDER, OVER = Provisioning
WITHIN_GROUP_LIMIT = "withinGroupLimit"
DEFAULT_PERMITS_PER_LEASE = 64
DEFAULT_TTL_MS = 30 * 60_000


#: How long the holder remembers a reclaimed grant whose claims were all
#: released: longer than any report can take to arrive, a request held over
#: for its rounds included (``MAX_WAIT_MS``, 5 minutes, and the client's time
#: limit on top). (A settled lease of another epoch is remembered as long as
#: one of that epoch may be charged at all: see ``LeaseIds.foreign_until``.)
SETTLED_MEMORY_MS = 10 * 60_000


@dataclass(frozen=True)
class LeaseIds:
    """The ids one holder issues: ``l<epoch>-<n>``, n counting up from 1.

    The epoch is fixed when the holder's lease table is created. Every id
    that starts with this holder's ``l<epoch>-`` is its own: one numbered
    at most ``issued`` was issued here (if the book no longer has it, it was
    settled); any other id under the prefix never was, and only a faulty or
    hostile client can report it. Ids of other epochs are not the holder's:
    one may be live from before the holder lost its rows only within
    ``ttl_ms`` of ``started_at`` (``foreign_until``), since a client with a
    lease reports it at least every half ttl.
    """

    epoch: str
    issued: int
    #: when the epoch began, epoch ms (0: a table older than that record)
    started_at: float = 0.0
    #: the holder's lease ttl (the default when leases are off)
    ttl_ms: float = DEFAULT_TTL_MS

    @property
    def foreign_until(self) -> float:
        """Until when a report of another epoch's lease with no row is charged."""
        return self.started_at + self.ttl_ms

    @property
    def prefix(self) -> str:
        return f"l{self.epoch}-"

    def nth(self, n: int) -> str:
        return f"{self.prefix}{n}"

    def owns(self, lease_id: str) -> bool:
        return lease_id.startswith(self.prefix)

    def was_issued(self, lease_id: str) -> bool:
        number = lease_id[len(self.prefix):] if self.owns(lease_id) else ""
        return number.isdecimal() and number.isascii() and not number.startswith("0") and int(number) <= self.issued


@dataclass(frozen=True)
class Budgets:
    """What one round may hand out: everything under ``ceiling``; grants up to
    ``grant_cap`` of it, lease footprint up to ``lease_cap``."""

    ceiling: int
    grant_cap: int
    lease_cap: int

    def grant_room(self, granted: int, leased: int) -> int:
        return min(self.grant_cap - granted, self.ceiling - granted - leased)

    def lease_room(self, granted: int, leased: int) -> int:
        return min(self.lease_cap - leased, self.ceiling - granted - leased)


def _count(value: Any, what: str, least: int = 0) -> int:
    if not is_int(value) or value < least:
        raise ValueError(f"{what} must be an integer of at least {least}, not {value!r}")
    return value


@dataclass(frozen=True)
class LeasePolicy:
    """The ``leases=`` option of ``DurabilitySemaphore``, checked.

    ``provisioning``: ``{"mode": "strict"}`` (leases share the limit, after
    grants), ``{"mode": "under", "reserve": n}`` (grants get at most ``limit
    - n``, but always keep one permit) or ``{"mode": "over", "extra":
    {"ratio": r} | {"count": n}}`` (leases get their own budget above the
    limit). ``permits_per_lease``: the most one lease holds. ``ttl_ms``: a
    lease unreported this long is retired. ``limited_groups``: None (groups
    with a limit of their own get grants only) or ``"withinGroupLimit"``
    (they get leases too, within their limit).
    """

    mode: Provisioning = STRICT
    reserve: int = 0
    extra_ratio: float | None = None
    extra_count: int | None = None
    permits_per_lease: int = DEFAULT_PERMITS_PER_LEASE
    ttl_ms: float = DEFAULT_TTL_MS
    limited_groups: str | None = None

    @classmethod
    def from_options(cls, options: Any) -> LeasePolicy:
        if not isinstance(options, dict):
            raise ValueError(f"leases must be a dict of options, not {options!r}")
        known = {"provisioning", "permits_per_lease", "ttl_ms", "limited_groups"}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown lease options {sorted(unknown)}; known: {sorted(known)}")
        provisioning = options.get("provisioning", {"mode": STRICT})
        if not isinstance(provisioning, dict) or provisioning.get("mode") not in (STRICT, UNDER, OVER):
            raise ValueError("provisioning must be {'mode': 'strict' | 'under' | 'over', ...}")
        mode = Provisioning(provisioning["mode"])
        allowed = {STRICT: {"mode"}, UNDER: {"mode", "reserve"}, OVER: {"mode", "extra"}}[mode]
        if set(provisioning) - allowed:
            raise ValueError(f"provisioning {mode!r} takes only {sorted(allowed)}")
        reserve, ratio, count = 0, None, None
        if mode == UNDER:
            reserve = _count(provisioning.get("reserve"), "provisioning reserve")
        if mode == OVER:
            extra = provisioning.get("extra")
            if not isinstance(extra, dict) or len(extra) != 1 or not set(extra) <= {"ratio", "count"}:
                raise ValueError("provisioning extra must be {'ratio': r} or {'count': n}")
            if "ratio" in extra:
                ratio = extra["ratio"]
                if not number_in(ratio, 0, math.inf):
                    raise ValueError(f"extra ratio must be a finite number of at least 0, not {ratio!r}")
                ratio = float(ratio)
            else:
                count = _count(extra["count"], "extra count")
        per_lease = _count(options.get("permits_per_lease", DEFAULT_PERMITS_PER_LEASE), "permits_per_lease", 1)
        ttl = options.get("ttl_ms", DEFAULT_TTL_MS)
        if not number_in(ttl, 0, math.inf) or ttl == 0:
            raise ValueError(f"ttl_ms must be a positive number of milliseconds, not {ttl!r}")
        limited = options.get("limited_groups")
        if limited not in (None, WITHIN_GROUP_LIMIT):
            raise ValueError(f"limited_groups must be None or {WITHIN_GROUP_LIMIT!r}, not {limited!r}")
        return cls(mode, reserve, ratio, count, per_lease, float(ttl), limited)

    def extra(self, limit: int) -> int:
        """The lease budget above ``limit``: none at a limit of 0, which means stop
        in every mode (a count would otherwise keep leases coming)."""
        if self.mode != OVER or limit <= 0:
            return 0
        if self.extra_count is not None:
            return self.extra_count
        assert self.extra_ratio is not None  # "over" takes a count or a ratio (see from_options)
        return math.floor(limit * self.extra_ratio)

    def budgets(self, limit: int) -> Budgets:
        if self.mode == UNDER:
            # The reserve never takes the last permit: groups and clients
            # that cannot lease still make progress.
            reserve = min(self.reserve, max(limit - 1, 0))
            return Budgets(limit, limit - reserve, limit)
        if self.mode == OVER:
            extra = self.extra(limit)
            return Budgets(limit + extra, limit, extra)
        return Budgets(limit, limit, limit)

    def group_eligible(self, ceiling: Any) -> bool:
        """May a group with this own ceiling (None: none) get leases?"""
        return ceiling is None or (self.limited_groups == WITHIN_GROUP_LIMIT and isinstance(ceiling, int))


def no_leases(limit: int) -> Budgets:
    return Budgets(limit, limit, 0)


def tally(amounts: Iterable[tuple[str, int]]) -> tuple[int, dict[str, int]]:
    """Sum (group, amount) pairs: the total and the sum per group."""
    total = 0
    groups: dict[str, int] = {}
    for group, amount in amounts:
        total += amount
        groups[group] = groups.get(group, 0) + amount
    return total, groups


def lease_usage(leases: Iterable[Lease]) -> tuple[int, dict[str, int]]:
    return tally((lease.group, lease.footprint) for lease in leases)


def remembered(lease: Lease, ids: LeaseIds, now: float) -> Lease:
    """A settled lease the holder did not issue stays in the book, settled,
    until ``ids.foreign_until``: a late report of it is then answered settled
    instead of being charged again; after that no report of a lease of
    another epoch with no row is charged. Its own ids need no such row: the
    id counter tells they were issued."""
    if not lease.settled or ids.owns(lease.lease_id):
        return lease
    return replace(lease, retired=True, expires_at=ids.foreign_until)


def _keep(working: Any, lease: Lease, ids: LeaseIds, now: float) -> None:
    if lease.settled and not ids.owns(lease.lease_id) and lease.expires_at > now:
        working.changes.put_lease(lease)  # remembered, settled (see ``remembered``)
    else:
        working.put_lease(lease)  # a settled lease of its own, or one remembered no longer, leaves the book


def foreign(lease: Lease, ids: LeaseIds | None) -> bool:
    """A lease of another epoch (settled ones in the book are all such)."""
    return lease.settled or (ids is not None and not ids.owns(lease.lease_id))


def forget_settled(working: Any, now: float, ids: LeaseIds | None = None) -> None:
    """Drop the settled leases kept past their memory, and stop charging a
    lease of another epoch unheard for ``ids.ttl_ms``: a client with work
    under a lease reports it at least every half ttl, so none is left that
    can still reach the holder about it (see ``apply_lease_report``)."""
    for lease in list(working.leases()):
        if lease.expires_at > now or not foreign(lease, ids):
            continue
        if lease.settled:
            working.changes.delete_lease(lease.lease_id)
        else:
            assert ids is not None  # foreign() above
            _keep(working, remembered(replace(lease, released=lease.permits), ids, now), ids, now)


def status_of(lease: Lease) -> str:
    if lease.settled:
        return SETTLED
    return RETIRED if lease.retired else OK


def apply_lease_report(working: Any, client_id: str, report: LeaseReport, ids: LeaseIds,
                       now: float, ttl_ms: float | None) -> LeaseOutcome:
    """Move one lease's counts forward; a report (``ttl_ms`` not None: not a
    request held over) heartbeats a live lease, and one of another epoch.

    A lease this holder issued and settled is answered settled. A lease of
    another epoch it has no row for is answered settled and charged nothing
    once ``ids.foreign_until`` is past; before, it may be live from before
    the holder lost its rows, so it is charged as the report describes it,
    retired (the client may have work running under it, and only its
    reports can say when that ends), until settled or unheard for
    ``ids.ttl_ms`` (``forget_settled``). ``check_ownership`` has already
    refused ids under this holder's prefix that it never issued.
    """
    lease = working.get_lease(report.lease_id)
    if lease is None:
        if ids.was_issued(report.lease_id) or (not ids.owns(report.lease_id) and now >= ids.foreign_until):
            return LeaseOutcome(report.lease_id, SETTLED, report.drawn, report.released, report.drawn)
        permits = report.drawn if report.stopped else report.permits
        lease = remembered(Lease(report.lease_id, client_id, report.group, permits, report.drawn,
                                 report.released, now + ids.ttl_ms, True, 0), ids, now)
        _keep(working, lease, ids, now)
        return LeaseOutcome(lease.lease_id, status_of(lease), lease.drawn, lease.released, lease.permits)
    drawn = max(lease.drawn, min(report.drawn, lease.permits))
    # A report counting more draws than the lease has permits was sent before
    # the report that stopped the lease at fewer, by an older instance of the
    # client: its releases may be of draws the stop never counted (their
    # items gone, released), so it frees nothing. The instance that stopped
    # the lease reports every release of the draws it counted.
    heard = lease.released if report.drawn > lease.permits else min(report.released, drawn)
    released = max(lease.released, heard)
    permits = drawn if report.stopped else lease.permits  # stopped: drawn is final
    retired = lease.retired or report.stopped
    expires_at = lease.expires_at
    if ttl_ms is not None and not ids.owns(lease.lease_id):
        expires_at = now + ids.ttl_ms  # charged while heard (see forget_settled)
    elif ttl_ms is not None and not retired:
        expires_at = now + ttl_ms
    updated = remembered(replace(lease, permits=permits, drawn=drawn, released=released, retired=retired,
                                 expires_at=expires_at), ids, now)
    if updated != lease:
        _keep(working, updated, ids, now)
    return LeaseOutcome(lease.lease_id, status_of(updated), drawn, released, permits)


def retire_expired(working: Any, now: float) -> None:
    """A lease unreported for its ttl is retired, not forgotten."""
    for lease in list(working.leases()):
        if not lease.retired and lease.expires_at <= now:
            working.put_lease(replace(lease, retired=True))


def retire_ineligible(working: Any, policy: LeasePolicy | None, total: Any,
                      groups: dict[str, Any], permitted: dict[tuple[str, str], bool]) -> None:
    """Retire live leases that this round's limits would no longer issue:
    leases turned off, a limit lowered below the one a lease was issued
    under (or unresolved), a group that lost eligibility, a client refused."""
    for lease in list(working.leases()):
        if lease.retired:
            continue
        if (policy is None or not isinstance(total, int) or total < lease.limit_at_issue
                or not policy.group_eligible(groups.get(lease.group))
                or not permitted.get((lease.client_id, lease.group), True)):
            working.put_lease(replace(lease, retired=True))


def share(budget: int, candidates: int, per_lease: int) -> list[int]:
    """Split ``budget`` equally among candidates (ordered oldest first), each
    at most ``per_lease``; with fewer permits than candidates the oldest get
    one each."""
    if candidates == 0:
        return []
    budget = max(budget, 0)
    if budget < candidates:
        return [1] * budget + [0] * (candidates - budget)
    base, rest = divmod(budget, candidates)
    return [min(per_lease, base + (1 if i < rest else 0)) for i in range(candidates)]
