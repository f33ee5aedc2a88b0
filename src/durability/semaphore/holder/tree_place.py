"""A holder's place in a budget tree: its link to its parent, the waker of its children, and what it tells them.

Lives here: the parts a holder of a tree is made with (a child's
``ParentLink``, whose loans are its limit and ceilings; a parent's
``Waker`` of its quiet children, and the clients it watches), a parent's
call taken by its child, and what a reply tells a tree's child beyond
what other clients hear (the parent's limits, and the oldest items its
last round left waiting at other children). The link and the waker are
``tree/link``'s, the rules ``tree``'s. Must not know: how a round
decides (``allocation``), SQL, or how messages look on the wire
(``messages``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..messages import ProtocolError, Request
from ..tree.link import ParentLink, Waker, child_link, object_name as _object_name
from ..tree.pure.rules import closed_groups, over_limit, parent_of
from .limits import UserLimits
from .pure.allocation import Grant, usage
from .rounds import _round_for_lent

if TYPE_CHECKING:
    from ..client import SemaphoreClient
    from .shell import DurabilitySemaphore


async def _called_by_parent(holder: DurabilitySemaphore, message: dict[str, Any]) -> dict[str, Any] | None:
    """A tree's parent calls its child with what its round had for it."""
    if holder._link is None:
        return ProtocolError("invalid_message", "only a budget tree's child takes its parent's replies").reply()
    answer = holder._link.called(message)
    await holder.scheduler.sync()
    return answer


def _tree_parts(holder: DurabilitySemaphore, parent: SemaphoreClient | None,
                can_grant: Callable[[str, str], bool] | None) -> tuple[ParentLink | None, Waker | None]:
    """A holder's place in a budget tree: its link to its parent (a child),
    and the waker of its quiet children (a parent)."""
    if parent is None:
        return None, None
    ctx = holder.scheduler.ctx
    link = child_link(parent, holder.scheduler, holder.round_period_ms, lambda: _round_for_lent(holder),
                      lambda: usage(holder.books.grants().values())[1], holder.store)
    if link is not None:  # a child borrows its limit: every group's ceiling is what it holds there
        holder.limits = UserLimits(link.borrowed.total, link.ceiling, can_grant)
        holder.fair_share = None  # the root shares the limit: a child passes its demand up, groups and all
        link.ensure_exchanges()  # a new instance hears at once what it holds
    waker = Waker(parent, _object_name(ctx), holder.round_period_ms, holder.scheduler)
    waker.watch(lambda: _holding(holder.books.grants()))
    return link, waker


def _holding(grants: dict[str, Grant]) -> list[str]:
    """The clients the books charge permits to."""
    return [grant.client_id for grant in grants.values() if grant.charged > 0]


def _tree_limits(limits: UserLimits, grants: dict[str, Grant], link: ParentLink | None,
                 resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a parent tells its children of its own limits (see
    ``tree.over_limit`` and ``tree.closed_groups``): the ceilings a round
    already read (``resolved``) are not read again; a parent that is a
    child itself is limited by what it holds, not by what it owes."""
    total, by_group = usage(grants.values())
    if link is not None:
        return {"over_limit": over_limit(link.borrowed.total(), total),
                "closed_groups": closed_groups(by_group, link.held_ceiling)}
    known = resolved or {}
    return {"over_limit": over_limit(limits.total(), total),
            "closed_groups": closed_groups(by_group, lambda g: known[g] if g in known else limits.ceiling(g))}


def _tree_fields(holder: DurabilitySemaphore, client_id: str, resolved: dict[str, Any] | None = None,
                 request: Request | None = None) -> dict[str, Any]:
    """What a reply tells a tree's child beyond what other clients hear: the
    parent's limits, and, per group it waits in (``request``'s, else its
    parked demand's), the oldest items the parent's last round left waiting
    at other children, with when that round ran. Nothing for other clients."""
    if parent_of(client_id) is None:
        return {}
    fields = _tree_limits(holder.limits, holder.books.grants(), holder._link, resolved)
    if request is None and holder._parked is not None:
        request = entry.request if (entry := holder._parked.line.get(client_id)) is not None else None
    if holder._oldest is not None and request is not None:
        oldest, seen_at = holder._oldest
        fields.update(waiting_since=oldest.others(client_id, (d.group for d in request.demand)),
                      waiting_since_at=seen_at)
    return fields
