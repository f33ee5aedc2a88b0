"""A lost alarm resumed by a read, runnable on any tier.

Lives here: a counter's report queued for its tally, then the counter's
instance and alarm lost (as when the runtime gives up on an alarm and the
object is evicted), then a read of the counter: the new instance the read
starts sets its alarm again, and the report goes out. Must not know: which
tier runs it.
"""

import asyncio


async def run(driver):
    await driver.call("add", "c1", "t", 5)  # the report to the tally waits 1 s in the outbox
    driver.lose_alarm("Counter", "c1")
    await asyncio.sleep(5)
    before = await driver.call("total", "t")  # nothing woke the counter: not sent
    count = await driver.env.COUNTER.getByName("c1").count("t")  # a read starts a new instance
    await asyncio.sleep(5)
    return {"before": before, "count": count, "after": await driver.call("total", "t")}
