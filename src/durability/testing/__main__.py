"""The embedded runtime's command line: ``python -m durability.testing serve``.

Lives here: argument parsing and logging set-up for the commands.
Must not know: how serving works; ``_serve`` owns that.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ._serve import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durability.testing",
        description="Run a Worker on the embedded runtime, outside tests.")
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser(
        "serve", help="serve the Worker's Default.fetch over HTTP on real time, offline",
        description="Serve the Worker of a wrangler.toml over HTTP, on real time, with its bindings and "
                    "[vars] and the secrets of the .dev.vars file beside it. Storage lives in memory.")
    serving.add_argument("--config", "-c", default="wrangler.toml", help="the Worker's wrangler.toml")
    serving.add_argument("--host", "--ip", default="127.0.0.1", help="the address to listen on")
    serving.add_argument("--port", type=int, default=8787, help="the port to listen on (0: any free port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        serve(args.config, args.host, args.port)
    except (OSError, ValueError) as error:  # a missing file, a port in use, a bad config
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
