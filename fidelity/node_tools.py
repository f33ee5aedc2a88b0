"""The pinned Node tools of package-lock.json: whether node_modules/ holds them, and `npm ci` once when not.

Lives here: reading the lock's top-level packages and the versions
node_modules/ holds, the file lock that lets one process of several install
them, the errors that say what is missing, and running one of the project's
Node runners on a JSON request. Must not know: which tests or scripts use
the tools.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NPM_CI = ["npm", "ci", "--no-audit", "--no-fund"]
NODE_MAJOR = 20  # the oldest Node the pinned wrangler and miniflare support
LOCK_NAME = ".npm-ci.lock"  # beside package-lock.json: node_modules/ itself is replaced by `npm ci`


class NodeToolsError(RuntimeError):
    """The pinned Node tools are not there and cannot be installed here."""


def stale_packages(root: Path = ROOT) -> list[str]:
    """The lock's top-level packages that node_modules/ lacks or holds at another version."""
    packages = json.loads((root / "package-lock.json").read_text(encoding="utf-8"))["packages"]
    top = packages[""]
    names = sorted({**top.get("dependencies", {}), **top.get("devDependencies", {})})
    stale = []
    for name in names:
        locked = packages.get(f"node_modules/{name}", {}).get("version")
        manifest = root / "node_modules" / name / "package.json"
        found = json.loads(manifest.read_text(encoding="utf-8")).get("version") if manifest.is_file() else None
        if found != locked:
            stale.append(f"{name}@{locked} ({'missing' if found is None else f'{found} installed'})")
    return stale


def _check_node() -> None:
    if shutil.which("node") is None:
        raise NodeToolsError(f"node is not on PATH: install Node {NODE_MAJOR} or later (with npm)")
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    major = version.lstrip("v").split(".")[0]
    if not major.isdigit() or int(major) < NODE_MAJOR:
        raise NodeToolsError(f"node {version or '(no version)'} is too old: Node {NODE_MAJOR} or later is needed")


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing): one holder at a time, across processes."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed, even if the process dies
        yield


def _npm_ci(root: Path, stale: list[str], say: Callable[[str], None]) -> None:
    if shutil.which("npm") is None:
        raise NodeToolsError(f"npm is not on PATH, and node_modules/ lacks {', '.join(stale)}: install npm")
    link = root / "node_modules"
    if link.is_symlink():  # `npm ci` would empty the directory it points to, outside this checkout
        raise NodeToolsError(f"node_modules is a link to {link.resolve()} and lacks {', '.join(stale)}: "
                             f"run `npm ci` where it points, or remove the link")
    say(f"Installing the Node tools pinned in package-lock.json ({', '.join(stale)}) "
        f"with `{' '.join(NPM_CI)}`: once per checkout, this takes a minute")
    done = subprocess.run(NPM_CI, cwd=root, capture_output=True, text=True)
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise NodeToolsError(f"`{' '.join(NPM_CI)}` failed with exit code {done.returncode}:\n{output[-3000:]}")
    summary = done.stdout.strip().splitlines()  # "added N packages in Ts"; warnings go to stderr
    say(summary[-1] if summary else "npm ci done")


def ensure_node_tools(root: Path = ROOT, say: Callable[[str], None] = print) -> None:
    """Make sure node runs and node_modules/ holds what package-lock.json pins, running
    `npm ci` when it does not; NodeToolsError says what is missing when that cannot be.

    Several processes may call this at once (pytest sessions side by side, or
    pytest-xdist workers): the first installs under a file lock, the others
    wait for it and then find the tools in place.
    """
    _check_node()
    if not stale_packages(root):
        return
    with _exclusive(root / LOCK_NAME):
        stale = stale_packages(root)  # another process may have installed them while this one waited
        if stale:
            _npm_ci(root, stale, say)
    still = stale_packages(root)
    if still:
        raise NodeToolsError(f"after `npm ci`, node_modules/ still lacks {', '.join(still)}")


def run_json(runner: Path, request: dict[str, Any], timeout_s: float = 300) -> dict[str, Any]:
    """Run a Node runner that reads ``request`` from the JSON file named by its
    argument and prints one JSON line ``{"ok": ..., ...}``; that line, or a
    RuntimeError with what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "request.json"
        path.write_text(json.dumps(request))
        done = subprocess.run(["node", str(runner), str(path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{runner.name} printed nothing (exit {done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    if not report["ok"]:
        raise RuntimeError(report["error"])
    return report
