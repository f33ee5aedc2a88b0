"""How the semaphore's client times its calls to a holder object: slack, backoff, attempts.

Lives here: how much longer than it asked to wait a call may take before
the client calls again, the backoff between retries of a lost call, and
how many times a call is tried. Both the calls of ``client`` and the
permit's renewals (``permit``) go by them. Must not know: the messages,
the places, the clock.
"""

from __future__ import annotations

# A call may take this much longer than it asked to wait before the client
# stops waiting for its reply and calls again under the same request id.
CALL_SLACK_MS = 10_000
# Retries after a lost call: quick at first, never slower than this.
RETRY_FIRST_MS = 100
RETRY_MAX_MS = 2_000
# Even a try, or a wait that has run out, retries a lost call this many times:
# a lost reply says nothing about whether a place was free.
MIN_ATTEMPTS = 3
RELEASE_ATTEMPTS = 3


def _backoff(attempt: int) -> float:
    doubling: int = 2 ** attempt  # attempt >= 0: an int (typeshed cannot tell int ** int from a float)
    return min(RETRY_MAX_MS, RETRY_FIRST_MS * doubling)
