"""What a holder's ``usage()`` reports: figures from its books, and the demand its rounds left waiting.

Lives here: ``usage_info()``'s figures (the limit and its ceiling,
permits outstanding in grants and in lease footprint, per-group usage,
the fair-share policy and per-key shares) and, per client, the demand
the latest round it was in left waiting, kept in memory for
``WAITING_HEARD_MS``: a client that waits asks again, and is heard
again, soon. Must not know: how a round decides (``allocation``), SQL,
or the wire beyond ``Usage``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..._common.clock import now_ms
from ..messages import GroupUsage, RateUsage, Usage, WaitingUsage
from .fair_options import OLDEST_FIRST, UserFairShare
from .limits import UserLimits
from .pure.allocation import ClientOutcome, Grant, ResolutionFailed, usage
from .pure.leases import Lease, lease_usage

if TYPE_CHECKING:
    from .shell import DurabilitySemaphore

#: usage() reports a client's waiting demand for this long after the last round that heard it
WAITING_HEARD_MS = 60_000


def _usage_info(holder: DurabilitySemaphore) -> Usage:
    """``usage_info()``'s figures. Settled grants and leases kept only to
    answer late reports charge nothing."""
    grants = [grant for grant in holder.books.grants().values() if not grant.settled]
    leases = [lease for lease in holder.books.leases().values() if not lease.settled]
    granted, leased = usage(grants)[0], lease_usage(leases)[0]
    limit = holder.limits.total()
    policy = holder.lease_policy
    resolved = None if isinstance(limit, ResolutionFailed) else limit
    return Usage(
        limit=resolved,
        ceiling=resolved if policy is None or resolved is None else policy.budgets(resolved).ceiling,
        outstanding=granted + leased,
        lease_footprint=leased,
        # Past its ttl a lease is retired at the next round or report; say so already.
        retired_footprint=sum(lease.footprint for lease in leases if lease.retired or lease.expires_at <= now_ms()),
        grants=len(grants),
        leases=len(leases),
        groups=_group_usages(grants, leases, holder.limits, lambda group: _rate(holder, group),
                             holder.rate.last.groups),
        waiting=_waiting_by_reason(holder._blocked, now_ms()),
        **_sharing(holder.fair_share, grants, holder._blocked),
        rate=_rate(holder),
    )


def _rate(holder: DurabilitySemaphore, group: str | None = None) -> RateUsage | None:
    """The key's start rate (or ``group``'s own) and its window, over every grant the book keeps for it."""
    rate = holder.rate.usage(holder.books.grants().values(), now_ms(), group)
    return None if rate is None else RateUsage(**rate)


def _group_usages(grants: list[Grant], leases: list[Lease], limits: UserLimits,
                  rates: Callable[[str], RateUsage | None] = lambda _: None,
                  rated: Iterable[str] = ()) -> dict[str, GroupUsage]:
    """Per group: permits outstanding, in use, idle, leased, its own ceiling,
    and its own start rate (``rated``: groups with one, outstanding or not)."""
    _, groups = usage(grants)
    _, leased_groups = lease_usage(leases)
    in_use: dict[str, int] = {}
    for grant in grants:
        in_use[grant.group] = in_use.get(grant.group, 0) + grant.claimed - grant.released
    for lease in leases:
        in_use[lease.group] = in_use.get(lease.group, 0) + lease.drawn - lease.released
    per_group = {}
    for group in sorted(set(groups) | set(leased_groups) | set(rated)):
        outstanding = groups.get(group, 0) + leased_groups.get(group, 0)
        ceiling = limits.ceiling(group)
        used = in_use.get(group, 0)
        per_group[group] = GroupUsage(outstanding, used, outstanding - used, leased_groups.get(group, 0),
                                      None if isinstance(ceiling, ResolutionFailed) else ceiling, rates(group))
    return per_group


def _sharing(fair_share: UserFairShare | None, grants: list[Grant],
             blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]]) -> dict[str, Any]:
    """``usage()``'s policy and per-key shares."""
    if fair_share is None:
        return {"policy": OLDEST_FIRST}
    waiting: dict[str, int] = {}
    for entry in _waiting_by_reason(blocked, now_ms()):
        waiting[entry.group] = waiting.get(entry.group, 0) + entry.waiting
    return {"policy": fair_share.status, "shares": fair_share.usage(usage(grants)[1], waiting)}


def _waiting_by_reason(blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]],
                       now: float) -> tuple[WaitingUsage, ...]:
    """Demand left waiting, by group and reason, as clients last told it."""
    totals: dict[tuple[str, str], list[int]] = {}
    since = now - WAITING_HEARD_MS
    for at, by_group in blocked.values():
        if at < since:
            continue  # a client not heard of for this long has stopped asking
        for group, (reason, count) in by_group.items():
            total = totals.setdefault((group, reason), [0, 0])
            total[0] += count
            total[1] += 1
    return tuple(WaitingUsage(group, str(reason), count, clients)
                 for (group, reason), (count, clients) in sorted(totals.items()))


def _note_blocked(blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]], now: float,
                  outcomes: dict[str, ClientOutcome]) -> None:
    """What each client of the round still waits for, for ``usage()``. Kept
    in memory: a client that waits asks again, and is heard again, soon."""
    for client_id, outcome in outcomes.items():
        if outcome.blocked:
            blocked[client_id] = (now, dict(outcome.blocked))
        else:
            blocked.pop(client_id, None)
    for client_id in [c for c, (at, _) in blocked.items() if at < now - WAITING_HEARD_MS]:
        del blocked[client_id]
