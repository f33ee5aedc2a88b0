"""A holder's place in a budget tree: the one seam between the holder and ``semaphore/tree``.

Lives here: ``tree_place``, which makes a holder's place when the holder
is made, and the places it makes, each with the same few calls the
holder makes at fixed points of its path (a message heard, a round
about to run and just run, a sync, a reply to a tree's child):
``TreePlace``, a holder made without ``parent=`` (it keeps no beat,
borrows nothing and wakes nobody; a tree's child that asks it, as the
children of a root made without ``parent=`` do, still hears its limits
and who else waits); ``TreeMember``, a holder of a tree (its rounds on
the tree's beat, the ``Waker`` of its quiet children); and
``TreeChild``, a member that borrows its budget (its ``ParentLink``,
whose loans are its limit and ceilings, and which a parent's call
reaches). The link and the waker are ``tree/link``'s, the rules
``tree``'s. Must not know: how a round decides (``allocation``), SQL,
or how messages look on the wire (``messages``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._common.clock import now_ms
from ..messages import ProtocolError, Request
from ..tree.link import ParentLink, Waker, child_link, object_name as _object_name
from ..tree.pure.rules import (
    OldestWaiting,
    beat_phase,
    closed_groups,
    oldest_of_both,
    on_beat,
    over_limit,
    parent_of,
    unmet_demand,
)
from .limits import UserLimits
from .pure.allocation import ClientOutcome, Grant, Working, apply_reports, check_ownership, usage
from .rounds import _demands_by_group, _round_for_lent

if TYPE_CHECKING:
    from ..client import SemaphoreClient
    from .books import HolderBooks
    from .shell import DurabilitySemaphore


class TreePlace:
    """A holder made without ``parent=``: its rounds keep no beat, it
    borrows nothing and wakes nobody. A tree's child may still ask it (it
    is then a tree's root): a reply to one carries what every parent's
    does (``reply_fields``, ``limits_for``)."""

    keeps_beat = False  #: its rounds run on the tree's beat (``next_beat``)
    has_parent = False  #: it borrows its budget from a parent, which its rounds tell what waits
    own_key: str | None = None  #: the key it lends under to the children it wakes (see ``release_needs_row``)

    def __init__(self, holder: DurabilitySemaphore) -> None:
        self.holder = holder
        #: the oldest items its last round left waiting, per child (what a
        #: reply between rounds tells a child), and when it ran
        self._oldest: tuple[OldestWaiting, float] | None = None
        #: when this instance's first round with demand ran (None: none yet; see ``ramping``)
        self.first_demand_at: float | None = None

    def next_beat(self, at: float) -> float:
        """The first of its beats at or after ``at`` (``keeps_beat`` only)."""
        return at

    @staticmethod
    def is_child(client_id: str) -> bool:
        """The client is a tree's child holder (its name says so), of this holder or another."""
        return parent_of(client_id) is not None

    def heard_from(self, client_id: str) -> None:
        """A message from ``client_id``, parsed."""

    async def called_by_parent(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """A parent's call (a ``grants`` reply): only a tree's child takes one."""
        return ProtocolError("invalid_message", "only a budget tree's child takes its parent's replies").reply()

    def hears_parent(self) -> bool:
        """Its parent's last word is fresh (a root: always). A child's new
        instance has not heard yet, and a round then hands out nothing: its
        first round with demand (``rounds._round_time``) waits for that word."""
        return True

    @property
    def served_demand(self) -> bool:
        """A round of this instance had demand to serve (see ``rounds._round_time``)."""
        return self.first_demand_at is not None

    def ramping(self, now: float) -> bool:
        """Within a round period of this instance's first round with demand
        (or before it): its rounds come a quarter period apart, off the
        beat, and a child asks its parent after each (``rounds._round_time``,
        ``ParentLink._ask_due``)."""
        return self.first_demand_at is None or now - self.first_demand_at < self.holder.round_period_ms

    def before_round(self, requests: list[Request]) -> None:
        """A round is about to serve ``requests`` (held and parked), its limits not read yet."""
        if self.first_demand_at is None and any(d.count > 0 for r in requests for d in r.demand):
            self.first_demand_at = now_ms()

    def after_round(self, requests: list[Request], outcomes: dict[str, ClientOutcome], contended: bool,
                    now: float) -> None:
        """A round (run at ``now``) served ``requests`` with ``outcomes``, and is committed."""
        self._oldest = (OldestWaiting(requests, outcomes), now) if any(
            self.is_child(request.client_id) for request in requests) else None

    def after_sync(self, client_id: str) -> None:
        """A sync from ``client_id`` was applied (and committed, if it changed anything)."""

    def after_change(self) -> None:
        """A sync is done (what it changed committed, a round it called for
        on its way): a member watches again the children its books charge."""

    def limits_for(self, client_id: str, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a reply tells a tree's child of this holder's limits (see
        ``_tree_limits``); nothing for other clients."""
        if not self.is_child(client_id):
            return {}
        return _tree_limits(self.holder.limits, self.holder.books.grants(), self._borrowed_from(), resolved)

    def reply_fields(self, client_id: str, request: Request, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a reply to ``request`` tells a tree's child beyond what other
        clients hear: this holder's limits, and, per group it waits in, the
        oldest items the last round left waiting at other children, with
        when that round ran. Nothing for other clients."""
        if not self.is_child(client_id):
            return {}
        fields = self.limits_for(client_id, resolved)
        if self._oldest is not None:
            oldest, seen_at = self._oldest
            groups = [d.group for d in request.demand]
            since = oldest.others(client_id, groups)
            link = self._borrowed_from()
            if link is not None:
                # In the middle of a tree, the line goes on past this
                # holder's children: the oldest its parent said wait at
                # other children of its own count too, or a leaf two levels
                # down would serve its young work while older work waits
                # under another branch.
                since = oldest_of_both(since, link.waiting_elsewhere(groups, seen_at))
            fields.update(waiting_since=since, waiting_since_at=seen_at)
        return fields

    def _borrowed_from(self) -> ParentLink | None:
        """Its link to its parent, whose loans limit it, or None: its own limits do."""
        return None


class TreeMember(TreePlace):
    """A holder of a tree (made with ``parent=``): its rounds on the tree's
    beat, and the ``Waker`` of its children that hold permits and have
    gone quiet."""

    keeps_beat = True

    def __init__(self, holder: DurabilitySemaphore, waker: Waker) -> None:
        super().__init__(holder)
        self._waker = waker
        self.own_key = waker.own_key
        self._beat_phase_ms = beat_phase(waker.own_key, holder.round_period_ms)

    def next_beat(self, at: float) -> float:
        return on_beat(at, self.holder.round_period_ms, self._beat_phase_ms)

    def heard_from(self, client_id: str) -> None:
        self._waker.heard_from(client_id)

    def after_round(self, requests: list[Request], outcomes: dict[str, ClientOutcome], contended: bool,
                    now: float) -> None:
        super().after_round(requests, outcomes, contended, now)
        if contended:
            self._waker.wake_quiet(_holding(self.holder.books.grants()))
        self.after_change()

    def after_change(self) -> None:
        self._waker.watch(lambda: _holding(self.holder.books.grants()))


class TreeChild(TreeMember):
    """A tree's child: it borrows its budget through its ``ParentLink``,
    tells it what each round left waiting and what each sync gave back,
    and takes its parent's calls."""

    has_parent = True

    def __init__(self, holder: DurabilitySemaphore, waker: Waker, link: ParentLink) -> None:
        super().__init__(holder, waker)
        self._link = link

    def _borrowed_from(self) -> ParentLink | None:
        return self._link

    async def called_by_parent(self, message: dict[str, Any]) -> dict[str, Any] | None:
        answer = self._link.called(message)
        await self.holder.scheduler.sync()
        return answer

    def hears_parent(self) -> bool:
        return not self._link.stale()

    def before_round(self, requests: list[Request]) -> None:
        if self.hears_parent():  # a round that may hand out nothing is no first round (``hears_parent``)
            super().before_round(requests)
        self._link.decide(_demands_by_group(requests), lambda: _charged_after_reports(self.holder.books, requests))

    def after_round(self, requests: list[Request], outcomes: dict[str, ClientOutcome], contended: bool,
                    now: float) -> None:
        self._link.after_round(unmet_demand(requests, outcomes), ask_at_once=self.ramping(now))
        super().after_round(requests, outcomes, contended, now)

    def after_sync(self, client_id: str) -> None:
        self._link.after_round(None, client_id)  # it gives back what its clients released, or wakes


def tree_place(holder: DurabilitySemaphore, parent: SemaphoreClient | None,
               can_grant: Callable[[str, str], bool] | None) -> TreePlace:
    """A holder's place in a budget tree: outside one (no ``parent``), a
    member, or a child, whose link to its parent its name gives."""
    if parent is None:
        return TreePlace(holder)
    ctx = holder.scheduler.ctx
    link = child_link(parent, holder.scheduler, holder.round_period_ms, lambda: _round_for_lent(holder),
                      lambda: usage(holder.books.grants().values())[1], holder.store)
    if link is not None:  # a child borrows its limit: every group's ceiling is what it holds there
        holder.limits = UserLimits(link.borrowed.total, link.ceiling, can_grant)
        holder.fair_share = None  # the root shares the limit: a child passes its demand up, groups and all
        link.ensure_exchanges()  # a new instance hears at once what it holds
    waker = Waker(parent, _object_name(ctx), holder.round_period_ms, holder.scheduler)
    waker.watch(lambda: _holding(holder.books.grants()))
    return TreeMember(holder, waker) if link is None else TreeChild(holder, waker, link)


def _charged_after_reports(books: HolderBooks, requests: list[Request]) -> dict[str, int]:
    """Per group, the permits the grants charge once the round has applied
    the releases its requests report (as ``run_round`` does first). A
    child's give-back rides with its request (``ParentLink``): counted as
    still lent, a holder in the middle owed its parent nothing, lent the
    permit back to that child in the same round, and the child gave it back
    again, round after round, while older work waited under another branch."""
    working, ids = Working(books.grants(), books.leases()), books.lease_ids()
    for request in requests:
        try:  # the round's own check first: a request it refuses releases nothing
            check_ownership(working, request.client_id, request.reports, request.lease_reports, ids)
            apply_reports(working, request.client_id, request.reports)
        except ProtocolError:
            pass  # the round refuses that request alone, and applies none of it
    return usage(working.grants())[1]


def _holding(grants: dict[str, Grant]) -> list[str]:
    """The clients the books charge permits to."""
    return [grant.client_id for grant in grants.values() if grant.charged > 0]


def _tree_limits(limits: UserLimits, grants: dict[str, Grant], link: ParentLink | None,
                 resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a parent tells its children of its own limits (see
    ``tree.over_limit`` and ``tree.closed_groups``): the ceilings a round
    already read (``resolved``) are not read again; a parent that is a
    child itself is limited by what it holds, not by what it owes, and
    passes on its own parent's word that the tree is over its limit, or
    says so itself once it has not heard from its parent for a while: a
    limit lowered at the root otherwise never reached a leaf two levels
    down, which reused its loans under the old limit for good (tree seed
    323: an item started 220 s after the root's limit went to 0)."""
    total, by_group = usage(grants.values())
    if link is not None:
        over = link.over_limit or link.cut_off() or over_limit(link.borrowed.total(), total)
        return {"over_limit": over,
                "closed_groups": closed_groups(by_group, link.held_ceiling)}
    known = resolved or {}
    return {"over_limit": over_limit(limits.total(), total),
            "closed_groups": closed_groups(by_group, lambda g: known[g] if g in known else limits.ceiling(g))}
