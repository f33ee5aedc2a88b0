"""How workerd calls into a Python Worker, for the Pyodide host.

Lives here: constructing an object from JavaScript ``ctx`` / ``env``, calling
an RPC method (arguments through ``python_from_rpc``, the reply through
``python_to_rpc``, as workerd's Python entrypoint does), calling ``fetch``
with the JavaScript Request, calling ``alarm``
with its raw info object and relaxed arity, calling ``queue`` with a batch, and listing a module's
entrypoint classes. Must not know: storage, stubs, time (the JavaScript
side owns them) or any Worker.
"""

import inspect

from pyodide.code import relaxed_call
from workers import DurableObject, WorkerEntrypoint, python_from_rpc, python_to_rpc


def construct(cls, ctx, env):
    return cls(ctx, env)


async def call_method(instance, name, *args):
    method = getattr(instance, name, None) if not name.startswith("_") else None
    if not callable(method):
        from js import TypeError as JsTypeError

        raise JsTypeError.new(f"Method {name} does not exist")
    result = method(*[python_from_rpc(arg) for arg in args])
    if inspect.isawaitable(result):
        result = await result
    return python_to_rpc(result)


async def call_fetch(instance, request):
    """``fetch`` gets the JavaScript Request as it is: workerd converts nothing for it."""
    return await instance.fetch(request)


async def call_queue(instance, batch):
    """``queue`` as workerd calls a class entrypoint's handler: the batch,
    then env and ctx as undefined (they are on the instance)."""
    result = instance.queue(batch, None, None)
    if inspect.isawaitable(result):
        await result


async def call_alarm(instance, info):
    result = relaxed_call(instance.alarm, info)
    if inspect.isawaitable(result):
        await result


def entrypoint_classes(module):
    """Exported Durable Object and entrypoint classes, by kind."""
    found = {"durableObjects": [], "workerEntrypoints": []}
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or not inspect.isclass(value):
            continue
        if issubclass(value, DurableObject) and value is not DurableObject:
            found["durableObjects"].append(name)
        elif issubclass(value, WorkerEntrypoint) and value is not WorkerEntrypoint:
            found["workerEntrypoints"].append(name)
    return found
