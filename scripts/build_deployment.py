#!/usr/bin/env python3
"""Build a Worker's deployment bundle offline and check it.

    python3 scripts/build_deployment.py [--outdir DIR] [--project DIR]

The Worker is the repository's example (wrangler.toml at the top), or with
--project the Worker project in DIR (its wrangler.toml, pyproject.toml and
uv.lock), whose library comes from its locked dependencies instead of src/.

1. Vendors the pinned `workers-runtime-sdk` (the exact `==` pin in
   pyproject.toml's dev group) into python_modules/ next to wrangler.toml,
   laid out like `pywrangler sync` does it (the wheel's files at the top
   level plus an empty pyvenv.cfg), and for a --project its locked runtime
   dependencies too (`uv export`: the durability-workers wheel), leaving out
   `durability/testing/`, which a deployed Worker never imports.
   `pywrangler sync` itself needs the internet, so uv installs the
   pure-Python wheels there directly.
2. Runs `wrangler deploy --dry-run --outdir DIR` (wrangler from node_modules,
   which `npm ci` fills from package-lock.json when it lacks them). Wrangler
   writes every module it would upload into DIR: the entry module as
   entry.py, the other .py files of src/ at their paths relative to src/,
   and the vendored files under python_modules/.
3. Checks DIR holds the entry module, every .py file of src/ (so the
   `durability` library, or for a --project the vendored one), and the SDK
   at the pinned version.
4. Imports the bundle as the runtime would: DIR's modules and the SDK
   vendored in DIR/python_modules, in real Pyodide 0.28.2 under Node
   (fidelity/pyodide/host.mjs). A module that cannot import there (a
   missing module, a CPython-only import) fails the build, as does a
   Durable Object class of wrangler.toml that the entry module lacks.

Needs only the standard library, uv, and Node with npm.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fidelity.node_tools import NodeToolsError, ensure_node_tools  # noqa: E402
from fidelity.pyodide_host import PyodideHostError, run_host  # noqa: E402

SDK = "workers-runtime-sdk"
SDK_DIST = "workers_runtime_sdk"
# Vendored packages' parts a deployed Worker never imports.
TEST_ONLY = ("durability/testing",)


def fail(message: str) -> None:
    print(f"\nbuild_deployment: ERROR: {message}", file=sys.stderr)
    sys.exit(1)


def run(cmd: list[str], cwd: Path = ROOT, **kwargs) -> None:
    print("+ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=cwd, **kwargs)
    if result.returncode != 0:
        fail(f"command failed with exit code {result.returncode}: {' '.join(cmd)}")


def uv_command() -> list[str]:
    """uv as installed by .ci/run (`python3 -m pip install uv`), else on PATH."""
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    found = shutil.which("uv")
    if found is None:
        fail("uv not found: install it with `python3 -m pip install uv==<pin in .ci/run>`")
    return [found]


def sdk_pin() -> str:
    """The exact version of the SDK pinned in pyproject.toml's dev group."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        groups = tomllib.load(f).get("dependency-groups", {})
    for requirement in groups.get("dev", []):
        if not isinstance(requirement, str):
            continue
        match = re.fullmatch(r"\s*workers[-_.]runtime[-_.]sdk\s*==\s*([^\s;,]+)\s*", requirement, re.I)
        if match:
            return match.group(1)
    fail(f"pyproject.toml [dependency-groups] dev has no exact pin `{SDK}==X.Y.Z`")


def installed_version(site: Path) -> str:
    """The SDK version recorded in the dist-info under `site`."""
    dist_infos = sorted(site.glob(f"{SDK_DIST}-*.dist-info"))
    if len(dist_infos) != 1:
        fail(f"expected exactly one {SDK_DIST}-*.dist-info in {site}, found {[p.name for p in dist_infos]}")
    metadata = dist_infos[0] / "METADATA"
    if not metadata.is_file():
        fail(f"{metadata} is missing")
    for line in metadata.read_text(encoding="utf-8").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    fail(f"no Version: field in {metadata}")


def node_tools() -> None:
    """Node and the pinned tools of package-lock.json, installed when missing."""
    try:
        ensure_node_tools()
    except NodeToolsError as error:
        fail(str(error))


def export_locked_requirements(project: Path, target: Path) -> None:
    """Write the project's locked runtime dependencies, with their hashes, to
    ``target``, a requirements file in ``project`` (its paths are relative to it)."""
    run(uv_command() + ["export", "--locked", "--no-dev", "--no-emit-project", "--no-header", "--quiet",
                        "--format", "requirements-txt", "--output-file", str(target)], cwd=project)


def vendor_modules(pin: str, project: Path = ROOT) -> None:
    """The SDK at ``pin`` into python_modules/, and a --project's locked dependencies."""
    vendor = project / "python_modules"
    if vendor.exists():
        shutil.rmtree(vendor)
    install = uv_command() + ["pip", "install", "--target", str(vendor), "--no-deps", "--link-mode", "copy"]
    run(install + [f"{SDK}=={pin}"], cwd=project)
    if project != ROOT:
        requirements = project / ".vendor-requirements.txt"
        try:
            export_locked_requirements(project, requirements)
            run(install + ["--require-hashes", "-r", str(requirements)], cwd=project)
        finally:
            requirements.unlink(missing_ok=True)
        for part in TEST_ONLY:
            shutil.rmtree(vendor / part, ignore_errors=True)
    # uv leaves its lock file in the target; wrangler would upload it.
    (vendor / ".lock").unlink(missing_ok=True)
    # pywrangler sync marks python_modules as a venv with an empty pyvenv.cfg.
    (vendor / "pyvenv.cfg").touch()
    version = installed_version(vendor)
    if version != pin:
        fail(f"vendored {SDK} is {version} but pyproject.toml pins {pin}")
    extra = " and the project's locked dependencies" if project != ROOT else ""
    print(f"Vendored {SDK}=={version}{extra} into python_modules/")


def wrangler_dry_run(outdir: Path, project: Path = ROOT) -> None:
    node_tools()
    wrangler = ROOT / "node_modules" / ".bin" / "wrangler"
    if outdir.exists():
        shutil.rmtree(outdir)
    env = dict(os.environ, WRANGLER_SEND_METRICS="false")
    run([str(wrangler), "deploy", "--dry-run", "--outdir", str(outdir)], cwd=project, env=env)


def check_bundle(outdir: Path, pin: str, project: Path = ROOT) -> None:
    with open(project / "wrangler.toml", "rb") as f:
        main = project / tomllib.load(f)["main"]
    module_root = main.parent
    problems = []

    expected = [main.name]  # wrangler names the entry module by its file name
    expected += sorted(
        p.relative_to(module_root).as_posix()
        for p in module_root.rglob("*.py")
        if p != main and "__pycache__" not in p.parts
    )
    src_modules = len(expected)
    if project == ROOT and "durability/__init__.py" not in expected:
        problems.append("src/durability/__init__.py does not exist")
    if project != ROOT:  # the library comes from the project's dependencies
        expected.append("python_modules/durability/__init__.py")
        problems += [f"in the bundle, though a Worker never imports it: python_modules/{part}"
                     for part in TEST_ONLY if (outdir / "python_modules" / part).exists()]
    expected.append("python_modules/workers/__init__.py")
    for name in expected:
        if not (outdir / name).is_file():
            problems.append(f"missing from the bundle: {name}")

    bundled_entry = outdir / main.name
    if bundled_entry.is_file() and bundled_entry.read_bytes() != main.read_bytes():
        problems.append(f"{main.name} in the bundle differs from {main.relative_to(project)}")

    if (outdir / "python_modules").is_dir():
        version = installed_version(outdir / "python_modules")
        if version != pin:
            problems.append(f"bundled {SDK} is {version} but pyproject.toml pins {pin}")

    if problems:
        fail("the deployment bundle in " + str(outdir) + " is incomplete:\n  " + "\n  ".join(problems))
    count = sum(1 for p in outdir.rglob("*") if p.is_file())
    vendored = "the durability library and " if project != ROOT else ""
    print(
        f"Bundle OK: {outdir} has {count} files, including the {src_modules} "
        f"Python modules of src/ and {vendored}{SDK}=={pin} under python_modules/"
    )


def check_imports(outdir: Path, project: Path = ROOT) -> None:
    """Import the bundle in Pyodide with what it vendors; it must export exactly
    the Durable Object classes wrangler.toml binds (workerd exports every public
    one of the main module), and the Default entrypoint."""
    node_tools()
    with open(project / "wrangler.toml", "rb") as f:
        settings = tomllib.load(f)
    bindings = settings.get("durable_objects", {}).get("bindings", [])
    wanted = {b["class_name"] for b in bindings if not b.get("script_name")}
    try:
        report = run_host({"kind": "import"}, wrangler=project / "wrangler.toml",
                          module_dir=outdir, sdk_dir=outdir / "python_modules")
    except PyodideHostError as error:
        fail(f"the bundle does not import in Pyodide:\n{error}")
    found = report["result"]
    exported = set(found["durableObjects"])
    problems = []
    if wanted - exported:
        problems.append(f"the entry module lacks {sorted(wanted - exported)}")
    if exported - wanted:
        problems.append(f"it exports Durable Object classes wrangler.toml does not bind: {sorted(exported - wanted)}")
    if "Default" not in found["workerEntrypoints"]:
        problems.append("the entry module lacks ['Default']")
    if problems:
        fail("; ".join(problems))
    print(f"Bundle imports in Pyodide: Durable Objects {', '.join(sorted(exported))}; entrypoint Default")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--outdir",
        type=Path,
        default=None,
        help="where wrangler writes the bundle (default: build/deployment in the project)",
    )
    parser.add_argument(
        "--project",
        type=Path,
        default=ROOT,
        help="a Worker project depending on durability-workers (default: this repository's example)",
    )
    args = parser.parse_args()
    project = args.project.resolve()
    if not (project / "wrangler.toml").is_file():
        fail(f"{project} has no wrangler.toml")
    build(project, (args.outdir or project / "build" / "deployment").resolve())


def build(project: Path, outdir: Path) -> None:
    """Vendor, bundle with wrangler, check the bundle and import it in Pyodide."""
    pin = sdk_pin()
    vendor_modules(pin, project)
    wrangler_dry_run(outdir, project)
    check_bundle(outdir, pin, project)
    check_imports(outdir, project)


if __name__ == "__main__":
    main()
