"""How the library reads a call between objects that failed.

Lives here: ``retryable(error)``, whether a failed call may simply be made
again (it may not have run, or its reply was lost). Must not know: any
protocol; the callers decide what a retry costs them.
"""

from __future__ import annotations

import asyncio


def retryable(error: BaseException) -> bool:
    """A call that may not have run, or whose reply was lost: call again.

    workerd marks such errors ``retryable`` (the connection was lost) or
    ``durableObjectReset`` (the object called was reset under the call);
    through Pyodide the marks sit on the ``js_error`` the exception carries.
    A timeout of the caller's own is one too.
    """
    if isinstance(error, asyncio.TimeoutError):
        return True
    for source in (error, getattr(error, "js_error", None)):
        if source is not None and (getattr(source, "retryable", False) or getattr(source, "durableObjectReset", False)):
            return True
    return False
