"""The example Worker's uploads: at most three per user at once, held like a lock."""

import asyncio
import json

import pytest

from durability.testing import JsException


def test_a_fourth_upload_of_a_user_waits_and_then_is_turned_away(example):
    async def upload(user, work_ms, delay=0.0):
        await asyncio.sleep(delay)
        return (await example.call_entrypoint("upload", user, work_ms))["status"], example.now_ms() - start

    async def scenario():
        return await asyncio.gather(
            *(upload("ann", 20_000) for _ in range(3)),
            upload("ann", 1_000, delay=0.005),  # waits 10 s, the three hold for 20 s
            upload("bob", 1_000, delay=0.005),  # another user's places are their own
            upload("ann", 1_000, delay=15),  # stands in line until a place is free
        )

    start = example.now_ms()
    results = example.run(scenario())
    assert results[:3] == [("uploaded", 20_000)] * 3
    # Virtual times may end a few microseconds past the moment waited for.
    assert results[3] == ("busy", pytest.approx(10_005, abs=0.01))
    assert results[4] == ("uploaded", pytest.approx(1_005, abs=0.01))
    assert results[5] == ("uploaded", 21_000)


def test_the_upload_route(example):
    async def post(user, body, token="t0ken"):
        response = await example.fetch(f"https://x/users/{user}/uploads", method="POST",
                                       headers={"authorization": f"Bearer {token}"}, body=json.dumps(body))
        return response.status, json.loads(await response.text())

    async def scenario():
        return (await post("ann", {"work_ms": 500}), await post("ann", {"work_ms": -1}),
                await post("ann", {}, token="nope"))

    ok, bad, unauthorized = example.run(scenario())
    assert ok == (200, {"status": "uploaded"})
    assert bad[0] == 400 and "work_ms" in bad[1]["error"]
    assert unauthorized[0] == 401


def test_a_bad_upload_is_refused_before_any_call(example):
    with pytest.raises(JsException, match="user must be"):
        example.run(example.call_entrypoint("upload", "", 10))
    assert not [event for event in example.trace if event[2] == "call"]
