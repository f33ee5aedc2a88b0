#!/usr/bin/env python3
"""Check a Worker project of examples/ against the durability-workers wheel built from this checkout.

    python3 scripts/check_example.py [--example DIR] [--workdir DIR]

1. Builds the sdist, then the wheel from it, as the docs' `uv build` does,
   into WORKDIR/dist.
2. Copies the example to WORKDIR/examples/NAME, so that its
   `[tool.uv.sources]` path, ../../dist/, names that wheel and the checkout
   is left as it is.
3. Records the new wheel's hash in the copy's uv.lock (`uv lock
   --upgrade-package durability-workers`; every other package stays as the
   committed lock pins it), installs the example's environment with
   `uv sync --locked`, and runs the example's own tests with its pytest.
4. Builds the example's deployment with `scripts/build_deployment.py
   --project`: the wheel's `durability` (without testing/) and the SDK
   vendored into python_modules/, `wrangler deploy --dry-run`, the bundle's
   contents checked and the bundle imported in real Pyodide.

WORKDIR defaults to a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import build_deployment  # scripts/, this script's own directory
from build_deployment import ROOT, fail, run, uv_command

DIST = "durability-workers"


def _uv_env() -> dict[str, str]:
    # Inside `uv run`, VIRTUAL_ENV names this checkout's environment, not the example's.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    return {**env, "UV_PYTHON": env.get("UV_PYTHON", "python3"), "UV_PYTHON_DOWNLOADS": "never"}


def build_wheel(dist: Path) -> Path:
    # Plain `uv build`, as the docs give it: the wheel is made from the sdist,
    # so a file the sdist leaves out fails here, not at a user's.
    run(uv_command() + ["build", "--out-dir", str(dist), "--quiet"], env=_uv_env())
    wheels = sorted(dist.glob("durability_workers-*.whl"))
    if len(wheels) != 1:
        fail(f"expected one durability_workers wheel in {dist}, found {[w.name for w in wheels]}")
    print(f"Built {wheels[0].name}")
    return wheels[0]


def copy_example(example: Path, workdir: Path) -> Path:
    copy = workdir / "examples" / example.name
    shutil.copytree(example, copy, ignore=shutil.ignore_patterns(
        ".venv", "__pycache__", ".pytest_cache", "python_modules", "build", ".wrangler"))
    return copy


def lock_and_test(project: Path) -> None:
    lock = (project / "uv.lock").read_text(encoding="utf-8")
    run(uv_command() + ["lock", "--upgrade-package", DIST, "--quiet"], cwd=project, env=_uv_env())
    if (project / "uv.lock").read_text(encoding="utf-8") != lock:
        print(f"Note: the committed uv.lock of {project.name} names another {DIST} wheel than this checkout "
              f"builds; `uv build` then `uv lock --upgrade-package {DIST}` in the example refreshes it")
    run(uv_command() + ["sync", "--locked", "--quiet"], cwd=project, env=_uv_env())
    run(uv_command() + ["run", "--locked", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=_uv_env())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=ROOT / "examples" / "minimal",
                        help="the example project (default: examples/minimal)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where to build and copy (default: a temporary directory, removed after)")
    args = parser.parse_args()
    example = args.example.resolve()
    if not (example / "pyproject.toml").is_file() or not (example / "uv.lock").is_file():
        fail(f"{example} is not a uv project with a uv.lock")
    build_deployment.node_tools()  # before anything slow: no Node, no check
    with tempfile.TemporaryDirectory(prefix="check-example-") as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        build_wheel(workdir / "dist")
        project = copy_example(example, workdir)
        lock_and_test(project)
        build_deployment.build(project, project / "build" / "deployment")
    print(f"Example {example.name} OK: its tests pass against the wheel, and its bundle imports in Pyodide")


if __name__ == "__main__":
    main()
