"""The account-concurrency composition end to end, runnable on any tier.

Lives here: one scenario of the example Worker (jobs of a few accounts
queued on a few shards, admitted by each account's holder, released as they
end; a client that never claims its grant, taken back by the holder's
alarm) and the ground truth it measures outside the objects. It talks to
the Worker only through ``driver`` (``call``, ``env``, ``now_ms``,
``module``), so the embedded runtime and real Pyodide run the same code.
Must not know: which tier runs it.
"""

import asyncio
import random

GHOST_ACCOUNT = "acct-ghost"
POLL_S = 5


def _instrument(module, ledger):
    """Wrap the Worker's job function to see what really runs, and when."""
    real_run_job = module.run_job

    async def run_job(env, job):
        account, job_id = job["account"], job["id"]
        running = ledger["running"].setdefault(account, set())
        if job_id in running:
            ledger["overlaps"] += 1
        running.add(job_id)
        ledger["max_running"][account] = max(ledger["max_running"].get(account, 0), len(running))
        ledger["runs"][job_id] = ledger["runs"].get(job_id, 0) + 1
        ledger["via"].setdefault(job_id, job.get("via"))
        try:
            return await real_run_job(env, job)
        finally:
            running.discard(job_id)

    module.run_job = run_job
    return real_run_job


async def _ghost_grant(driver):
    """A client asks for a permit and never claims it: only reclaim returns it."""
    holder = driver.env.ACCOUNT_LIMIT.getByName(GHOST_ACCOUNT)
    reply = await holder.permits({
        "type": "request", "v": 1, "clientId": "ghost-client",
        "demand": [{"group": "default", "count": 1, "oldestAt": driver.now_ms()}],
    })
    granted = sum(grant["permits"] for grant in reply.get("grants", []))
    before = (await driver.call("account_usage", GHOST_ACCOUNT))["outstanding"]
    return granted, before


async def run(driver, jobs=200, seed=7, accounts=("acct-a", "acct-b")):
    rng = random.Random(seed)
    started = driver.now_ms()
    ledger = {"running": {}, "max_running": {}, "runs": {}, "overlaps": 0, "via": {}}
    real_run_job = _instrument(driver.module, ledger)
    try:
        ghost_granted, ghost_before = await _ghost_grant(driver)
        submitted = []
        while len(submitted) < jobs:
            for _ in range(min(jobs - len(submitted), rng.randint(10, 40))):
                job = {"id": f"job-{len(submitted):04d}", "account": rng.choice(accounts),
                       "workflow": f"wf-{rng.randint(0, 1)}", "work_ms": rng.randint(200, 3_000),
                       "fail": rng.random() < 0.05}
                reply = await driver.call("submit_job", job)
                # (admitted already: the enqueue's own ask came back first)
                assert reply["state"] in ("queued", "claiming", "admitted"), reply
                submitted.append(job["id"])
            await asyncio.sleep(rng.uniform(0.5, 3))

        statuses, via = {}, {}
        while len(statuses) < jobs:
            await asyncio.sleep(POLL_S)
            for job_id in submitted:
                if job_id not in statuses:
                    status = await driver.call("job_status", job_id)
                    if status["job"]["status"] in ("completed", "failed"):
                        statuses[job_id] = status["job"]["status"]
                        admitted = ledger["via"].get(job_id)  # its item is not kept once released
                        via[admitted] = via.get(admitted, 0) + 1
        usage = {}
        for _ in range(60):  # the release of the last jobs is on its way
            usage = {a: await driver.call("account_usage", a) for a in (*accounts, GHOST_ACCOUNT)}
            if all(u["outstanding"] == 0 for u in usage.values()):
                break
            await asyncio.sleep(POLL_S)
    finally:
        driver.module.run_job = real_run_job
    return {
        "statuses": statuses,
        "admitted_via": via,
        "max_running": ledger["max_running"],
        "limits": {a: usage[a]["limit"] for a in accounts},
        "overlaps": ledger["overlaps"],
        "runs_of_completed": sorted({ledger["runs"].get(j, 0) for j, s in statuses.items() if s == "completed"}),
        "outstanding_after": {a: u["outstanding"] for a, u in usage.items()},
        "ghost": {"granted": ghost_granted, "outstanding_before_reclaim": ghost_before},
        "virtual_minutes": round((driver.now_ms() - started) / 60_000, 1),
    }
