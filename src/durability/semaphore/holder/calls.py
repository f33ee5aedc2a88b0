"""How a holder reaches its clients: a round's news for a parked request, sent by a short call.

Lives here: ``ClientCalls``: whether a request may be parked (its client
said it can be called, and the holder was given its clients' namespace,
or, for a budget tree's child, the tree's client: a call to a child says
only "ask now"),
sending a client the latest reply a round made for it (one call at a
time per client, the newest reply replacing one not sent yet), what the
client sends back (its demand now, which the holder parks in place of
what it kept), and a failed call tried again later, on the scheduler's
alarm, never on a timer of its own. Must not know: how a round decides,
what a reply holds, or the line itself (``on_reply`` and ``on_failed``
tell the holder).

A call is billed as a request to the client ($0.15 per million), and
the holder is awake while it waits for the answer (milliseconds). A held
request instead keeps both objects awake for as long as it is held:
at 128 MB an object, $1.60 per million object-seconds each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..._common.clock import now_ms
from ..identity import SEPARATOR
from ..messages import ProtocolError, Request
from ..tree.pure.rules import key_of, parent_of

log = logging.getLogger("durability.semaphore")
#: the client object's RPC method a holder calls: ``semaphore_reply(key, reply)``
REPLY_METHOD = "semaphore_reply"
#: a failed call is tried again this long after, doubling, up to ``RETRY_MAX_MS``
RETRY_FIRST_MS = 500
RETRY_MAX_MS = 60_000
DELIVER = "deliver:"  #: the scheduler key of a call to try again: ``deliver:<client id>``


def object_id_of(client_id: str) -> str | None:
    """The id of the object a client speaks for (the 64 hex digits its queue
    puts after its label): how a holder reaches it. None if it has none."""
    object_id = client_id.rpartition(SEPARATOR)[2]
    return object_id if len(object_id) == 64 and all(c in "0123456789abcdef" for c in object_id) else None


@dataclass
class _Call:
    wire: dict[str, Any]  #: the reply to send
    version: int  #: the client's parked version it answers (see ``ParkedLine.refresh``)
    name: str | None  #: the client object's name, if its request gave one
    failures: int = 0


class ClientCalls:
    """The calls a holder makes to its clients' objects."""

    def __init__(self, namespace: Any, name: str, *, schedule: Callable[[str, float], Awaitable[None]],
                 cancel: Callable[[str], None], on_reply: Callable[[str, int, Request | None], Awaitable[None]],
                 on_failed: Callable[[str], None], listing: Callable[[str], dict[str, Any]],
                 first_listing: Callable[[Iterable[str]], set[str]], children: Any = None) -> None:
        """``listing(client_id)``: what a call tried again carries, read from the
        books when it leaves: a reply built for an earlier try may list a
        grant or lease settled since, which the client must never take up.
        ``first_listing(ids)``: of the grants and leases a call names as it
        leaves, those no reply or call named before, which it says are new
        (``HolderBooks.first_listing``): a call built by a round may leave
        after the client's own reply named them, and a try after a failed
        one may follow a call that arrived."""
        self.namespace = namespace  #: the clients' Durable Object namespace (None: they cannot be called)
        self.name = name  #: this holder's object's name (a tree's leaf's is not the key)
        #: a budget tree's parent: the ``SemaphoreClient`` of its holder class, which reaches its
        #: children (holders named ``<key>~child-<n>``) by name; None outside a tree
        self.children = children
        self.key = key_of(name)  #: the key this holder serves, as its clients know it
        self._schedule, self._cancel, self._listing = schedule, cancel, listing
        self._first_listing = first_listing
        self._on_reply, self._on_failed = on_reply, on_failed
        self._pending: dict[str, _Call] = {}  #: per client, the reply to send next
        self._sending: set[str] = set()
        self._unreachable: set[str] = set()  #: clients the last call to failed
        #: per client, the grants and leases the call on its way to it lists (see ``carried``)
        self._in_flight: dict[str, frozenset[str]] = {}
        #: under a start rate, grant id -> when a call that listed it was
        #: answered: its client had heard of it by then, and admits nothing
        #: more on it (the rate places the grant's starts by it,
        #: ``holder/pure/rate``); memory only. None: no rate, nothing kept
        self.placed: dict[str, float] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def can_call(self, request: Request) -> bool:
        """A request that may be parked: its client can be called, and asks to
        wait (its fallback: it asks again when the wait is over)."""
        return request.wake and request.wait_ms > 0 and self.can_reach(request.client_id)

    def send(self, client_id: str, wire: dict[str, Any], version: int, name: str | None) -> None:
        """Call the client with ``wire`` (now, or after the call in flight to it)."""
        failures = self._pending[client_id].failures if client_id in self._pending else 0
        self._pending[client_id] = _Call(wire, version, name, failures)
        if client_id not in self._sending:
            self._start(client_id)

    def can_reach(self, client_id: str) -> bool:
        """Can this client be called at all? A queue that speaks as its object's
        id, given the clients' namespace; a tree's child of this holder, by
        its name, through the tree's client."""
        if parent_of(client_id) is not None:
            return self.children is not None and parent_of(client_id) == self.name
        return self.namespace is not None and object_id_of(client_id) is not None

    def carried(self, client_id: str) -> frozenset[str]:
        """The ids of the grants and leases a call on its way to the client
        lists. The holder's own reply to the client leaves them out: the
        client then learns each only from that call, so a copy of it still
        on its way can never list one the client has since used, given back
        and forgotten (a new instance keeps no row of it), which it would
        take up again. Once the call ends, whatever it failed to say goes
        in the next listing."""
        return self._in_flight.get(client_id, frozenset())

    def failing(self, client_id: str) -> bool:
        """Did the last call to the client fail? (A call that gets through clears it.)"""
        return client_id in self._unreachable

    def owed(self, client_id: str) -> bool:
        return client_id in self._pending

    def drop(self, client_id: str) -> None:
        """The client spoke since: the reply to its own message told it as much."""
        if self._pending.pop(client_id, None) is not None:
            self._cancel(DELIVER + client_id)

    def retry(self, client_id: str) -> None:
        """The scheduler's timer for a call that failed: tried again with the client's listing as it is now."""
        call = self._pending.get(client_id)
        if call is not None and client_id not in self._sending:
            call.wire = self._listing(client_id)
            self._start(client_id)

    def _start(self, client_id: str) -> None:
        self._sending.add(client_id)
        task = asyncio.ensure_future(self._send_pending(client_id))
        self._tasks.add(task)  # a loop holds tasks weakly
        task.add_done_callback(self._tasks.discard)

    async def _send_pending(self, client_id: str) -> None:
        try:
            while (call := self._pending.get(client_id)) is not None:
                answer = await self._call(client_id, call)
                if answer is _FAILED:
                    self._unreachable.add(client_id)
                    call.failures += 1
                    self._on_failed(client_id)
                    delay = min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** (call.failures - 1))
                    await self._schedule(DELIVER + client_id, now_ms() + delay)
                    return
                self._unreachable.discard(client_id)
                if self._pending.get(client_id) is call:
                    del self._pending[client_id]
                    self._cancel(DELIVER + client_id)
                try:
                    await self._on_reply(client_id, call.version, answer)
                except Exception as error:  # (storage failing): a newer call still leaves, the line is kept
                    log.warning("semaphore %s: applying %s's answer failed: %r", self.key, client_id, error)
        finally:
            self._sending.discard(client_id)

    async def _call(self, client_id: str, call: _Call) -> Any:
        wire = call.wire
        if parent_of(client_id) is not None:
            # A tree's child hears of its loans only in replies to its own
            # requests: the call asks it to ask now. A copy of a call can
            # reach a later instance of the child, which keeps no memory of
            # the loans its old one gave back and saw settle: it would take
            # one up again, and hand out permits its parent no longer counts.
            wire = {**wire, "grants": []}
        wire = _marked_new(wire, self._first_listing)
        self._in_flight[client_id] = frozenset(
            [entry["grantId"] for entry in wire.get("grants", [])]
            + [entry["leaseId"] for entry in wire.get("leases", [])])
        try:
            answer = await self._deliver(client_id, call.name, wire)
        except Exception as error:  # tried again later; the client's own wait is the last resort
            log.info("semaphore %s: a call to %s failed (%d before): %r", self.key, client_id, call.failures, error)
            return _FAILED
        finally:
            del self._in_flight[client_id]
        if self.placed is not None:
            answered_at = now_ms()
            for entry in wire.get("grants", []):
                self.placed.setdefault(entry["grantId"], answered_at)
        if answer is None:
            return None
        try:
            request = Request.parse(answer)
        except ProtocolError as error:
            log.warning("semaphore %s: %s answered a call with a malformed request: %s", self.key, client_id, error)
            return None
        return request if request.client_id == client_id else None


    async def _deliver(self, client_id: str, name: str | None, wire: dict[str, Any]) -> Any:
        """Send the client ``wire``; its answer. A tree's child is a holder: the
        call goes to the RPC method its own clients use (it reads the
        round's reply there), by the child's name, which is its client id."""
        if parent_of(client_id) is not None:
            return await self.children.sync(client_id, wire)
        return await getattr(self._stub(client_id, name), REPLY_METHOD)(self.key, wire)

    def _stub(self, client_id: str, name: str | None) -> Any:
        """The client's object: by its name if it gave one (an object reached
        by its id alone has no ``ctx.id.name`` in production), else by its id."""
        if name is not None:
            return self.namespace.getByName(name)
        return self.namespace.get(self.namespace.idFromString(object_id_of(client_id)))


def _marked_new(wire: dict[str, Any], first_listing: Callable[[Iterable[str]], set[str]]) -> dict[str, Any]:
    """``wire`` with each grant and lease it lists said new if, and only if,
    no reply or call named it before."""
    grants, leases = wire.get("grants", []), wire.get("leases", [])
    new = first_listing([entry["grantId"] for entry in grants] + [entry["leaseId"] for entry in leases])
    return {**wire, "grants": [{**entry, "new": entry["grantId"] in new} for entry in grants],
            "leases": [{**entry, "new": entry["leaseId"] in new} for entry in leases]}


_FAILED = object()
