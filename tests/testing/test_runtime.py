"""Objects, stubs and RPC in the embedded runtime, each as production behaves."""

import asyncio

import pytest

from durability.testing import Faults, JsDict, JsException, Runtime
from durability.testing._values import MAX_RPC_NESTING
from support import PROBE, probe_runtime


def run(runtime, scenario):
    return runtime.run(scenario())


def test_getbyname_and_idfromname_reach_the_same_object(probe):
    env = probe.env

    async def scenario():
        await env.PROBE.getByName("a").record("one")
        stub = env.PROBE.get(env.PROBE.idFromName("a"))
        return await stub.entries(), stub.name, stub.id.toString()

    entries, name, hex_id = run(probe, scenario)
    assert entries == ["one"] and name == "a"
    assert len(hex_id) == 64 and int(hex_id, 16) >= 0
    assert env.PROBE.idFromString(hex_id).equals(env.PROBE.idFromName("a"))
    with pytest.raises(JsException, match="64 hex digits"):
        env.PROBE.idFromString("xyz")
    assert env.PROBE.newUniqueId().name is None


def test_a_call_reaches_its_object_with_none_of_its_caller_s_contextvars(probe):
    # As in workerd, where each event reaches its object on its own: a copy of
    # the caller's context carried a queue's "admit() is running" flag into
    # the objects it called.
    assert probe.run(probe.env.PROBE.getByName("a").call_marked("b")) is None


def test_arguments_and_replies_are_copied_like_rpc(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        return (
            await stub.kinds({"a": 1}),
            await stub.attribute({"nested": {"x": 5}}, "nested"),
            await stub.echo(1, 2.0, "s", None, [1], {1: "k"}),
            await stub.give("float"),
        )

    kinds, nested, echoed, whole = run(probe, scenario)
    assert kinds == "JsDict"
    assert nested == {"x": 5} and isinstance(nested, JsDict)
    assert echoed == [1, 2, "s", None, [1], {"1": "k"}]
    assert type(echoed[1]) is int and type(whole) is int


def test_values_rpc_refuses(probe):
    stub = probe.env.PROBE.getByName("a")
    with pytest.raises(TypeError, match="cannot be sent over RPC"):
        stub.echo((1, 2))  # refused at the call, by the SDK, before sending
    with pytest.raises(TypeError, match="cannot be sent over RPC"):
        stub.echo(bytearray(b"x"))

    async def scenario():
        with pytest.raises(JsException) as returned_tuple:
            await stub.give("tuple")
        with pytest.raises(JsException) as returned_custom:
            await probe.env.PROBE.getByName("a").give("custom")
        return returned_tuple.value, returned_custom.value

    tuple_error, custom_error = run(probe, scenario)
    assert tuple_error.name == "PythonError"
    assert tuple_error.message.rstrip().endswith("TypeError: <class 'tuple'> cannot be sent over RPC.")
    assert custom_error.name == "DataCloneError"


def test_an_exception_crosses_as_an_error_carrying_its_message(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        with pytest.raises(JsException) as caught:
            await stub.fail("the message")
        with pytest.raises(JsException) as broken:  # a stub is broken after any error
            await stub.echo(1)
        return caught.value, broken.value, await probe.env.PROBE.getByName("a").echo(1)

    error, broken, echoed = run(probe, scenario)
    assert error.name == "PythonError"
    assert error.message.startswith("Traceback (most recent call last):")
    assert error.message.rstrip().endswith("ValueError: the message")
    assert broken is error
    assert echoed == [1]


def test_private_and_missing_methods_are_not_callable(probe):
    stub = probe.env.PROBE.getByName("a")
    with pytest.raises(AttributeError):
        stub._private  # noqa: B018 (the access is what raises)

    async def scenario():
        with pytest.raises(JsException, match="Method nope does not exist"):
            await stub.nope()

    run(probe, scenario)


def test_calls_interleave_only_where_the_callee_awaits_something_other_than_storage(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        # slow_record awaits a timer: another call runs inside that await.
        await asyncio.gather(stub.slow_record("A", 1), stub.record("B"))
        first = await stub.entries()
        # gated awaits storage: the input gate holds the second call back.
        await asyncio.gather(stub.gated("C"), stub.record("D"))
        second = (await stub.entries())[len(first):]
        return first, second

    first, second = run(probe, scenario)
    assert first == ["start A", "B", "end A"]
    assert second == ["before C", "after C", "D"]


def test_an_object_awaiting_another_object_keeps_receiving_calls(probe):
    env = probe.env

    async def scenario():
        caller = env.PROBE.getByName("caller")
        call = asyncio.ensure_future(caller.call_other("callee", "X"))
        await asyncio.sleep(0.5)
        await caller.record("meanwhile")
        await call
        return await caller.entries()

    assert run(probe, scenario) == ["calling X", "meanwhile", "called X"]


def test_eviction_drops_memory_keeps_storage_and_fails_waiting_calls(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.record("kept")
        waiting = asyncio.ensure_future(stub.slow_record("cut", 10))
        await asyncio.sleep(1)
        probe.evict(stub)
        with pytest.raises(JsException) as caught:
            await waiting
        with pytest.raises(JsException):  # the stub is broken after a reset
            await stub.echo(1)
        fresh = probe.env.PROBE.getByName("a")
        return caught.value, await fresh.entries(), await fresh.remembered()

    error, entries, memory = run(probe, scenario)
    assert error.message == "Network connection lost." and error.durableObjectReset
    assert entries == ["kept", "start cut"]  # the evicted call never reached its end
    assert memory == []  # a new instance starts with empty memory
    host = probe.host_of(probe.env.PROBE.getByName("a"))
    assert host.stats.evictions == 1 and host.stats.instances_created == 2
    assert [(name, detail) for _, name, event, detail in probe.trace if event == "evicted"] == [
        ("Probe:a", "Network connection lost.")]


def test_code_left_running_after_eviction_cannot_touch_storage(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.record("first")
        host = probe.host_of(stub)
        old_storage = host.instance.ctx.storage
        probe.evict(stub)
        with pytest.raises(JsException, match="reset"):
            old_storage.sql.exec("INSERT INTO log (what) VALUES ('zombie')")
        return await probe.env.PROBE.getByName("a").entries()

    assert run(probe, scenario) == ["first"]


def test_transaction_sync_rolls_back_writes_and_reraises(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        with pytest.raises(JsException, match="RuntimeError: rolled back"):
            await stub.write_then_fail("never")
        return await probe.env.PROBE.getByName("a").entries()

    assert run(probe, scenario) == []


def test_uncommitted_writes_are_lost_with_a_crash_and_nobody_saw_them():
    from durability.testing import Faults

    runtime = probe_runtime(faults=Faults(crash_before_commit=1.0, external=True))
    stub = runtime.env.PROBE.getByName("a")

    async def scenario():
        with pytest.raises(JsException, match="crashed before its writes committed"):
            await stub.record("lost")
        with runtime.no_faults():
            return await runtime.env.PROBE.getByName("a").entries()

    assert runtime.run(scenario()) == []
    runtime.close()


def test_entrypoint_calls_copy_like_a_service_binding(probe):
    async def scenario():
        return await probe.call_entrypoint("hello", "world")

    assert run(probe, scenario) == {"hello": "world"}


def test_billing_totals_count_requests_rows_and_alarm_writes(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.record("x")
        await stub.set_alarm_in(60_000)

    async def warm_up():  # the constructor's schema costs writes once
        await stub.entries()

    run(probe, warm_up)
    before = probe.totals()
    run(probe, scenario)
    after = probe.totals()
    assert after["requests"] - before["requests"] == 2
    # log insert (AUTOINCREMENT: row + sqlite_sequence), alarm_plan created
    # (two schema rows + 1) and inserted (row + key index), setAlarm
    assert after["rows_written"] - before["rows_written"] == 2 + 3 + 2 + 1


def test_block_concurrency_while_holds_every_other_event(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await asyncio.gather(stub.block(5), stub.record("waited"))
        return await stub.entries()

    assert run(probe, scenario) == ["block start", "block end", "waited"]


def test_wait_until_work_outlives_the_reply(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        reply = await stub.background("later")
        before = await stub.entries()
        await asyncio.sleep(2)
        return reply, before, await stub.entries()

    assert run(probe, scenario) == ("replied", [], ["later"])


def test_keyword_arguments_arrive_as_one_trailing_dict(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        return await stub.keywords(1, flag=True)

    assert run(probe, scenario) == {"first": 1, "options": {"flag": True}}


def test_async_transaction_rolls_back_across_its_awaits(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        with pytest.raises(JsException, match="async transaction fails"):
            await stub.async_transaction_fails("never")
        await asyncio.sleep(1)
        return await probe.env.PROBE.getByName("a").entries()

    assert run(probe, scenario) == []


def test_an_alarm_set_in_a_rolled_back_transaction_is_not_set(probe):
    async def scenario():
        return await probe.env.PROBE.getByName("a").alarm_in_failed_transaction()

    assert run(probe, scenario) is None


def test_reads_alone_open_no_write_batch(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.record("x")
        await asyncio.sleep(0.1)
        host = probe.host_of(stub)
        host.db.exec("SELECT what FROM log", ())
        return host.db.in_batch

    assert run(probe, scenario) is False


def test_an_object_past_its_requests_per_second_answers_overloaded():
    runtime = probe_runtime(max_requests_per_s=100)
    stub = runtime.env.PROBE.getByName("a")

    async def burst(count):
        results = await asyncio.gather(*(runtime.env.PROBE.getByName("a").echo(1) for _ in range(count)),
                                       return_exceptions=True)
        return [r for r in results if isinstance(r, JsException)], len(results)

    async def scenario():
        refused, sent = await burst(150)
        await asyncio.sleep(1.0)  # a second on, the window has room again
        again, _ = await burst(50)
        return refused, sent, again

    with runtime:
        refused, sent, again = runtime.run(scenario())
        host = runtime.host_of(stub)
        assert sent == 150 and len(refused) == 50 and not again
        assert all(e.overloaded and not e.retryable and "is overloaded" in str(e) for e in refused)
        # Refused calls never ran and are not billed; the peak is the limit.
        assert host.stats.requests == 150 and host.stats.overloaded == 50
        assert host.stats.peak_requests_per_s == 100
        assert sorted(host.stats.requests_by_second.values()) == [50, 100]
        assert runtime.totals()["overloaded"] == 50


def test_the_request_limit_can_be_lifted():
    with probe_runtime(max_requests_per_s=None) as runtime:
        async def scenario():
            return await asyncio.gather(*(runtime.env.PROBE.getByName("a").echo(1) for _ in range(3_000)))

        assert len(runtime.run(scenario())) == 3_000
        assert runtime.totals()["peak_requests_per_s"] == 3_000


def test_each_object_is_charged_the_cpu_its_code_ran_for():
    with probe_runtime() as runtime:
        busy, idle = runtime.env.PROBE.getByName("busy"), runtime.env.PROBE.getByName("idle")

        async def scenario():
            await busy.spin(40)
            await idle.echo(1)

        runtime.run(scenario())
        busy_stats, idle_stats = runtime.host_of(busy).stats, runtime.host_of(idle).stats
        # Both halves of the spin, on either side of its await, are counted.
        assert busy_stats.cpu_s >= 0.040
        assert idle_stats.cpu_s < busy_stats.cpu_s / 4
        assert busy_stats.cpu_ms_per_request >= 40


def test_an_object_whose_code_runs_past_its_cpu_limit_is_reset():
    with probe_runtime(cpu_limit_ms=60) as runtime:
        stub = runtime.env.PROBE.getByName("busy")

        async def scenario():
            await stub.record("kept in storage")
            within = [await stub.spin(40), await stub.spin(40)]  # each request tops the CPU time up
            try:
                await stub.spin(200)
                past = None
            except JsException as error:
                past = error
            fresh = runtime.env.PROBE.getByName("busy")
            return within, past, await fresh.remembered(), await fresh.entries()

        within, past, remembered, entries = runtime.run(scenario())
        assert within == ["spun", "spun"]
        assert past is not None and "exceeded its CPU time limit" in str(past)
        assert getattr(past, "durableObjectReset", False)
        assert remembered == [] and entries == ["kept in storage"]  # the instance went, storage stayed
        assert [e for _, name, e, _ in runtime.trace if name == "Probe:busy"].count("cpu limit") == 1


def test_the_cpu_limit_is_production_s_default_and_can_be_lifted_or_read_from_wrangler(tmp_path):
    with probe_runtime() as runtime:
        assert runtime.cpu_limit_ms == 30_000
    with probe_runtime(cpu_limit_ms=None) as runtime:
        assert runtime.run(runtime.env.PROBE.getByName("busy").spin(100)) == "spun"
    (tmp_path / "wrangler.toml").write_text(
        f'main = "{PROBE}"\n[limits]\ncpu_ms = 50\n'
        '[[durable_objects.bindings]]\nname = "PROBE"\nclass_name = "Probe"\n')
    with Runtime.from_wrangler(tmp_path / "wrangler.toml") as runtime:
        assert runtime.cpu_limit_ms == 50
        with pytest.raises(JsException, match="CPU time limit"):
            runtime.run(runtime.env.PROBE.getByName("busy").spin(200))


@pytest.mark.parametrize("depth", [100, 1_000, 100_000])
def test_a_value_nested_past_the_rpc_depth_is_refused_at_the_call(probe, depth):
    value = 0
    for _ in range(depth):
        value = [value]
    stub = probe.env.PROBE.getByName("a")
    if depth <= MAX_RPC_NESTING:
        assert probe.run(stub.kinds(value)) == "list"
    else:
        with pytest.raises(ValueError, match=f"must nest at most {MAX_RPC_NESTING} lists, dicts or sets deep"):
            stub.kinds(value)  # refused at the call: nothing travels
        assert [e for _, name, e, _ in probe.trace if name == "Probe:a"] == []


def test_a_call_leaves_an_object_only_once_the_writes_before_it_are_durable():
    # The output gate holds outgoing calls as it holds replies: a crash that
    # loses the caller's write loses the call with it.
    with probe_runtime(faults=Faults(crash_before_commit=1.0)) as runtime:
        async def scenario():
            try:
                await runtime.env.PROBE.getByName("caller").write_then_call("callee", "x")
            except JsException as error:
                return str(error)

        assert "crashed before its writes committed" in runtime.run(scenario())
        assert [name for _, name, event, _ in runtime.trace if event == "call"] == ["Probe:caller"]


def test_code_of_an_instance_that_is_gone_reaches_no_other_object(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.call_when_resolved("b")
        gate = probe.host_of(stub).instance.gate
        probe.evict(stub)
        gate.set_result(None)  # its callback runs in the old instance's context
        await asyncio.sleep(1)

    probe.run(scenario())
    assert [name for _, name, event, _ in probe.trace if event == "call"] == ["Probe:a"]  # "b" never called
