"""Carry conformance scripts to the Python probe object, on any tier.

Lives here: sending each script to its probe object, then waiting for the
alarm log to fill. Must not know: which tier runs it or what is expected.
"""

import asyncio


async def run(driver, scripts, alarm=None):
    results = []
    for script in scripts:
        results.append(await driver.env.PROBE.getByName(script["object"]).run(script["ops"]))
    log = None
    if alarm:
        probe = driver.env.PROBE.getByName(alarm["object"])
        deadline = driver.now_ms() + alarm["timeout_ms"]
        while True:
            await asyncio.sleep(0.25)
            [log] = await probe.run([{"op": "alarm_log"}])
            if len(log["runs"]) >= alarm["runs"] or driver.now_ms() >= deadline:
                break
    return {"results": results, "alarm": log}
