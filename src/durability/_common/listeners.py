"""Telling a user's listener of an event: best effort, so that a failing listener never fails its caller.

Lives here: ``notify``, which calls a listener, awaits what it returns if
that is awaitable, and logs what it raises. Must not know: any event's type
or what the caller does next.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

E = TypeVar("E")


async def notify(listener: Callable[[E], Any] | None, event: E, log: logging.Logger, failed: str,
                 *args: Any) -> None:
    """Hand ``event`` to ``listener`` (None: nobody listens); if it raises,
    log ``failed % args`` with the error and carry on."""
    if listener is None:
        return
    try:
        result = listener(event)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception(failed, *args)
