"""The example Worker's uploads held under a lock semaphore, runnable on any tier.

Lives here: concurrent uploads of a few users through ``Default.upload``,
the most uploads of one user seen running at once (measured outside the
objects), and what each user's holder holds afterwards. Must not know:
which tier runs it.
"""

import asyncio

# Per user: (uploads, work_ms). Three places per user and a 10 s wait:
# ann's five short uploads all get in; bob's six long ones, three do and
# three give up after 10 s; cy's two never wait.
WORKLOAD = {"ann": (5, 2_000), "bob": (6, 12_000), "cy": (2, 500)}


async def run(driver):
    module = driver.module
    real_run_upload = module.run_upload
    running, most = {}, {}

    async def run_upload(user, work_ms, permit):
        running[user] = running.get(user, 0) + 1
        most[user] = max(most.get(user, 0), running[user])
        try:
            return await real_run_upload(user, work_ms, permit)
        finally:
            running[user] -= 1

    module.run_upload = run_upload
    try:
        calls = [driver.call("upload", user, work_ms)
                 for user, (count, work_ms) in WORKLOAD.items() for _ in range(count)]
        replies = await asyncio.gather(*calls)
        await asyncio.sleep(1)
        left = {user: await driver.env.UPLOAD_SLOTS.getByName(f"uploads:{user}").semaphore_usage()
                for user in WORKLOAD}
    finally:
        module.run_upload = real_run_upload
    statuses = {}
    for (user, _), reply in zip([(u, i) for u, (n, _) in WORKLOAD.items() for i in range(n)], replies):
        statuses.setdefault(user, {}).setdefault(reply["status"], 0)
        statuses[user][reply["status"]] += 1
    return {"statuses": statuses, "most_at_once": most,
            "left": {user: [usage["held"], usage["waiting"]] for user, usage in left.items()}}
