"""The example's jobs deliver webhooks for real: to a receiver on 127.0.0.1, under each account's limit.

The embedded runtime's ``workers.fetch`` makes real HTTP requests; the
receiver measures, outside the Worker, how many deliveries of an account
run at once. Requests go to the loopback address only.
"""

import asyncio
import json

import pytest
from webhook_receiver import Receiver

from durability.testing import Faults, JsException, Runtime
from support import ROOT

LIMITS = {"acct-a": 2, "acct-b": 3, "acct-c": 5}
JOBS_PER_ACCOUNT = 20


def webhook_runtime(**options) -> Runtime:
    vars = {"ACCOUNT_LIMITS": json.dumps(LIMITS), "SHARDS": "4", "API_TOKEN": "t0ken"}
    return Runtime.from_wrangler(ROOT / "wrangler.toml", vars=vars, **options)


async def call(runtime, method, *args):
    """Call the Worker as a client would: a call cut short by an eviction
    (faults on) is sent again, as both calls used here are idempotent."""
    for attempt in range(5):
        try:
            return await runtime.call_entrypoint(method, *args)
        except JsException:
            if attempt == 4:
                raise
            await asyncio.sleep(0.1)


async def submit_all(runtime, jobs):
    for job in jobs:
        await call(runtime, "submit_job", job)


async def settle(runtime, ids, within_s=600):
    """Poll (each second of virtual time) until every job has ended; their statuses."""
    for _ in range(within_s):
        statuses = [await call(runtime, "job_status", job_id) for job_id in ids]
        if all(status.get("job", {}).get("status") in ("completed", "failed") for status in statuses):
            return {status["id"]: status["job"] for status in statuses}
        await asyncio.sleep(1)
    raise AssertionError(f"jobs still pending after {within_s} s")


def test_every_webhook_is_delivered_never_more_at_once_than_the_account_s_limit():
    expected = dict.fromkeys(LIMITS, JOBS_PER_ACCOUNT)
    with Receiver(LIMITS, expected=expected) as receiver, webhook_runtime(seed=3) as runtime:
        jobs = [{"id": f"{account}-{i}", "account": account, "work_ms": (i * 37) % 300,
                 "url": receiver.url("/ok"), "payload": {"n": i}}
                for i in range(JOBS_PER_ACCOUNT) for account in LIMITS]

        async def scenario():
            await submit_all(runtime, jobs)
            outcomes = await settle(runtime, [job["id"] for job in jobs])
            await asyncio.sleep(60)  # the shards report their last releases
            usage = {account: await runtime.call_entrypoint("account_usage", account) for account in LIMITS}
            return outcomes, usage

        outcomes, usage = runtime.run(scenario())
    print(f"\nconcurrent deliveries per account, peak measured at the receiver / limit: "
          f"{ {account: f'{receiver.peak[account]}/{limit}' for account, limit in LIMITS.items()} }")
    for job in jobs:
        assert outcomes[job["id"]] == {"status": "completed",
                                       "result": {"worked_ms": job["work_ms"], "webhook": {"status": 200}}}
        [delivery] = receiver.deliveries[job["id"]]  # no fault: exactly once
        assert delivery == {"id": job["id"], "account": job["account"], "workflow": "default",
                            "payload": job["payload"], "idempotency_key": job["id"],
                            "content_type": "application/json"}
    # The receiver holds each delivery until its account's limit is in flight,
    # so a Worker that kept the limit reaches it exactly; one more is a breach.
    assert dict(receiver.peak) == LIMITS
    assert {account: usage[account]["outstanding"] for account in LIMITS} == dict.fromkeys(LIMITS, 0), usage
    assert runtime.errors == []


def test_retryable_answers_and_lost_connections_are_retried_and_refusals_are_not():
    with Receiver(LIMITS) as receiver, webhook_runtime(seed=4) as runtime:
        paths = {"flaky": "/flaky", "reset": "/reset", "gone": "/gone"}
        jobs = [{"id": f"{kind}-{i}", "account": "acct-a", "url": receiver.url(path)}
                for kind, path in paths.items() for i in range(3)]

        async def scenario():
            await submit_all(runtime, jobs)
            outcomes = await settle(runtime, [job["id"] for job in jobs])
            await asyncio.sleep(60)  # the shards report their last releases
            return outcomes, await runtime.call_entrypoint("account_usage", "acct-a")

        outcomes, usage = runtime.run(scenario())
    for job in jobs:
        kind, outcome, deliveries = job["id"].split("-")[0], outcomes[job["id"]], receiver.deliveries[job["id"]]
        # Every delivery of a job carries its id: a receiver keeps the first, drops the repeats.
        assert {delivery["idempotency_key"] for delivery in deliveries} == {job["id"]}
        if kind == "gone":  # 410: refused for good, not asked again
            assert outcome["status"] == "failed" and len(deliveries) == 1
            assert outcome["error"].startswith(f"NonRetryableError: webhook {job['url']} answered 410")
        else:  # a 503, then a connection closed with no answer: asked again, the receiver saw it twice
            assert outcome == {"status": "completed", "result": {"worked_ms": 0, "webhook": {"status": 200}}}
            assert len(deliveries) == 2
    assert receiver.peak["acct-a"] <= LIMITS["acct-a"]
    assert usage["outstanding"] == 0


def test_under_evictions_every_webhook_is_delivered_at_least_once_and_every_permit_comes_back():
    # Shards are evicted during their alarms: an attempt cut short is retried,
    # and a delivery it had sent may reach the receiver twice.
    faults = Faults(evict=0.3, evict_window_ms=400, targets={"JobShard"})
    with Receiver(LIMITS) as receiver, webhook_runtime(seed=2, faults=faults) as runtime:
        jobs = [{"id": f"{account}-{i}", "account": account, "work_ms": (i * 37) % 300,
                 "url": receiver.url("/ok")} for i in range(10) for account in LIMITS]

        async def scenario():
            await submit_all(runtime, jobs)
            outcomes = await settle(runtime, [job["id"] for job in jobs])
            await asyncio.sleep(120)  # the shards report their last releases, the holders reclaim
            return outcomes, {account: await runtime.call_entrypoint("account_usage", account) for account in LIMITS}

        outcomes, usage = runtime.run(scenario())
        evictions = runtime.totals()["evictions"]
    repeats = sum(len(deliveries) - 1 for deliveries in receiver.deliveries.values())
    print(f"\nunder {evictions} evictions: {repeats} repeated deliveries, peak per account "
          f"{dict(receiver.peak)} against {LIMITS}")
    assert evictions > 0
    for job in jobs:
        assert outcomes[job["id"]]["status"] == "completed"
        assert len(receiver.deliveries[job["id"]]) >= 1
        assert {delivery["idempotency_key"] for delivery in receiver.deliveries[job["id"]]} == {job["id"]}
    assert {account: usage[account]["outstanding"] for account in LIMITS} == dict.fromkeys(LIMITS, 0)


BAD_URLS = {
    "ftp://example.test/hook": "url must be an absolute http:// or https:// URL with a host",
    "javascript:alert(1)": "url must be an absolute http:// or https:// URL with a host",
    "/hooks/relative": "url must be an absolute http:// or https:// URL with a host",
    "http://": "url must be an absolute http:// or https:// URL with a host",
    "http://user:secret@example.test/": "url must not carry credentials",
    "http://example.test/a b": "url must not contain spaces or control characters",
    "http://example.test:99999/": "url is not a valid URL",
    # Invisible characters fetch cannot send: they failed each attempt once accepted.
    "http://example.test/a\u00a0b": "url must not contain spaces or control characters",
    "http://example.test/a\u3000b": "url must not contain spaces or control characters",
    "http://example.test/a\u0085b": "url must not contain spaces or control characters",
    "http://example.test/a\u200bb": "url must not contain spaces or control characters",
    "http://example.test/\r\nX-Injected: 1": "url must not contain spaces or control characters",
    "http://example.test/caf\u00e9": "url must be ASCII outside its host: percent-encode its path and query",
    "http://" + "\u00e9" * 64 + ".test/": "url's host is not a valid international domain name",
    "http://\u00e9.test/" + "a" * 2_030: "url must be at most 2048 characters with its host in IDNA form",
    "http://" + "a" * 2_048: "url must be a string of 1 to 2048 characters",
    "": "url must be a string of 1 to 2048 characters",
}


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_url_is_a_400_and_changes_nothing(example, url):
    job = {"id": "j1", "account": "acct-a", "url": url}
    assert_refused(example, job, BAD_URLS[url])


@pytest.mark.parametrize(("job", "error"), [
    ({"url": 5}, "url must be a string of 1 to 2048 characters"),
    ({"payload": {"a": 1}}, "payload goes with url: it is what the webhook carries"),
    ({"url": "https://example.test/", "payload": "x" * 16_384}, "payload must be at most 16384 bytes of JSON"),
])
def test_a_bad_webhook_field_is_a_400_and_changes_nothing(example, job, error):
    assert_refused(example, {"id": "j1", "account": "acct-a", **job}, error)


def test_an_international_host_is_kept_in_the_ascii_form_fetch_sends(example):
    check = example.module._webhook_url
    assert check("https://b\u00fccher.example:8443/hook?q=1") == "https://xn--bcher-kva.example:8443/hook?q=1"
    assert check("https://[::1]:8080/hook") == "https://[::1]:8080/hook"


@pytest.mark.parametrize("job_id", ["line\r\nbreak", "tab\there", "\u65e5\u672c", "\u0085", " lead", "trail ",
                                    "x\x7f"])
def test_a_job_id_its_idempotency_key_header_cannot_carry_is_a_400(example, job_id):
    error = "id must be printable Latin-1 with no space at its ends: it goes in the webhook's Idempotency-Key header"
    assert_refused(example, {"id": job_id, "account": "acct-a", "url": "https://example.test/"}, error, job_id)
    # Without a webhook the id goes in no header: taken.
    assert example.run(example.call_entrypoint("submit_job", {"id": job_id, "account": "acct-a"}))["state"]


@pytest.mark.parametrize("depth", [65, 600, 1_200])
def test_a_payload_nested_too_deep_is_a_400_at_any_depth_never_a_crash(example, depth):
    job = {"id": "j1", "account": "acct-a", "url": "https://example.test/"}
    error = "payload must nest at most 64 arrays or objects deep"
    if depth < 100:  # over RPC too (deeper, the embedded runtime fails copying the argument, at the caller)
        assert_refused(example, {**job, "payload": json.loads("[" * depth + "]" * depth)}, error)
    body = json.dumps(job)[:-1] + ', "payload": ' + "[" * depth + "]" * depth + "}"
    assert len(body) <= 16_384  # well within the size limit: its depth is what is refused
    assert post(example, body) == (400, {"error": error})


def test_a_payload_64_deep_is_taken_and_a_body_beyond_a_job_s_size_is_a_400(example):
    job = {"id": "j1", "account": "acct-a", "url": "https://example.test/"}
    body = json.dumps(job)[:-1] + ', "payload": ' + "[" * 64 + "]" * 64 + "}"
    assert post(example, body)[0] == 202
    assert post(example, " " * 65_537) == (400, {"error": "the body must be at most 65536 characters"})
    refused = {**job, "id": "j2", "payload": {"a": float("inf")}}
    assert_refused(example, refused, "payload must be a JSON value: numbers are finite", "j2")


def test_a_latin_1_job_id_goes_out_as_its_idempotency_key():
    with Receiver(LIMITS) as receiver, webhook_runtime(seed=1) as runtime:
        job = {"id": "caf\u00e9 \u00fc", "account": "acct-a", "url": receiver.url("/ok")}

        async def scenario():
            await submit_all(runtime, [job])
            return await settle(runtime, [job["id"]])

        outcomes = runtime.run(scenario())
    assert outcomes[job["id"]]["status"] == "completed"
    [delivery] = receiver.deliveries[job["id"]]
    assert delivery["idempotency_key"] == job["id"]


def post(runtime, body):
    async def scenario():
        response = await runtime.fetch("https://w.test/jobs", method="POST", body=body,
                                       headers={"Authorization": "Bearer t0ken"})
        return response.status, await response.json()

    return runtime.run(scenario())


def assert_refused(runtime, job, error, job_id="j1"):
    async def scenario():
        before = runtime.totals()["requests"]
        response = await runtime.fetch("https://w.test/jobs", method="POST", body=json.dumps(job),
                                       headers={"Authorization": "Bearer t0ken"})
        try:
            await runtime.call_entrypoint("submit_job", job)
        except Exception as refused:
            rpc_error = str(refused)
        after = runtime.totals()["requests"]  # no object was asked anything
        return response.status, await response.json(), rpc_error, after - before

    status, body, rpc_error, requests = runtime.run(scenario())
    assert (status, body) == (400, {"error": error})
    assert f"ValueError: {error}" in rpc_error
    assert requests == 0
    assert runtime.run(runtime.call_entrypoint("job_status", job_id))["state"] == "not_found"
