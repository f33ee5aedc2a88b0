"""The example Worker's jobs delivering webhooks, runnable on any tier.

Lives here: jobs whose ``url`` points at each kind of receiver answer
(``ok``, ``flaky``, ``reset``, ``gone``; see ``tests/webhook_receiver.py``),
waiting until every job has ended, and their outcomes with the receiver's
address replaced by ``BASE``. Must not know: which tier runs it, or what
receives the webhooks (a server on 127.0.0.1 on CPython, a stubbed fetch in
Pyodide).
"""

import asyncio
import json

KINDS = ("ok", "flaky", "reset", "gone")
POLL_S = 1
MAX_POLLS = 600


async def run(driver, base, per_kind=3, account="acct-a"):
    ids = []
    for kind in KINDS:
        for n in range(per_kind):
            job = {"id": f"{kind}-{n}", "account": account, "url": f"{base}/{kind}",
                   "payload": {"kind": kind, "n": n}}
            reply = await driver.call("submit_job", job)
            assert reply["state"] == "queued", reply
            ids.append(job["id"])
    outcomes = {}
    for _ in range(MAX_POLLS):
        for job_id in ids:
            if job_id not in outcomes:
                job = (await driver.call("job_status", job_id)).get("job", {})
                if job.get("status") in ("completed", "failed"):
                    outcomes[job_id] = json.loads(json.dumps(job).replace(base, "BASE"))
        if len(outcomes) == len(ids):
            break
        await asyncio.sleep(POLL_S)
    return outcomes
