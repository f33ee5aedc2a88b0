"""A queue's consumer handles what a Worker sends, runnable on any tier.

Lives here: messages of every kind a consumer meets (a dict, text, a
number, a list, null) and every word it may say (ack, retry, retryAll,
ackAll, a handler that raises), sent through ``Default.send`` to the
``JOBS`` queue; then every queue settled. What the consumer saw of each
delivery (the body as the SDK converts it, the attempt, the types of the
id and the timestamp) and what each queue counted are the outcome. Must
not know: which tier runs it.
"""

MESSAGES = [
    ({"n": 1, "do": "ack"}, None),
    ({"n": 2}, None),
    ("plain text", {"contentType": "text"}),
    (42, None),
    ([1, 2.0, "three", None], None),
    ({"n": 6, "do": "retry"}, None),
    ({"n": 7, "do": "retry_all"}, None),
    ({"n": 8, "nested": {"x": [1, {"y": None}]}}, None),
    ({"n": 9, "do": "raise"}, None),
    ({"n": 10, "do": "ack_all"}, None),
]


async def run(driver):
    for body, options in MESSAGES:
        await driver.call("send", body, options)
    counts = await driver.settle_queues()
    seen = sorted((repr(body), attempts, type(body).__name__, type(message_id).__name__, len(message_id),
                   timestamp_type) for _, message_id, body, attempts, timestamp_type in driver.module.SEEN)
    return {"counts": counts, "seen": [list(entry) for entry in seen]}

