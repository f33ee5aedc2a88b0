"""Reaching a holder: the transport-independent client and the factory that binds it to env.

Lives here: ``SemaphoreClient`` (send a message to the holder of a key,
remember each key's ``nextRequestAt``) and ``SemaphoreClientFactory``, which
finds the holder's namespace in a caller's ``env``, reaches the holder with
``getByName(key)`` (or, over a budget tree, the leaf holder of the key that
serves the message's client) and composes caller transforms such as a timeout.
Must not know: the holder's rules or storage, or how a message is spelled
(it carries them as the wire's dicts; ``messages`` reads the pacing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .messages import pacing_in
from .tree.pure.rules import check_shape, holder_for

Message = dict[str, Any]  #: a message or a reply, as the wire format spells it
Send = Callable[[str, Message], Awaitable[Message]]
Transform = Callable[..., Awaitable[Any]]  # (call, *args) -> result of call(), transformed


class SemaphoreClient:
    """Sends semaphore messages for keys; knows when each key may be asked again."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._next_request_at: dict[str, float] = {}

    def next_request_at(self, key: str) -> float | None:
        """The earliest time (epoch ms) the holder of ``key`` wants the next request."""
        return self._next_request_at.get(key)

    def paced(self, key: str, at_ms: float) -> None:
        """Remember pacing kept elsewhere (the queue's pacing table, read by a
        new instance); a later time the holder gave is kept."""
        self._next_request_at[key] = max(at_ms, self._next_request_at.get(key, at_ms))

    def ask_now(self, key: str) -> None:
        """The key asks at once, whatever pacing it had: a parked request's
        pacing is only its fallback (see ``DurabilitySemaphoreQueue(woken=)``)."""
        self._next_request_at.pop(key, None)

    def heard(self, key: str, reply: Message) -> None:
        """A reply that came by the holder's call: its pacing is the latest word."""
        next_at = pacing_in(reply)
        if next_at is not None:
            self._next_request_at[key] = next_at

    async def request(self, key: str, message: Message) -> Message:
        reply = await self._send(key, message)
        next_at = pacing_in(reply)
        if next_at is not None:  # anything else is no pacing to keep
            self._next_request_at[key] = next_at
        return reply

    async def sync(self, key: str, message: Message) -> Message:
        return await self._send(key, message)


def _default_invoke(stub: Any, message: Message) -> Awaitable[Message]:
    reply: Awaitable[Message] = stub.permits(message)  # an RPC stub: the holder's reply
    return reply


class SemaphoreClientFactory:
    """``DurabilitySemaphore.client(binding="ACCOUNT_LIMIT", invoke=...)``.

    Args:
        binding: the name of the holder's Durable Object binding in ``env``.
        namespace: instead of ``binding``, ``env -> namespace`` (the escape hatch).
        invoke: ``(stub, message) -> awaitable reply``: which RPC method of the
            holder class answers (default: ``stub.permits(message)``).
        fan_out, depth: over a budget tree (holders made with ``parent=``),
            each client id reaches one leaf holder of the key, the same one
            always: ``depth`` levels below the root, ``fan_out`` children
            each (``fan_out ** depth`` leaves). None: the key's one holder.
    """

    def __init__(self, *, binding: str | None = None,
                 namespace: Callable[[Any], Any] | None = None,
                 invoke: Callable[[Any, Message], Awaitable[Message]] = _default_invoke,
                 transforms: tuple[tuple[Transform, tuple[Any, ...]], ...] = (),
                 fan_out: int | None = None, depth: int = 1) -> None:
        if fan_out is not None:
            check_shape(fan_out, depth)
        if (binding is None) == (namespace is None):
            raise ValueError("give exactly one of binding= (a name in env) or namespace= (env -> namespace)")
        if binding is not None and (not isinstance(binding, str) or not binding):
            raise ValueError("binding must be the non-empty name of a Durable Object binding")
        self.binding = binding
        self.namespace = namespace
        self.invoke = invoke
        self.transforms = transforms
        self.fan_out = fan_out
        self.depth = depth

    def with_(self, transform: Transform, *args: Any) -> SemaphoreClientFactory:
        """A factory whose every call goes through ``transform(call, *args)`` too."""
        return SemaphoreClientFactory(binding=self.binding, namespace=self.namespace, invoke=self.invoke,
                                      transforms=self.transforms + ((transform, args),),
                                      fan_out=self.fan_out, depth=self.depth)

    def holder_name(self, key: str, message: Message) -> str:
        """The name of the holder that answers ``message`` for ``key``."""
        client_id = message.get("clientId")
        if self.fan_out is None or not isinstance(client_id, str):
            return key  # a message without a client id is refused by whichever holder gets it
        return holder_for(key, client_id, self.fan_out, self.depth)

    def bind(self, env: Any) -> SemaphoreClient:
        """A client that reaches holders through ``env``."""
        if self.namespace is not None:
            namespace = self.namespace(env)
        else:
            assert self.binding is not None  # the constructor took exactly one of the two
            namespace = getattr(env, self.binding)

        async def send(key: str, message: Message) -> Message:
            async def direct() -> Message:
                # A fresh stub per call: a stub is broken once a call on it fails.
                return await self.invoke(namespace.getByName(self.holder_name(key, message)), message)

            call: Callable[[], Awaitable[Any]] = direct
            for transform, args in self.transforms:
                call = _wrap(transform, call, args)
            reply: Message = await call()  # a transform hands on the reply of the call it wraps
            return reply

        return SemaphoreClient(send)


def _wrap(transform: Transform, inner: Callable[[], Awaitable[Any]],
          args: tuple[Any, ...]) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        return await transform(inner, *args)

    return call
