"""``env`` as a Worker's code meets it in the embedded runtime: its vars, its namespaces and their stubs.

Lives here: ``Env`` (bindings and vars as attributes),
``DurableObjectNamespace`` (ids from a name, from hex digits or new, and
stubs for them) and ``DurableObjectStub``, whose method calls copy their
arguments at the call and hand them to the runtime. Must not know: how a
call travels or what runs it; the runtime owns the journey of an RPC call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._storage import DurableObjectId
from ._values import JsException, rpc_copy

if TYPE_CHECKING:
    from ._runtime import Runtime

_HEX_DIGITS = set("0123456789abcdef")


class DurableObjectNamespace:
    """``env.BINDING`` for a Durable Object class."""

    def __init__(self, runtime: Runtime, class_name: str, cls: type) -> None:
        self._runtime = runtime
        self.class_name = class_name
        self.cls = cls

    def idFromName(self, name: str) -> DurableObjectId:
        if not isinstance(name, str):
            raise JsException("idFromName() takes a string", name="TypeError")
        return DurableObjectId(self.class_name, name)

    def idFromString(self, hex_id: str) -> DurableObjectId:
        if not (isinstance(hex_id, str) and len(hex_id) == 64 and set(hex_id) <= _HEX_DIGITS):
            raise JsException("Invalid Durable Object ID: must be 64 hex digits", name="TypeError")
        return DurableObjectId(self.class_name, None, hex_id)

    def newUniqueId(self, options: Any = None) -> DurableObjectId:
        hex_id = f"{self._runtime.rng.getrandbits(256):064x}"
        return DurableObjectId(self.class_name, None, hex_id)

    def get(self, object_id: DurableObjectId, options: Any = None) -> DurableObjectStub:
        if not isinstance(object_id, DurableObjectId):
            raise JsException("get() takes a DurableObjectId", name="TypeError")
        return DurableObjectStub(self._runtime, self, object_id)

    def getByName(self, name: str, options: Any = None) -> DurableObjectStub:
        return self.get(self.idFromName(name))


class DurableObjectStub:
    """A stub: each public method call travels as RPC, copying both ways.

    A call that fails breaks the stub, whatever failed: later calls fail the
    same way until a new stub is made with ``get`` or ``getByName``. Some
    errors leave a production stub usable, but code that recreates its
    stub after every error is right in every case.
    """

    def __init__(self, runtime: Runtime, namespace: DurableObjectNamespace,
                 object_id: DurableObjectId) -> None:
        self._runtime = runtime
        self._namespace = namespace
        self.id = object_id
        self.name = object_id.name
        self._broken: JsException | None = None

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Awaitable[Any]:
            if kwargs:  # the SDK sends keyword arguments as one trailing object
                args = (*args, kwargs)
            sent = [rpc_copy(arg) for arg in args]  # refusals raise here, at the call
            return self._runtime._send(self, method, sent)

        return call


class Env:
    """``env``: bindings and vars as attributes."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"Env({', '.join(sorted(self.__dict__))})"
