"""Caller transforms: wrappers a client applies around each call it makes.

Lives here: ``timeout``. Must not know: what is being called.
A transform is ``async (call, *args) -> result``; ``call()`` makes the call.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

from ._common.checks import number_in


async def timeout(call: Callable[[], Awaitable[Any]], ms: float) -> Any:
    """Fail with ``TimeoutError`` when ``call()`` takes longer than ``ms`` milliseconds."""
    if not number_in(ms, 0, math.inf) or ms == 0:
        raise ValueError(f"timeout must be a positive number of milliseconds, not {ms!r}")
    return await asyncio.wait_for(call(), ms / 1000)
