"""The local server (python -m durability.testing serve): HTTP on localhost, real time, .dev.vars."""

import asyncio
import io
import json
import signal
import socket
import threading
import time
from http.client import RemoteDisconnected

import pytest

from durability.testing import DEFAULT_EPOCH_MS, LocalServer, local_runtime, parse_dev_vars
from support import example_runtime, example_worker_dir, http, serving

TOKEN = "dev-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_dev_vars_are_read_as_wrangler_reads_them():
    text = ("# a comment\n\nAPI_TOKEN=abc  # after the value\nexport SPACED = two words \n"
            "DOUBLE=\"a\\nb\"\nSINGLE='c\\nd'\nMULTI=\"one\ntwo\"\nEMPTY=\nHASH=\"x # y\"\r\nAPI_TOKEN=later\n")
    assert parse_dev_vars(text) == {
        "API_TOKEN": "later", "SPACED": "two words", "DOUBLE": "a\nb", "SINGLE": "c\\nd",
        "MULTI": "one\ntwo", "EMPTY": "", "HASH": "x # y",
    }


def _job(job_id):
    return {"id": job_id, "account": "acme", "workflow": "export", "work_ms": 600_000}


async def _until_admitted(runtime, job_ids):
    """Wait (real time, bounded) until the holder has admitted every job."""
    for _ in range(200):
        states = [(await runtime.call_entrypoint("job_status", job_id))["state"] for job_id in job_ids]
        if all(state == "admitted" for state in states):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"jobs not admitted within 10 s: {states}")


def test_http_on_localhost_answers_as_the_rpc_methods(tmp_path):
    runtime, secrets = local_runtime(example_worker_dir(tmp_path, TOKEN))
    assert secrets == {"API_TOKEN": TOKEN}

    async def scenario():
        server = LocalServer(runtime, port=0, out=io.StringIO())
        await server.start()
        try:
            status, _, posted = await asyncio.to_thread(http, server.url + "/jobs", "POST", _job("h1"), AUTH)
            assert status == 202
            by_rpc = await runtime.call_entrypoint("submit_job", _job("r1"))
            await _until_admitted(runtime, ["h1", "r1"])
            status, _, usage = await asyncio.to_thread(http, server.url + "/accounts/acme/usage", headers=AUTH)
            assert status == 200
            return json.loads(posted), by_rpc, json.loads(usage), await runtime.call_entrypoint("account_usage", "acme")
        finally:
            await server.stop()

    with runtime:
        posted, by_rpc, usage_by_http, usage_by_rpc = runtime.run(scenario())
    assert posted == {**by_rpc, "id": "h1"} == {"id": "h1", "state": "queued"}
    assert usage_by_http == usage_by_rpc
    assert usage_by_http["outstanding"] == 2 and usage_by_http["groups"]["export"]["inUse"] == 2


def test_the_command_serves_with_the_dev_vars_token_and_stops_cleanly(tmp_path):
    config = example_worker_dir(tmp_path, TOKEN)
    with serving(config) as server:
        assert f"Using secrets defined in {tmp_path / '.dev.vars'}" in server.stdout
        assert server.url.startswith("http://127.0.0.1:")
        assert http(server.url + "/jobs", "POST", _job("c1"))[0] == 401
        status, _, body = http(server.url + "/jobs", "POST", _job("c1"), AUTH)
        with example_runtime() as rpc:
            assert (status, json.loads(body)) == (202, rpc.run(rpc.call_entrypoint("submit_job", _job("c1"))))
        # An upload of ten minutes is in flight when the server is told to stop.
        replies = []
        upload = threading.Thread(target=lambda: replies.append(
            _quietly(http, server.url + "/users/u/uploads", "POST", {"work_ms": 600_000}, AUTH)))
        upload.start()
        time.sleep(0.5)  # it reaches the server and runs there (the reply below says it did)
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 0
        upload.join(timeout=30)
    assert not upload.is_alive()
    # Cut off in flight: the connection closed with no reply (not refused).
    assert isinstance(replies[0], (RemoteDisconnected, ConnectionResetError)), replies
    assert "Shutting down local server..." in server.stdout
    assert not any("Traceback" in line for line in server.stderr), server.stderr
    port = int(server.url.rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def _quietly(function, *args):
    try:
        return function(*args)
    except OSError as error:  # the server ended the connection as it stopped
        return error


def test_the_real_clock_follows_real_time_and_tests_keep_the_virtual_one():
    with example_runtime(clock="real") as runtime:
        async def wait():
            before, real_before = time.time(), time.monotonic()
            await asyncio.sleep(0.05)
            return time.time() - before, time.monotonic() - real_before

        read, really = runtime.run(wait())
        assert read >= 0.05 and really >= 0.05  # time.time() reads the loop's clock, on real time
        assert abs(runtime.now_ms() / 1000 - time.time()) < 60  # today, not the virtual epoch
    with example_runtime() as runtime:
        runtime.advance(3600)  # an hour of virtual time, at once
        assert runtime.now_ms() == DEFAULT_EPOCH_MS + 3_600_000
    with pytest.raises(ValueError, match="clock must be"):
        example_runtime(clock="wall")
