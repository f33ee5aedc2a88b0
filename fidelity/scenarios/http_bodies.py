"""The example Worker's HTTP routes against bodies that are not JSON objects, runnable on any tier.

Lives here: a request per (route, body) with the right token, one with a
wrong token, and the status and error each gets. Must not know: which tier
runs it. In Pyodide the handler gets workerd's JavaScript Request, whose own
``json()`` fails with a JavaScript error: a route that used it would answer
500 there while answering 400 on CPython.
"""

import json

TOKEN = "t0ken"
ROUTES = ["/counters/c1/add", "/jobs", "/users/u1/uploads"]
BODIES = {"broken": "{not json", "list": "[1]", "number": "3", "empty": ""}


async def run(driver):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    outcomes = {}
    for path in ROUTES:
        for name, body in BODIES.items():
            status, text = await driver.fetch(f"https://w.test{path}", "POST", auth, body)
            outcomes[f"{path} {name}"] = [status, json.loads(text).get("error")]
    status, _ = await driver.fetch("https://w.test/tallies/t", "GET", {"Authorization": "Bearer t0kem"})
    outcomes["wrong token"] = [status, None]
    status, text = await driver.fetch("https://w.test/counters/c1/add", "POST", auth,
                                      json.dumps({"tally": "t", "amount": 2}))
    outcomes["a good body"] = [status, json.loads(text)]
    return outcomes
