"""Values nested 100, 1,000 and 100,000 deep against every door that takes one, runnable on any tier.

Lives here: the library's own checks (a queue item's body, a job's payload,
an outbox message) called on lists and dicts nested that deep, and the
example Worker's ``POST /jobs`` given such a body as text; the error each
gives. Must not know: which tier runs it. Nothing deep is sent over RPC:
in Pyodide the SDK's conversion of such a value fails, or at 100,000
levels ends the interpreter, before any code of the library could refuse it.
The values are kept to the end of the process: in Pyodide 0.28.2, freeing
a list nested 10,000 deep ends the interpreter too (measured).
"""

import json

from durability._common.checks import compact_json
from durability.semaphore.queue.input import checked_items

DEPTHS = (100, 1_000, 100_000)
TOKEN = "t0ken"
_KEPT = []  # never freed: see above


def nested(depth, kind):
    value = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    _KEPT.append(value)
    return value


def _refusal(check, *args):
    try:
        check(*args)
    except ValueError as error:
        return f"ValueError: {error}"
    return "accepted"


async def run(driver):
    outcomes = {}
    for depth in DEPTHS:
        for kind in ("list", "dict"):
            value = nested(depth, kind)
            outcomes[f"{depth} {kind} queue body"] = _refusal(
                checked_items, [{"id": "i", "key": "k", "body": value}])
            outcomes[f"{depth} {kind} job payload"] = _refusal(compact_json, value, "job payload")
            outcomes[f"{depth} {kind} outbox message"] = _refusal(compact_json, value, "outbox message")
        text = '{"id": "j", "account": "a", "url": "https://hooks.test/", "payload": ' + "[" * depth + "]" * depth + "}"
        status, reply = await driver.fetch("https://w.test/jobs", "POST", {"Authorization": f"Bearer {TOKEN}"}, text)
        outcomes[f"{depth} POST /jobs"] = [status, json.loads(reply).get("error")]
    return outcomes
