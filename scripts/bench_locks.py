#!/usr/bin/env python3
"""Latency and cost of a lock semaphore's hold, in RPC calls, virtual time and rows.

    uv run scripts/bench_locks.py [--latency-ms 5] [--ttl-s 30]

Runs the example Worker's ``UploadSlots`` holder on the embedded runtime, with
every call taking ``--latency-ms`` each way (virtual), and prints:

- an uncontended ``hold``: calls and time to get the place, and to free it;
- a hand-over: a holder frees its place while another waits in line; calls
  and time from the start of the release to the waiter holding the place;
- a minute held: renewal calls and rows written while the code runs;
- rows written and read per uncontended hold, as Cloudflare bills them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from durability.locks import semaphore  # noqa: E402
from durability.testing import Faults, Runtime  # noqa: E402


def calls_since(runtime: Runtime, mark: int, end: int | None = None) -> list[str]:
    """The methods called from ``mark`` to ``end`` (lengths of the runtime's trace)."""
    return [e[3] for e in runtime.trace[mark:end] if e[2] == "call"]


def measure(latency_ms: float, ttl_s: float) -> dict:
    faults = Faults(latency_ms=(latency_ms, latency_ms), external=True)
    with Runtime.from_wrangler(ROOT / "wrangler.toml", faults=faults) as runtime:
        uploads = semaphore(runtime.env.UPLOAD_SLOTS, "uploads", limit=1, ttl=timedelta(seconds=ttl_s))
        figures: dict = {}

        async def warm_up(key: str) -> None:
            # A key's first hold creates its holder object's tables; measure the ones after.
            await uploads.run(key, asyncio.sleep, 0)

        async def uncontended() -> None:
            await warm_up("solo")
            before = runtime.totals()
            hold = uploads.hold("solo")
            t0, mark0 = runtime.now_ms(), len(runtime.trace)
            await hold.__aenter__()
            t1, mark1 = runtime.now_ms(), len(runtime.trace)
            await hold.__aexit__(None, None, None)
            t2 = runtime.now_ms()
            after = runtime.totals()
            figures["uncontended"] = {
                "acquire_calls": calls_since(runtime, mark0, mark1),
                "acquire_ms": t1 - t0, "release_calls": calls_since(runtime, mark1), "release_ms": t2 - t1,
                "rows_written": after["rows_written"] - before["rows_written"],
                "rows_read": after["rows_read"] - before["rows_read"],
            }

        async def hand_over() -> None:
            await warm_up("shared")
            first = uploads.hold("shared")
            await first.__aenter__()
            admitted = asyncio.get_running_loop().create_future()

            async def waiter() -> None:
                async with uploads.hold("shared"):
                    admitted.set_result(runtime.now_ms())

            task = asyncio.ensure_future(waiter())
            await asyncio.sleep(1)  # the waiter stands in line, its call held by the holder
            t0, mark = runtime.now_ms(), len(runtime.trace)
            await first.__aexit__(None, None, None)
            t1 = await admitted
            handed = calls_since(runtime, mark)
            await task
            figures["hand_over"] = {"calls": handed, "ms": t1 - t0}

        async def a_minute() -> None:
            await warm_up("long")
            before, mark = runtime.totals(), len(runtime.trace)
            await uploads.run("long", asyncio.sleep, 60)
            after = runtime.totals()
            names = calls_since(runtime, mark)
            figures["minute"] = {"renewals": names.count("semaphore_renew"), "calls": len(names),
                                 "rows_written": after["rows_written"] - before["rows_written"]}

        def holders_awake_s() -> float:
            return sum(h.awake_s() for h in runtime.hosts() if h.class_name == "UploadSlots")

        async def a_wait() -> None:
            # A place held for a minute, once alone and once with a waiter in line for all of it:
            # what the waiter's wait adds to the holder object's awake time (duration is billed).
            for key, waiters in (("quiet", 0), ("queued", 1)):
                await warm_up(key)
                first = uploads.hold(key)
                await first.__aenter__()
                before = holders_awake_s()
                waiting = [asyncio.ensure_future(uploads.run(key, asyncio.sleep, 0)) for _ in range(waiters)]
                await asyncio.sleep(60)
                await first.__aexit__(None, None, None)
                await asyncio.gather(*waiting)
                figures[f"minute_{key}"] = {"holder_awake_s": holders_awake_s() - before}

        runtime.run(uncontended())
        runtime.run(hand_over())
        runtime.run(a_minute())
        runtime.run(a_wait())
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=5.0, help="one-way latency of every call")
    parser.add_argument("--ttl-s", type=float, default=30.0, help="the lease of a place")
    args = parser.parse_args()
    f = measure(args.latency_ms, args.ttl_s)
    u, h, m = f["uncontended"], f["hand_over"], f["minute"]
    print(f"one-way call latency {args.latency_ms:g} ms, ttl {args.ttl_s:g} s (virtual time)")
    print(f"uncontended hold: {len(u['acquire_calls'])} call ({', '.join(u['acquire_calls'])}) "
          f"and {u['acquire_ms']:g} ms to hold; {len(u['release_calls'])} call "
          f"({', '.join(u['release_calls'])}) and {u['release_ms']:g} ms to free")
    print(f"  rows per hold: {u['rows_written']} written, {u['rows_read']} read")
    print(f"hand-over to the next waiter: {len(h['calls'])} call ({', '.join(h['calls'])}) "
          f"and {h['ms']:g} ms from the start of the release to the waiter holding")
    print(f"held for a minute: {m['renewals']} renewals ({m['calls']} calls in all), "
          f"{m['rows_written']} rows written")
    quiet, queued = f["minute_quiet"]["holder_awake_s"], f["minute_queued"]["holder_awake_s"]
    print(f"the holder object awake while a place is held for a minute: {quiet:.1f} s alone, {queued:.1f} s "
          f"with a waiter in line all along (its wait costs the holder {queued - quiet:.1f} object-s, "
          f"${(queued - quiet) * 0.128 * 12.5:.2f} per million such waits, at $12.50 per million GB-s)")


if __name__ == "__main__":
    main()
