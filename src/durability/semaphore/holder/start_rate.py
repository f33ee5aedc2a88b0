"""The holder's start rate: the user's option read once per round, its pace, and where its grants were placed.

Lives here: ``StartRate``: the ``rate=`` option (a constant checked when
the holder is made, or a callable read once per round, failing closed),
the pace that keeps a burst from raising the average (memory), the times
calls placed their grants (memory, from ``ClientCalls.placed``), when the
next round may start more, and what ``usage()`` says of the rate. Must
not know: how a round decides (``holder/pure/rate`` does), storage, or
the wire.

Cost: nothing per admission beyond what a grant costs already. The
window is the grant book: a grant stays in its client's row, settled,
until its starts leave the window (``Grant.kept_until``), a field of the
row the grant and its release write anyway; a client row left with only
such grants is deleted when the last of them leaves. Placements and the
pace are memory: a new instance counts each grant until its claim
deadline, and starts with a full burst that the window still bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..._common.clock import now_ms
from ..messages import Report
from .pure.allocation import Changes, Grant, ResolutionFailed, RoundResult
from .pure.rate import RATE_CLAIM_MS, Pace, Rate, next_start_at, rate_room, stamped, starts_in_window

log = logging.getLogger("durability.semaphore")


class StartRate:
    def __init__(self, option: Any) -> None:
        if option is not None and not callable(option):
            option = Rate.parse(option)  # a bad constant is the user's error, at once
        self.option = option
        self.last: Rate | None = None if callable(option) else option  #: the rate the latest round read (for ``usage``)
        #: grant id -> when the holder knew its client had heard of it (``rate.started_by``)
        self.placed_at: dict[str, float] = {}
        self.pace = Pace()

    def read(self) -> Rate | None | ResolutionFailed:
        """The rate for one round: None (no rate), or what the callable said."""
        if not callable(self.option):
            self.last = self.option
            return self.last
        try:
            value = self.option()
            self.last = None if value is None else Rate.parse(value)
        except Exception as error:
            log.exception("the rate callback failed; nothing starts this round")
            return ResolutionFailed(error)
        return self.last

    def read_quietly(self) -> Rate | None:
        """``read``, with a failing callable taken as no rate (a new instance
        deriving its timers; its rounds fail closed all the same)."""
        rate = self.read()
        return None if isinstance(rate, ResolutionFailed) else rate

    def placed(self) -> Mapping[str, float]:
        return self.placed_at

    def heard(self, client_id: str, reports: Iterable[Report], book: Mapping[str, Grant]) -> None:
        """A client's report that every permit of a grant is released places
        the grant's starts before now: nothing more starts on it. (A grant
        in a reply to a request is placed so; one a call brought, when the
        call is answered.)"""
        if self.option is None:
            return
        now = now_ms()
        for report in reports:
            grant = book.get(report.grant_id)
            if grant is not None and grant.client_id == client_id and report.released >= grant.permits:
                self.placed_at.setdefault(grant.grant_id, now)

    @staticmethod
    def grant_timeout_ms(rate: Rate | None, usual_ms: float) -> float:
        """A grant under a start rate must be taken up within ``RATE_CLAIM_MS``
        (or the usual timeout, if shorter): its starts count until then
        when the holder cannot place them sooner."""
        return usual_ms if rate is None else min(usual_ms, RATE_CLAIM_MS)

    def stamp(self, changes: Changes) -> None:
        """Grants a change writes anyway carry the placement this instance
        learned of them (``rate.stamped``)."""
        rate = self.last
        if rate is None or not self.placed_at:
            return
        for grant_id, grant in list(changes.written.items()):
            at = self.placed_at.get(grant_id)
            if at is not None and grant.kept_until and not grant.placed_at:
                changes.written[grant_id] = stamped(grant, at, rate)

    def pace_room(self, rate: Rate | None, now: float) -> int | None:
        """The pace's room, when a burst could raise the average (else None: the window bounds it)."""
        return self.pace.room(now, rate) if rate is not None and rate.burst else None

    def after_round(self, rate: Rate | None, result: RoundResult, now: float, book: Mapping[str, Grant]) -> None:
        """The pace moves by what the round granted; placements of grants the
        book no longer keeps are dropped."""
        if rate is not None:
            granted = sum(g.permits for outcome in result.outcomes.values() for g in outcome.new_grants)
            self.pace.started(granted, now, rate)
        if len(self.placed_at) > 2 * len(book) + 64:
            for grant_id in [i for i in self.placed_at if i not in book]:
                del self.placed_at[grant_id]

    def next_at(self, rate: Rate | None, grants: Iterable[Grant], now: float) -> float | None:
        """When a round may start more than the latest could (None: no rate, or never)."""
        if rate is None:
            return None
        return next_start_at(grants, self.placed(), now, rate, self.pace if rate.burst else None)

    def usage(self, grants: Iterable[Grant], now: float) -> dict[str, Any] | None:
        """The rate as the latest round read it, and its window now."""
        rate = self.last
        if rate is None:
            return None
        grants = list(grants)
        placed = self.placed()
        pace = self.pace if rate.burst else None
        return {"limit": rate.limit, "period_ms": rate.period_ms, "burst": rate.burst,
                "starts_in_window": starts_in_window(grants, placed, now, rate),
                "room": rate_room(grants, placed, now, rate, pace),
                "next_start_at": next_start_at(grants, placed, now, rate, pace)}
