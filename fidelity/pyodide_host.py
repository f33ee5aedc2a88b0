"""Run a Worker in real Pyodide from Python: the launcher of ``fidelity/pyodide/host.mjs``.

Lives here: building the host's request (the Worker's modules, the SDK
vendored at the pinned version, the scenarios, the bindings and vars of
``wrangler.toml``), running Node, and reading its one JSON line back.
Must not know: what a scenario checks.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from durability.build import wrangler_config  # (what the deployment check reads of wrangler.toml too)

ROOT = Path(__file__).resolve().parent.parent
HOST = ROOT / "fidelity" / "pyodide" / "host.mjs"
SCENARIOS = ROOT / "fidelity" / "scenarios"
SDK_DIST = "workers-runtime-sdk"


class PyodideHostError(RuntimeError):
    """The host could not run the task: the Worker failed in Pyodide."""


def copy_sdk(target: Path) -> str:
    """Copy the installed SDK's files (the wheel uv.lock pins) to ``target``; return its version."""
    dist = metadata.distribution(SDK_DIST)
    for file in dist.files or []:
        if file.parts[0].endswith(".dist-info") or file.suffix == ".pyc" or "__pycache__" in file.parts:
            continue
        source = Path(dist.locate_file(file))
        destination = target / file
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
    return dist.version


def run_host(task: dict[str, Any], *, wrangler: Path = ROOT / "wrangler.toml",
             module_dir: Path | None = None, sdk_dir: Path | None = None,
             vars: dict[str, str] | None = None, worker: dict[str, Any] | None = None,
             stub_fetch: bool = False, timeout: float = 600) -> dict[str, Any]:
    """Run ``task`` on the Worker of ``wrangler`` in Pyodide; return the host's report.

    ``module_dir`` replaces the directory of the main module (to run a
    variant of the Worker); ``sdk_dir`` gives an SDK tree to use instead of
    the installed one (the deployment's ``python_modules``, say); ``worker``
    (``main``, ``module_dir``, ``vars``, ``durableObjects``, and ``queues``:
    ``{"producers": {binding: queue}, "consumers": [...]}``) replaces the
    configuration read from ``wrangler``. ``stub_fetch`` answers the
    Worker's requests to ``https://hooks.test`` with ``fetch_stub.mjs``.
    """
    config = worker or wrangler_config(wrangler)
    config["vars"] = {**config.get("vars", {}), **(vars or {})}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if sdk_dir is None:
            sdk_dir = tmp / "sdk"
            copy_sdk(sdk_dir)
        request = {
            "trees": [
                {"dir": str(module_dir or config["module_dir"]), "mount": "/worker"},
                {"dir": str(sdk_dir), "mount": "/sdk"},
                {"dir": str(SCENARIOS), "mount": "/fidelity/scenarios"},
            ],
            "paths": ["/worker", "/sdk", "/fidelity"],
            "main": config["main"],
            "config": {"vars": config["vars"], "durableObjects": config["durableObjects"],
                       "queues": config.get("queues", {})},
            "task": task,
            "stubFetch": stub_fetch,
        }
        (tmp / "request.json").write_text(json.dumps(request))
        done = subprocess.run(["node", str(HOST), str(tmp / "request.json")], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise PyodideHostError(f"the host printed no report (exit {done.returncode}):\n{done.stderr[-4000:]}")
    report = json.loads(lines[-1])
    if not report.get("ok"):
        raise PyodideHostError(report.get("error", "unknown error"))
    return report
