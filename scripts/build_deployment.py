#!/usr/bin/env python3
"""Build a Worker's deployment bundle offline and check it.

    python3 scripts/build_deployment.py [--outdir DIR] [--project DIR]

The Worker is the repository's example (wrangler.toml at the top), or with
--project the Worker project in DIR (its wrangler.toml, pyproject.toml and
uv.lock), whose library comes from its locked dependencies instead of src/.
The build itself is the library's, ``durability.build`` (what a user's
project runs as ``python -m durability.build``): vendoring into
python_modules/, ``wrangler deploy --dry-run``, the bundle's contents, its
import in real Pyodide. This script adds what a checkout has: the Node
tools of package-lock.json (``npm ci`` when node_modules/ lacks them), and
the SDK pinned in pyproject.toml's dev group.

Needs only the standard library, uv, and Node with npm.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from durability import build as package_build  # noqa: E402  (the checkout's library, from src/)
from fidelity.node_tools import NodeToolsError, ensure_node_tools  # noqa: E402

uv_command = package_build.uv_command


def fail(message: str) -> None:
    print(f"\nbuild_deployment: ERROR: {message}", file=sys.stderr)
    sys.exit(1)


def run(cmd: list[str], cwd: Path = ROOT, **kwargs) -> None:
    try:
        package_build.run(cmd, cwd, **kwargs)
    except package_build.BuildError as error:
        fail(str(error))


def sdk_pin() -> str:
    """The exact version of the SDK pinned in pyproject.toml's dev group."""
    pin = package_build.project_sdk_pin(ROOT)
    if pin is None:
        fail(f"pyproject.toml has no exact pin `{package_build.SDK}==X.Y.Z`")
    return pin


def node_tools() -> None:
    """Node and the pinned tools of package-lock.json, installed when missing."""
    try:
        ensure_node_tools()
    except NodeToolsError as error:
        fail(str(error))


def check_imports(outdir: Path, project: Path = ROOT) -> None:
    node_tools()
    try:
        package_build.check_imports(project, outdir, ROOT / "node_modules")
    except package_build.BuildError as error:
        fail(str(error))


def build(project: Path, outdir: Path) -> None:
    """Vendor, bundle with wrangler, check the bundle and import it in Pyodide."""
    try:
        package_build.build(project, outdir, node_modules=ROOT / "node_modules", sdk_version=sdk_pin(),
                            before=node_tools)
    except package_build.BuildError as error:
        fail(str(error))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outdir", type=Path, default=None,
                        help="where wrangler writes the bundle (default: build/deployment in the project)")
    parser.add_argument("--project", type=Path, default=ROOT,
                        help="a Worker project depending on durability-workers (default: this repository's example)")
    args = parser.parse_args()
    project = args.project.resolve()
    build(project, (args.outdir or project / "build" / "deployment").resolve())


if __name__ == "__main__":
    main()
