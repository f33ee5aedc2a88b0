"""Time as the library reads it: ``now_ms`` and ``sleep_until``.

Lives here: reading the wall clock in epoch milliseconds, and waiting for
a moment so that the clock really reads it afterwards. Must not know:
storage, timers, any primitive.

In production ``time.time()`` only moves after I/O, and Pyodide runs a
callback due within 2 ms at once: a wait for "the remaining 1 ms" returns
with the clock unmoved. Code that waits for a deadline uses
``sleep_until``, which never waits less than ``MIN_WAIT_S`` and checks
the clock again, so it neither wakes early nor spins.
"""

from __future__ import annotations

import asyncio
import time

MIN_WAIT_S = 0.005
# A wait ends a hair past its moment, so that float rounding of the clock
# cannot leave it just short (and so cost a second wait).
PAST_S = 0.000_001


def now_ms() -> float:
    # In production time.time() only moves after I/O: read it after awaits.
    return time.time() * 1000.0


def wait_s(until_ms: float) -> float:
    """Seconds to wait for ``until_ms``: never less than ``MIN_WAIT_S``."""
    return max(MIN_WAIT_S, (until_ms - now_ms()) / 1000 + PAST_S)


async def sleep_until(at_ms: float) -> None:
    """Return once the clock reads ``at_ms`` or later."""
    while now_ms() < at_ms:
        await asyncio.sleep(wait_s(at_ms))
