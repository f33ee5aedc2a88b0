"""durability.build: build a Worker project's deployment bundle offline and check that it runs.

    python -m durability.build --project DIR [--outdir DIR] [--node-modules DIR] [--sdk-version X.Y.Z]

Lives here: the check a user's project runs before it deploys (from its
own tests, say), shipped in the wheel: vendoring, ``wrangler deploy
--dry-run``, the bundle's contents, and its import in real Pyodide. Must
not know: this repository's layout beyond where the Pyodide host's files
are found in a checkout, or any Worker. Imports the standard library only.

1. Vendors into ``python_modules/`` next to ``wrangler.toml`` the
   ``workers-runtime-sdk`` (the project's ``==`` pin, else the version this
   library is tested with, ``SDK_VERSION``) and the project's locked
   runtime dependencies (``uv export``: the durability-workers wheel),
   laid out as ``pywrangler sync`` lays them out, without
   ``durability/testing/`` and ``durability/build/``, which a deployed
   Worker never imports.
2. Runs ``wrangler deploy --dry-run --outdir DIR``: every module it would upload.
3. Checks DIR holds the entry module, every ``.py`` file beside it, the
   vendored library and the SDK at its version.
4. Imports the bundle as the runtime would, in Pyodide under Node, and
   checks it exports the Durable Object classes ``wrangler.toml`` binds and
   ``Default``.

Needs uv, Node 20 or later, and the Node packages ``NODE_PACKAGES`` in a
``node_modules`` of the project or a directory above it (``npm install
--save-dev`` them), or the one ``--node-modules`` names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

SDK = "workers-runtime-sdk"
SDK_DIST = "workers_runtime_sdk"
SDK_VERSION = "1.9.5"  #: the SDK this library is tested with (its pin in the repository's pyproject.toml)
#: the Node packages the build runs, at the versions the library is tested with
NODE_PACKAGES = {"wrangler": "4.86.0", "pyodide": "0.28.2", "sql.js": "1.13.0", "@sinonjs/fake-timers": "15.0.0"}
NODE_MAJOR = 20
#: parts of the vendored library a deployed Worker never imports
NOT_DEPLOYED = ("durability/testing", "durability/build")
_HERE = Path(__file__).resolve().parent
#: the Pyodide host: in the wheel beside this module; in a checkout, in fidelity/
HOST_DIR = _HERE / "pyodide" if (_HERE / "pyodide").is_dir() else _HERE.parents[2] / "fidelity" / "pyodide"


class BuildError(RuntimeError):
    """The bundle cannot be built or would not run: what is wrong, and what to do."""


def say(line: str) -> None:
    print(line, flush=True)


def run(cmd: list[str], cwd: Path, **kwargs: Any) -> None:
    say("+ " + " ".join(cmd))
    result = subprocess.run(cmd, cwd=cwd, **kwargs)
    if result.returncode != 0:
        raise BuildError(f"command failed with exit code {result.returncode}: {' '.join(cmd)}")


def uv_command() -> list[str]:
    """uv as a module of this Python (``pip install uv``), else on PATH."""
    import importlib.util

    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    found = shutil.which("uv")
    if found is None:
        raise BuildError("uv not found: install it (`python3 -m pip install uv`); it vendors the dependencies")
    return [found]


def project_sdk_pin(project: Path) -> str | None:
    """The project's exact ``workers-runtime-sdk==X`` pin, in its dependencies or any dependency group."""
    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        return None
    with open(pyproject, "rb") as f:
        settings = tomllib.load(f)
    lists = [settings.get("project", {}).get("dependencies", []), *settings.get("dependency-groups", {}).values()]
    for requirement in (r for group in lists for r in group if isinstance(r, str)):
        match = re.fullmatch(r"\s*workers[-_.]runtime[-_.]sdk\s*==\s*([^\s;,]+)\s*", requirement, re.I)
        if match:
            return match.group(1)
    return None


def installed_version(site: Path) -> str:
    """The SDK version recorded in the dist-info under ``site``."""
    dist_infos = sorted(site.glob(f"{SDK_DIST}-*.dist-info"))
    if len(dist_infos) != 1:
        raise BuildError(f"expected one {SDK_DIST}-*.dist-info in {site}, found {[p.name for p in dist_infos]}")
    metadata = dist_infos[0] / "METADATA"
    for line in metadata.read_text(encoding="utf-8").splitlines() if metadata.is_file() else []:
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise BuildError(f"no Version: field in {metadata}")


# -- the Node tools ------------------------------------------------------------------
def find_node_modules(project: Path, given: Path | None = None) -> Path:
    """The ``node_modules`` that holds every one of ``NODE_PACKAGES``: ``given``,
    else the project's or the nearest above it; BuildError says how to get them."""
    if shutil.which("node") is None:
        raise BuildError(f"node is not on PATH: install Node {NODE_MAJOR} or later (with npm)")
    places = [given] if given is not None else [d / "node_modules" for d in (project, *project.parents)]
    for place in places:
        if place.is_dir() and not _missing_node_packages(place):
            return place
    wanted = " ".join(f"{name}@{version}" for name, version in NODE_PACKAGES.items())
    where = f"{given} lacks " + ", ".join(_missing_node_packages(given)) if given else (
        f"no node_modules in {project} or above it holds them")
    raise BuildError(f"the build needs the Node packages {', '.join(NODE_PACKAGES)} and {where}: "
                     f"in the project run `npm install --save-dev {wanted}`, or pass --node-modules DIR")


def _missing_node_packages(node_modules: Path) -> list[str]:
    return [name for name in NODE_PACKAGES if not (node_modules / name / "package.json").is_file()]


# -- 1. vendoring ----------------------------------------------------------------------
def vendor_modules(project: Path, sdk_version: str, vendor_library: bool) -> None:
    """The SDK into python_modules/, and the project's locked dependencies when it vendors the library."""
    vendor = project / "python_modules"
    if vendor.exists():
        shutil.rmtree(vendor)
    install = uv_command() + ["pip", "install", "--target", str(vendor), "--no-deps", "--link-mode", "copy"]
    run(install + [f"{SDK}=={sdk_version}"], cwd=project)
    if vendor_library:
        requirements = project / ".vendor-requirements.txt"
        try:
            run(uv_command() + ["export", "--locked", "--no-dev", "--no-emit-project", "--no-header", "--quiet",
                                "--format", "requirements-txt", "--output-file", str(requirements)], cwd=project)
            run(install + ["--require-hashes", "-r", str(requirements)], cwd=project)
        finally:
            requirements.unlink(missing_ok=True)
        for part in NOT_DEPLOYED:
            shutil.rmtree(vendor / part, ignore_errors=True)
    (vendor / ".lock").unlink(missing_ok=True)  # uv's lock file: wrangler would upload it
    (vendor / "pyvenv.cfg").touch()  # pywrangler sync marks python_modules as a venv so
    version = installed_version(vendor)
    if version != sdk_version:
        raise BuildError(f"vendored {SDK} is {version}, not {sdk_version}")
    extra = " and the project's locked dependencies" if vendor_library else ""
    say(f"Vendored {SDK}=={version}{extra} into python_modules/")


# -- 2. wrangler ---------------------------------------------------------------------------
def wrangler_dry_run(project: Path, outdir: Path, node_modules: Path) -> None:
    if outdir.exists():
        shutil.rmtree(outdir)
    env = dict(os.environ, WRANGLER_SEND_METRICS="false")
    run([str(node_modules / ".bin" / "wrangler"), "deploy", "--dry-run", "--outdir", str(outdir)], cwd=project,
        env=env)


# -- 3. the bundle's contents -----------------------------------------------------------------
def check_bundle(project: Path, outdir: Path, sdk_version: str, vendor_library: bool) -> None:
    main = entry_module(project)
    expected = [main.name] + sorted(  # wrangler names the entry module by its file name
        p.relative_to(main.parent).as_posix() for p in main.parent.rglob("*.py")
        if p != main and "__pycache__" not in p.parts)
    modules = len(expected)
    problems = []
    if vendor_library:
        expected.append("python_modules/durability/__init__.py")
        problems += [f"in the bundle, though a Worker never imports it: python_modules/{part}"
                     for part in NOT_DEPLOYED if (outdir / "python_modules" / part).exists()]
    elif "durability/__init__.py" not in expected:
        problems.append(f"{main.parent / 'durability' / '__init__.py'} does not exist")
    expected.append("python_modules/workers/__init__.py")
    problems += [f"missing from the bundle: {name}" for name in expected if not (outdir / name).is_file()]
    bundled_entry = outdir / main.name
    if bundled_entry.is_file() and bundled_entry.read_bytes() != main.read_bytes():
        problems.append(f"{main.name} in the bundle differs from {main.relative_to(project)}")
    if (outdir / "python_modules").is_dir() and installed_version(outdir / "python_modules") != sdk_version:
        problems.append(f"bundled {SDK} is {installed_version(outdir / 'python_modules')}, not {sdk_version}")
    if problems:
        raise BuildError(f"the deployment bundle in {outdir} is incomplete:\n  " + "\n  ".join(problems))
    count = sum(1 for p in outdir.rglob("*") if p.is_file())
    vendored = "the durability library and " if vendor_library else ""
    say(f"Bundle OK: {outdir} has {count} files, including the {modules} Python modules of "
        f"{main.parent.name}/ and {vendored}{SDK}=={sdk_version} under python_modules/")


def entry_module(project: Path) -> Path:
    return project / str(wrangler_settings(project / "wrangler.toml")["main"])


def wrangler_settings(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


# -- 4. the import in Pyodide ------------------------------------------------------------------
def wrangler_config(path: Path) -> dict[str, Any]:
    """What the Pyodide host needs of ``wrangler.toml``: the main module, its directory, vars, bindings, queues."""
    settings = wrangler_settings(path)
    bindings = settings.get("durable_objects", {}).get("bindings", [])
    queues = settings.get("queues", {})
    return {
        "main": Path(settings["main"]).stem,
        "module_dir": (path.parent / settings["main"]).parent,
        "vars": {k: str(v) for k, v in settings.get("vars", {}).items()},
        "durableObjects": [{"name": b["name"], "className": b["class_name"]} for b in bindings],
        "queues": {"producers": {p["binding"]: p["queue"] for p in queues.get("producers", [])},
                   "consumers": list(queues.get("consumers", []))},
    }


def run_pyodide_host(request: dict[str, Any], node_modules: Path, timeout: float = 600) -> dict[str, Any]:
    """Run the Pyodide host on ``request`` (see host.mjs); its report, or BuildError.

    The host's files are copied into a directory whose ``node_modules`` links
    to ``node_modules``: Node finds a module's packages from where it lies,
    and an installed wheel lies where no ``node_modules`` is."""
    with tempfile.TemporaryDirectory(prefix="durability-host-") as tmp:
        place = Path(tmp)
        shutil.copytree(HOST_DIR, place / "host", ignore=shutil.ignore_patterns("__pycache__"))
        (place / "node_modules").symlink_to(node_modules.resolve(), target_is_directory=True)
        (place / "request.json").write_text(json.dumps(request))
        done = subprocess.run(["node", str(place / "host" / "host.mjs"), str(place / "request.json")], cwd=place,
                              capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BuildError(f"the Pyodide host printed no report (exit {done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    if not report.get("ok"):
        raise BuildError(str(report.get("error", "unknown error")))
    return report


def check_imports(project: Path, outdir: Path, node_modules: Path) -> None:
    """Import the bundle in Pyodide with what it vendors; it must export exactly
    the Durable Object classes wrangler.toml binds (workerd exports every public
    one of the main module), and the Default entrypoint."""
    config = wrangler_config(project / "wrangler.toml")
    request = {
        "trees": [{"dir": str(outdir), "mount": "/worker"}, {"dir": str(outdir / "python_modules"), "mount": "/sdk"}],
        "paths": ["/worker", "/sdk"], "main": config["main"], "task": {"kind": "import"}, "stubFetch": False,
        "config": {"vars": config["vars"], "durableObjects": config["durableObjects"]},
    }
    try:
        found = run_pyodide_host(request, node_modules)["result"]
    except BuildError as error:
        raise BuildError(f"the bundle does not import in Pyodide:\n{error}") from None
    bindings = wrangler_settings(project / "wrangler.toml").get("durable_objects", {}).get("bindings", [])
    wanted = {b["class_name"] for b in bindings if not b.get("script_name")}  # (another script's: not here)
    exported = set(found["durableObjects"])
    problems = []
    if wanted - exported:
        problems.append(f"the entry module lacks {sorted(wanted - exported)}")
    if exported - wanted:
        problems.append(f"it exports Durable Object classes wrangler.toml does not bind: {sorted(exported - wanted)}")
    if "Default" not in found["workerEntrypoints"]:
        problems.append("the entry module lacks ['Default']")
    if problems:
        raise BuildError("; ".join(problems))
    say(f"Bundle imports in Pyodide: Durable Objects {', '.join(sorted(exported))}; entrypoint Default")


# -- the whole build ----------------------------------------------------------------------------
def build(project: Path, outdir: Path | None = None, *, node_modules: Path | None = None,
          sdk_version: str | None = None, before: Callable[[], None] | None = None) -> Path:
    """Vendor, bundle with wrangler, check the bundle and import it in Pyodide;
    the bundle's directory (default ``build/deployment`` in the project).
    Raises BuildError with what is wrong."""
    project = project.resolve()
    if not (project / "wrangler.toml").is_file():
        raise BuildError(f"{project} has no wrangler.toml")
    outdir = (outdir or project / "build" / "deployment").resolve()
    if before is not None:
        before()
    tools = find_node_modules(project, node_modules)
    version = sdk_version or project_sdk_pin(project) or SDK_VERSION
    # A project whose modules hold the library itself (this repository's
    # example) bundles it from there; any other vendors its locked wheel.
    vendor_library = not (entry_module(project).parent / "durability" / "__init__.py").is_file()
    vendor_modules(project, version, vendor_library)
    wrangler_dry_run(project, outdir, tools)
    check_bundle(project, outdir, version, vendor_library)
    check_imports(project, outdir, tools)
    return outdir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durability.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="the Worker project (default: here)")
    parser.add_argument("--outdir", type=Path, default=None, help="the bundle (default: build/deployment in it)")
    parser.add_argument("--node-modules", type=Path, default=None,
                        help=f"a node_modules holding {', '.join(NODE_PACKAGES)} (default: the project's, or above)")
    parser.add_argument("--sdk-version", default=None,
                        help=f"the {SDK} to vendor (default: the project's pin, else {SDK_VERSION})")
    args = parser.parse_args(argv)
    try:
        build(args.project, args.outdir, node_modules=args.node_modules, sdk_version=args.sdk_version)
    except BuildError as error:
        print(f"\ndurability.build: ERROR: {error}", file=sys.stderr)
        return 1
    return 0
