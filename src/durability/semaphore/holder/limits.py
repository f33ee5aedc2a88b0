"""The user's limit callbacks, as a holder reads them: once per round, failing closed.

Lives here: ``UserLimits``: the limit (an int or a callable), the
per-group ceilings (``group_limit``) and ``can_grant``, resolved into
``allocation.Limits`` for a round's groups and clients, each failure
logged and turned into a refusal for what it covers (the limit, one
group, or one client's group). Must not know: rounds, storage, or the
wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

from ..._common.checks import is_int
from .pure.allocation import Limits, ResolutionFailed

log = logging.getLogger("durability.semaphore")


def non_negative_int(value: Any, what: str) -> int:
    if not is_int(value) or value < 0:
        raise TypeError(f"{what} must resolve to a non-negative int, not {value!r}")
    return value


class UserLimits:
    def __init__(self, limit: int | Callable[[], int], group_limit: Callable[[str], int | None] | None,
                 can_grant: Callable[[str, str], bool] | None) -> None:
        if not callable(limit):
            non_negative_int(limit, "limit")
        self.limit = limit
        self.group_limit = group_limit
        self.can_grant = can_grant

    def total(self) -> int | ResolutionFailed:
        return _resolve(self.limit) if callable(self.limit) else self.limit

    def ceiling(self, group: str) -> int | None | ResolutionFailed:
        """The group's own ceiling, or None (none of its own)."""
        return None if self.group_limit is None else _resolve(self.group_limit, group, optional=True)

    def for_round(self, wanted: Iterable[tuple[str, str]]) -> Limits:
        """Resolved once for a round: the limit, and for each (client, group)
        wanted, its group's ceiling and whether the client may be granted."""
        total = self.total()  # (first: the callbacks are called in the order users read them in)
        groups: dict[str, int | None | ResolutionFailed] = {}
        permitted: dict[tuple[str, str], bool] = {}
        for client_id, group in wanted:
            if self.group_limit is not None and group not in groups:
                groups[group] = self.ceiling(group)
            key = (client_id, group)
            if self.can_grant is not None and key not in permitted:
                try:
                    permitted[key] = bool(self.can_grant(*key))
                except Exception:
                    log.exception("can_grant raised for %s; refusing", key)
                    permitted[key] = False
        return Limits(total, groups, permitted)


@overload
def _resolve(fn: Callable[..., Any], *args: Any, optional: Literal[False] = False) -> int | ResolutionFailed: ...


@overload
def _resolve(fn: Callable[..., Any], *args: Any, optional: bool) -> int | None | ResolutionFailed: ...


def _resolve(fn: Callable[..., Any], *args: Any, optional: bool = False) -> int | None | ResolutionFailed:
    try:
        value = fn(*args)
        if optional and value is None:
            return None
        return non_negative_int(value, "a limit")
    except Exception as error:
        log.warning("limit callback failed for %s: %r", args or "the limit", error)
        return ResolutionFailed(error)
