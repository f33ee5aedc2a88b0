"""The holder's start rates: the user's options read once per round, their paces, and where grants were placed.

Lives here: ``StartRate``: the ``rate=`` option (the key's) and the
``group_rate=`` option (a group's own), each a constant checked when the
holder is made or a callable read once per round, failing closed; the
paces that keep a burst from raising an average (memory); the times the
holder learned a grant's client had heard of it (memory: calls answered,
releases reported); when the next round may start more; and what
``usage()`` says of the rates. Must not know: how a round decides
(``holder/pure/rate`` does), storage, or the wire.

Cost: nothing per admission beyond what a grant costs already. The
window is the grant book: a grant stays in its client's row, settled,
until its starts leave the window (``Grant.kept_until``), a field of the
row the grant and its release write anyway, and so does its placement
(``stamp``); a client row left with only such grants is deleted when the
last of them leaves. A new instance starts with full bursts, which the
windows still bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._common.clock import now_ms
from ..messages import Report
from .pure.allocation import Changes, Grant, ResolutionFailed, RoundResult
from .pure.rate import RATE_CLAIM_MS, Pace, Rate, next_start_at, rate_room, stamped, starts_in_window

log = logging.getLogger("durability.semaphore")


@dataclass
class RoundRates:
    """The rates one round decides under."""

    key: Rate | None = None
    groups: dict[str, Rate] = field(default_factory=dict)
    failed: dict[str, ResolutionFailed] = field(default_factory=dict)  #: groups whose rate callback raised

    def __bool__(self) -> bool:
        return self.key is not None or bool(self.groups)


def _checked(option: Any) -> Any:
    if option is not None and not callable(option):
        return Rate.parse(option)  # a bad constant is the user's error, at once
    return option


def _read_groups(option: Callable[[str], Any], groups: Iterable[str], rates: RoundRates) -> None:
    for group in sorted(set(groups)):
        try:
            value = option(group)
            if value is not None:
                rates.groups[group] = Rate.parse(value)
        except Exception as error:
            log.exception("the group_rate callback failed for %r; the group waits this round", group)
            rates.failed[group] = ResolutionFailed(error)


class StartRate:
    def __init__(self, option: Any, group_option: Callable[[str], Any] | None = None) -> None:
        self.option = _checked(option)
        if group_option is not None and not callable(group_option):
            raise ValueError(f"group_rate must be a callable of the group, not {group_option!r}")
        self.group_option = group_option
        #: grant id -> when the holder knew its client had heard of it (``rate.started_by``)
        self.placed_at: dict[str, float] = {}
        self.pace = Pace()
        self.group_paces: dict[str, Pace] = {}
        self.last = RoundRates(None if callable(self.option) else self.option)  #: the rates the latest round read

    @property
    def on(self) -> bool:
        return self.option is not None or self.group_option is not None

    def read(self, groups: Iterable[str]) -> RoundRates | ResolutionFailed:
        """The rates for one round: the key's (a callable that raises fails the
        round closed) and those of ``groups`` (one that raises fails its group)."""
        rates = RoundRates()
        try:
            value = self.option() if callable(self.option) else self.option
            rates.key = None if value is None else Rate.parse(value)
        except Exception as error:
            log.exception("the rate callback failed; nothing starts this round")
            return ResolutionFailed(error)
        if self.group_option is not None:
            _read_groups(self.group_option, groups, rates)
        self.last = rates
        return rates

    def read_quietly(self, groups: Iterable[str]) -> RoundRates:
        """``read``, a failing callable taken as no rate (a new instance
        deriving its timers; its rounds fail closed all the same)."""
        rates = self.read(groups)
        return RoundRates() if isinstance(rates, ResolutionFailed) else rates

    def round_options(self, rates: RoundRates, now: float) -> dict[str, Any]:
        """What ``run_round`` takes of the rates."""
        return {"rate": rates.key, "group_rates": rates.groups, "placed": self.placed_at,
                "pace_room": self.pace.room(now, rates.key) if rates.key is not None and rates.key.burst else None,
                "group_pace_room": {g: self._group_pace(g).room(now, r) for g, r in rates.groups.items() if r.burst}}

    def _group_pace(self, group: str) -> Pace:
        return self.group_paces.setdefault(group, Pace())

    def heard(self, client_id: str, reports: Iterable[Report], book: Mapping[str, Grant]) -> None:
        """A client's report that every permit of a grant is released places
        the grant's starts before now: nothing more starts on it. (A grant
        in a reply to a request is placed so; one a call brought, when the
        call is answered.)"""
        if not self.on:
            return
        now = now_ms()
        for report in reports:
            grant = book.get(report.grant_id)
            if grant is not None and grant.client_id == client_id and report.released >= grant.permits:
                self.placed_at.setdefault(grant.grant_id, now)

    @staticmethod
    def grant_timeout_ms(rates: RoundRates, usual_ms: float) -> float:
        """A grant under a start rate must be taken up within ``RATE_CLAIM_MS``
        (or the usual timeout, if shorter): its starts count until then
        when the holder cannot place them sooner."""
        return min(usual_ms, RATE_CLAIM_MS) if rates else usual_ms

    def stamp(self, changes: Changes) -> None:
        """Grants a change writes anyway carry the placement this instance
        learned of them (``rate.stamped``)."""
        if not self.placed_at:
            return
        for grant_id, grant in list(changes.written.items()):
            at = self.placed_at.get(grant_id)
            if at is not None and grant.kept_until and not grant.placed_at:
                changes.written[grant_id] = stamped(grant, at)

    def after_round(self, rates: RoundRates, result: RoundResult, now: float, book: Mapping[str, Grant]) -> None:
        """The paces move by what the round granted; placements of grants the
        book no longer keeps are dropped."""
        new = [g for outcome in result.outcomes.values() for g in outcome.new_grants]
        if rates.key is not None:
            self.pace.started(sum(g.permits for g in new), now, rates.key)
        for group, rate in rates.groups.items():
            self._group_pace(group).started(sum(g.permits for g in new if g.group == group), now, rate)
        if len(self.placed_at) > 2 * len(book) + 64:
            for grant_id in [i for i in self.placed_at if i not in book]:
                del self.placed_at[grant_id]

    def next_at(self, rates: RoundRates, held_back: Iterable[str], grants: Iterable[Grant],
                now: float) -> float | None:
        """When a round may start more of the groups a rate ``held_back`` (None: never)."""
        grants = list(grants)
        key_at = self._next(rates.key, self.pace, grants, now) if rates.key is not None else now
        if key_at is None:
            return None
        times = []
        for group in held_back:
            rate = rates.groups.get(group)
            group_at = now if rate is None else self._next(rate, self._group_pace(group),
                                                          [g for g in grants if g.group == group], now)
            if group_at is not None:
                times.append(max(key_at, group_at))
        return min(times, default=None)

    def _next(self, rate: Rate, pace: Pace, grants: list[Grant], now: float) -> float | None:
        return next_start_at(grants, self.placed_at, now, rate, pace if rate.burst else None)

    def usage(self, grants: Iterable[Grant], now: float, group: str | None = None) -> dict[str, Any] | None:
        """A rate as the latest round read it (the key's, or ``group``'s own), and its window now."""
        rate = self.last.key if group is None else self.last.groups.get(group)
        if rate is None:
            return None
        grants = [g for g in grants if group is None or g.group == group]
        pace = (self.pace if group is None else self._group_pace(group)) if rate.burst else None
        return {"limit": rate.limit, "period_ms": rate.period_ms, "burst": rate.burst,
                "starts_in_window": starts_in_window(grants, self.placed_at, now, rate),
                "room": rate_room(grants, self.placed_at, now, rate, pace),
                "next_start_at": next_start_at(grants, self.placed_at, now, rate, pace)}
