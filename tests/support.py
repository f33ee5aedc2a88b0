"""Helpers shared by the tests: runtimes over the probe Worker and the example Worker."""

from pathlib import Path

from durability.testing import Runtime, load_worker_module

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "workers" / "probe.py"


def probe_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(PROBE), {"PROBE": "Probe"}, **options)


def example_runtime(**options) -> Runtime:
    return Runtime.from_wrangler(ROOT / "wrangler.toml", vars={"API_TOKEN": "t0ken"}, **options)

TIMERS = Path(__file__).resolve().parent / "workers" / "timers.py"


def timers_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(TIMERS), {"TIMERS": "Timers", "INBOX": "Inbox"}, **options)

HOLDERS = Path(__file__).resolve().parent / "workers" / "holders.py"


def holders_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(HOLDERS), {"HOLDER": "Holder", "SIM": "SimClient", "SHARD": "Shard"},
                   **options)

LOCKS = Path(__file__).resolve().parent / "workers" / "locks.py"


def locks_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(LOCKS), {"SLOTS": "Slots", "UPLOADER": "Uploader"}, **options)


def queue_jobs(prefix, n, ms=3_000, group="g", key="holder"):
    """Items for a Shard of the holders Worker: each runs ``ms`` once admitted."""
    return [{"id": f"{prefix}{i}", "key": key, "group": group, "body": {"ms": ms}} for i in range(n)]
