"""The lock API as Python code meets it: durations in seconds, ``hold`` as an async context
manager, ``try_hold``'s contract, ``run`` / ``try_run``, typed results, and the names and
forms of the previous release kept for one more."""

import asyncio
import inspect
import typing
import warnings
from datetime import timedelta

import pytest

from durability import locks
from durability.locks import (
    FROM_OPEN,
    Hold,
    InvalidOption,
    PlaceLost,
    PlaceUsage,
    Semaphore,
    SemaphoreError,
    Tried,
    Usage,
    WaitTimeout,
    WouldBlock,
    parse_seconds,
    semaphore,
)
from support import approx, locks_runtime_fixture  # noqa: F401  (the runtime fixture)


class Recording:
    """A namespace that keeps every message its stubs send, to read the wire's units."""

    def __init__(self, namespace):
        self.namespace = namespace
        self.sent = []

    def getByName(self, name):
        stub, sent = self.namespace.getByName(name), self.sent

        class Stub:
            def __getattr__(self, method):
                def call(*args):
                    sent.append((method, *args))
                    return getattr(stub, method)(*args)

                return call

        return Stub()


def acquires(recording):
    return [message for method, *rest in recording.sent if method == "semaphore_acquire" for message in rest]


def calls(runtime):
    return [e for e in runtime.trace if e[2] == "call"]


# -- durations are seconds ---------------------------------------------------------------

def test_a_bare_ttl_of_30_is_30_seconds_and_goes_on_the_wire_as_30000_ms(runtime):
    recording = Recording(runtime.env.SLOTS)
    uploads = semaphore(recording, "uploads", limit=1, ttl=30)

    async def scenario():
        async with uploads.hold("u"):
            await asyncio.sleep(5)
            return await uploads.usage("u")

    seen = runtime.run(scenario())
    assert [m["ttlMs"] for m in acquires(recording)] == [30_000]
    assert seen.places[0].held_for == approx(5) and seen.places[0].lease_left == approx(25)


def test_a_wait_of_half_a_second_waits_500_ms(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, wait=0.5)

    async def scenario():
        async with uploads.hold("u"):
            start = runtime.now_ms()
            with pytest.raises(WaitTimeout, match="within 0.5 s"):
                async with uploads.hold("u"):
                    pass
            first = runtime.now_ms() - start
            with pytest.raises(WaitTimeout):
                await uploads.run("u", asyncio.sleep, 0, wait=timedelta(milliseconds=250))
            return first, runtime.now_ms() - start - first

    assert runtime.run(scenario()) == (approx(500), approx(250))


def test_max_hold_in_seconds_ends_the_place(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, ttl=1, max_hold=2.5)

    async def scenario():
        async with uploads.hold("u") as permit:
            await permit.signal.wait()
            return runtime.now_ms() - start, permit.reason

    start = runtime.now_ms()
    with pytest.raises(PlaceLost) as lost:
        runtime.run(scenario())
    assert lost.value.reason == "max_hold"
    assert runtime.now_ms() - start == approx(2_500)


@pytest.mark.parametrize("value, seconds", [(30, 30.0), (0.5, 0.5), (99.5, 99.5), (0, 0.0), ("500ms", 0.5),
                                            ("30s", 30.0), ("2m", 120.0), ("1.5h", 5_400.0),
                                            (timedelta(minutes=10), 600.0), ("100s", 100.0)])
def test_parse_seconds(value, seconds):
    assert parse_seconds(value, "wait") == seconds


@pytest.mark.parametrize("option", ["ttl", "wait", "max_hold"])
@pytest.mark.parametrize("bare", [100, 500, 30_000, 150.5])
def test_a_bare_number_that_reads_as_old_milliseconds_is_refused_with_the_spellings(runtime, option, bare):
    with pytest.raises(InvalidOption) as refused:
        semaphore(runtime.env.SLOTS, "uploads", limit=1, **{option: bare})
    text = str(refused.value)
    assert f"{option}={bare!r}" in text and f"'{bare!r}ms'" in text and f"'{bare!r}s'" in text
    semaphore(runtime.env.SLOTS, "uploads", limit=1, **{option: f"{bare!r}ms" if option == "ttl" else f"{bare!r}s"})
    assert calls(runtime) == []


def test_a_call_refuses_old_milliseconds_too_before_any_call(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    with pytest.raises(InvalidOption, match="wait=10000"):
        uploads.hold("u", wait=10_000)
    with pytest.raises(InvalidOption, match="max_hold=600000"):
        runtime.run(uploads.run("u", asyncio.sleep, 0, max_hold=600_000))
    with pytest.raises(InvalidOption, match="ttl must be at least 0.1 s"):
        semaphore(runtime.env.SLOTS, "uploads", limit=1, ttl=0.05)
    with pytest.raises(InvalidOption, match="key"):
        runtime.run(uploads.run("", asyncio.sleep, 0))
    assert calls(runtime) == []


# -- hold is an async context manager ----------------------------------------------------------

def test_hold_is_always_an_async_context_manager_and_calls_nothing_until_entered(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    made_by = (uploads.hold("u"), uploads.hold("u", wait=1), uploads.try_hold("u"), uploads.try_hold("u", max_hold=5))
    for made in made_by:
        assert isinstance(made, Hold) and not inspect.isawaitable(made)
        assert inspect.iscoroutinefunction(made.__aenter__) and inspect.iscoroutinefunction(made.__aexit__)
    with pytest.raises(TypeError):
        runtime.run(_await(uploads.hold("u")))
    assert calls(runtime) == []


async def _await(value):
    return await value


def test_the_public_calls_have_precise_return_types():
    hints = {name: [typing.get_type_hints(overload)["return"]
                    for overload in typing.get_overloads(getattr(Semaphore, name))]
             for name in ("hold", "try_hold", "run", "try_run")}
    assert hints["hold"][0] is Hold and hints["try_hold"][0] is Hold
    assert all(typing.get_origin(hint) is Tried for hint in hints["try_run"])
    assert typing.get_type_hints(Semaphore.usage)["return"] is Usage
    assert typing.get_type_hints(Hold.__aenter__)["return"] is locks.Permit
    assert typing.get_type_hints(Semaphore.hold)["wait"] == locks.CallDuration and FROM_OPEN is not None


def test_a_hold_gives_its_permit_and_frees_the_place_when_the_block_raises(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def scenario():
        with pytest.raises(ValueError):
            async with uploads.hold("u") as permit:
                assert (permit.key, permit.lost(), permit.reason) == ("u", False, None)
                raise ValueError("the block failed")
        return await uploads.usage("u")

    assert runtime.run(scenario()) == Usage(held=0, waiting=0, places=())


# -- try_hold ------------------------------------------------------------------------------------

def test_try_hold_raises_would_block_and_never_runs_its_block_without_a_place(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    ran = []

    async def scenario():
        async with uploads.hold("u"):
            with pytest.raises(WouldBlock) as busy:
                async with uploads.try_hold("u"):
                    ran.append("without a place")
            inside = await uploads.usage("u")
        async with uploads.try_hold("u") as permit:
            ran.append(permit.key)
        return busy.value, inside

    busy, inside = runtime.run(scenario())
    assert ran == ["u"] and (inside.held, inside.waiting) == (1, 0)
    assert isinstance(busy, SemaphoreError) and not isinstance(busy, TimeoutError)


def test_try_run_returns_tried_false_without_calling_fn(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    called = []

    async def scenario():
        async with uploads.hold("u"):
            busy = await uploads.try_run("u", called.append, "busy")
        return busy, await uploads.try_run("u", asyncio.sleep, 0, "free")

    assert runtime.run(scenario()) == (Tried(False), Tried(True, "free")) and called == []


# -- run ----------------------------------------------------------------------------------------

def test_run_passes_arguments_returns_the_result_and_frees_the_place_on_error(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def upload(name, size):
        return name, size, (await uploads.usage("u")).held

    async def failing():
        raise KeyError("nope")

    async def scenario():
        result = await uploads.run("u", upload, "file", 3)
        with pytest.raises(KeyError):
            await uploads.run("u", failing)
        return result, await uploads.usage("u")

    result, after = runtime.run(scenario())
    assert result == ("file", 3, 1) and after.held == 0


def test_usage_is_typed_in_seconds(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=2, ttl="3s")

    async def scenario():
        async with uploads.hold("u"):
            await asyncio.sleep(2)
            return await uploads.usage("u")

    seen = runtime.run(scenario())
    assert (seen.held, seen.waiting, len(seen.places)) == (1, 0, 1)
    place = seen.places[0]
    assert isinstance(place, PlaceUsage) and place.limit == 2
    assert place.held_for == approx(2) and 0 < place.lease_left <= 3


# -- what the previous release wrote keeps working for one more -----------------------------------------

def test_the_function_form_of_hold_and_try_hold_still_works_with_a_deprecation_warning(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def scenario():
        with pytest.warns(DeprecationWarning, match=r"await sem\.run\(key, fn"):
            plain = await uploads.hold("u", lambda: asyncio.sleep(0, result="done"))
        with pytest.warns(DeprecationWarning):
            seen = await uploads.hold("u", lambda permit: asyncio.sleep(0, result=permit.key))  # as before: the permit
        with pytest.warns(DeprecationWarning, match=r"try_run"):
            tried = await uploads.try_hold("u", lambda: 7)
        async with uploads.hold("u"):
            with pytest.warns(DeprecationWarning):
                busy = await uploads.try_hold("u", lambda: 8)
        return plain, seen, tried, busy

    assert runtime.run(scenario()) == ("done", "u", Tried(True, 7), Tried(False))


def test_the_warning_points_at_the_callers_line(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pending = uploads.hold("u", lambda: None)
    runtime.run(pending)
    assert [w.filename for w in caught] == [__file__]


def test_usage_read_as_a_dict_still_works_with_a_deprecation_warning(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def scenario():
        async with uploads.hold("u"):
            return await uploads.usage("u")

    seen = runtime.run(scenario())
    with pytest.warns(DeprecationWarning, match="usage.held"):
        assert (seen["held"], seen["waiting"], len(seen["places"])) == (1, 0, 1)
    with pytest.warns(DeprecationWarning):
        assert seen["places"][0]["leaseMs"] == seen.places[0].lease_left * 1_000


def test_parse_duration_keeps_its_milliseconds_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="parse_seconds"):
        assert locks.parse_duration(250, "wait") == 250.0
    with pytest.warns(DeprecationWarning):
        assert locks.parse_duration("30s", "wait") == 30_000.0


def test_the_old_names_still_import():
    from durability.locks import EXPIRED, MAX_HOLD, RENEWAL_FAILED, REVOKED, Permit, Tried, semaphore  # noqa: F401
    from durability.locks.client import Tried as TriedWhereItWas

    assert TriedWhereItWas is Tried
    assert (EXPIRED, MAX_HOLD, RENEWAL_FAILED, REVOKED) == ("expired", "max_hold", "renewal_failed", "revoked")
