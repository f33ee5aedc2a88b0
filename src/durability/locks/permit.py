"""``Permit``: a place held, renewed while its code runs, and the reasons it can be lost.

Lives here: the permit a hold gives its block, the task that renews its
lease (a third of the lease apart, sooner after a failed renewal) until
the place is freed or lost, ``lost()`` that reads the clock so that a stall
is seen at once, and freeing the place at the end. Must not know: how a
place is acquired, or the holder's rules or storage; it calls the holder
object through its semaphore, with the messages of ``messages``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Literal

from .._common.clock import now_ms, sleep_until
from . import messages as m
from .options import HoldOptions, PlaceLost
from .timing import RETRY_MAX_MS

if TYPE_CHECKING:
    from .client import Semaphore

log = logging.getLogger("durability.locks")

# Why a permit was lost.
LossReason = Literal["expired", "renewal_failed", "max_hold", "revoked"]
EXPIRED: LossReason = "expired"  #: its lease ended with no renewal tried in time (the holder's code stalled)
RENEWAL_FAILED: LossReason = "renewal_failed"  #: renewals were tried and failed until the lease ended
MAX_HOLD: LossReason = "max_hold"  #: it reached max_hold
REVOKED: LossReason = "revoked"  #: the holder object no longer knows the place


class Permit:
    """A place held. ``lost()`` / ``signal`` tell its code when the place is no longer its own.

    Attributes:
        key: the key it holds a place of.
        signal: an ``asyncio.Event`` set when the place is lost.
        reason: why it was lost (``expired``, ``renewal_failed``, ``max_hold``,
            ``revoked``), None while it holds.
        valid_until: epoch ms until which the place is surely this permit's;
            renewals move it later.
    """

    def __init__(self, semaphore: Semaphore, key: str, token: str, valid_until: float, final: bool,
                 options: HoldOptions) -> None:
        self.key = key
        self.signal = asyncio.Event()
        self.reason: LossReason | None = None
        self.valid_until = valid_until
        self._semaphore = semaphore
        self._token = token
        self._final = final
        self._options = options
        self._ended = False
        self._renewal_failed = False  #: the last renewal did not go through
        self._renewals = asyncio.ensure_future(self._renew_until_lost())

    def __repr__(self) -> str:
        state = f"lost ({self.reason})" if self.reason else "held"
        return f"<Permit {self._semaphore.name}:{self.key} {state}>"

    def lost(self) -> bool:
        """True once the place may be someone else's. Reads the clock, so a stall is seen at once."""
        if not self._ended and self.reason is None and now_ms() >= self.valid_until:
            self._lose(MAX_HOLD if self._final else RENEWAL_FAILED if self._renewal_failed else EXPIRED)
        return self.reason is not None

    def check(self) -> None:
        """Raise ``PlaceLost`` if the place is lost: call it before an effect that needs the place."""
        if self.lost():
            raise PlaceLost(f"the place of {self._semaphore.name}:{self.key} was lost ({self.reason})",
                            str(self.reason))

    def _lose(self, reason: LossReason) -> None:
        if self.reason is None:
            self.reason = reason
            self.signal.set()

    async def _renew_until_lost(self) -> None:
        interval = self._options.ttl_ms / 3  # two more chances before the lease ends
        retry = min(RETRY_MAX_MS, interval / 3)
        next_at = now_ms() + interval
        while True:
            if self._final:  # max_hold reached: nothing to renew, the lease runs out
                await sleep_until(self.valid_until)
                self.lost()
                return
            await sleep_until(min(next_at, self.valid_until))
            sent = now_ms()
            if sent >= self.valid_until:  # renewals failed, or this code did not run in time
                self._lose(RENEWAL_FAILED if self._renewal_failed else EXPIRED)
                return
            try:
                reply = await self._semaphore._call(
                    self.key, "semaphore_renew", m.token_message(self._token), self.valid_until - sent
                )
            except Exception as error:  # lost, late or failing: try again soon, until the lease ends
                log.info("semaphore %s: renewal of %s failed: %r", self._semaphore.name, self.key, error)
                self._renewal_failed, next_at = True, now_ms() + retry
                continue
            if reply.status == m.RENEWED:
                self._renewal_failed, next_at = False, sent + interval
                self.valid_until = max(self.valid_until, sent + reply.lease_ms)
                self._final = reply.final
            elif reply.refused is not None and reply.refused.code == m.NOT_HOLDER:
                self._lose(REVOKED)
                return
            else:
                self._renewal_failed, next_at = True, now_ms() + retry

    async def _end(self) -> bool:
        """Stop renewing and free the place; return whether it was lost before."""
        lost = self.lost()
        self._ended = True
        self._renewals.cancel()
        await asyncio.gather(self._renewals, return_exceptions=True)
        # Even a lost place is released: the holder may still count it (a
        # renewal whose reply was lost moved its lease), and this frees it now.
        await self._semaphore._release(self.key, self._token)
        return lost
