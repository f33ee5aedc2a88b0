"""DurabilitySemaphore.client(): binding or namespace, invoke, transforms, pacing memory."""

import asyncio

import pytest

from durability.semaphore import DurabilitySemaphore, SemaphoreClient
from durability.transforms import timeout
from support import holders_runtime


def request(client, count):
    return {"type": "request", "v": 1, "clientId": client,
            "demand": [{"group": "g", "count": count, "oldestAt": 0}], "grants": []}


@pytest.fixture
def runtime():
    with holders_runtime() as rt:
        yield rt


def test_a_bound_client_reaches_the_holder_and_remembers_next_request_at(runtime):
    client = DurabilitySemaphore.client(binding="HOLDER").bind(runtime.env)

    async def scenario():
        assert client.next_request_at("holder") is None
        reply = await client.request("holder", request("a", 2))
        return reply, client.next_request_at("holder")

    reply, remembered = runtime.run(scenario())
    assert [g["permits"] for g in reply["grants"]] == [2]
    assert remembered == reply["nextRequestAt"]


def test_the_namespace_escape_hatch_and_a_custom_invoke(runtime):
    calls = []

    async def invoke(stub, message):
        calls.append(stub.name)
        return await stub.permits(message)

    factory = DurabilitySemaphore.client(namespace=lambda env: env.HOLDER, invoke=invoke)

    async def scenario():
        return await factory.bind(runtime.env).request("holder-b", request("a", 1))

    assert runtime.run(scenario())["type"] == "grants"
    assert calls == ["holder-b"]


def test_transforms_compose_a_timeout(runtime):
    slow = DurabilitySemaphore.client(binding="HOLDER").with_(timeout, 500)  # rounds wait 1 s
    quick = DurabilitySemaphore.client(binding="HOLDER").with_(timeout, 5_000)

    async def scenario():
        with pytest.raises(TimeoutError):
            await slow.bind(runtime.env).request("holder", request("a", 1))
        return await quick.bind(runtime.env).request("holder", request("b", 1))

    assert runtime.run(scenario())["type"] == "grants"


def test_bad_factory_options_are_refused():
    with pytest.raises(ValueError):
        DurabilitySemaphore.client()
    with pytest.raises(ValueError):
        DurabilitySemaphore.client(binding="A", namespace=lambda env: env.A)
    with pytest.raises(ValueError):
        DurabilitySemaphore.client(binding="")
    with pytest.raises(ValueError):
        asyncio.run(timeout(lambda: asyncio.sleep(0), 0))


def test_the_client_is_transport_independent():
    sent = []

    async def send(key, message):
        sent.append((key, message["type"]))
        return {"type": "grants", "v": 1, "grants": [], "reports": [], "blocked": [], "nextRequestAt": 42}

    client = SemaphoreClient(send)
    asyncio.run(client.request("k", {"type": "request"}))
    asyncio.run(client.sync("k", {"type": "sync"}))
    assert sent == [("k", "request"), ("k", "sync")] and client.next_request_at("k") == 42
