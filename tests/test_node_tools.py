"""The test session's installer of the pinned Node tools (fidelity/node_tools.py),
against a stand-in npm that records its runs: `npm ci` runs only when
node_modules/ lacks a locked package or holds another version, once however
many processes ask at the same time, and a missing node or npm is a clear error."""

import json
import os
import sys
import threading

import pytest

from fidelity.node_tools import NodeToolsError, ensure_node_tools, stale_packages

LOCKED = {"pyodide": "0.28.2", "@sinonjs/fake-timers": "15.0.0"}

# Writes node_modules/ as the lock says after a pause, so that callers overlap; logs each run.
FAKE_NPM = """#!{python}
import json, pathlib, sys, time
root = pathlib.Path.cwd()
with open(root / "npm-runs.log", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
time.sleep(0.2)
packages = json.loads((root / "package-lock.json").read_text())["packages"]
for name in packages[""]["devDependencies"]:
    target = root / "node_modules" / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "package.json").write_text(json.dumps({{"version": packages["node_modules/" + name]["version"]}}))
print("added {{}} packages in 0.2s".format(len(packages) - 1))
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A directory with a package-lock.json, and a PATH of a stand-in node and npm only."""
    lock = {"packages": {"": {"devDependencies": {name: version for name, version in LOCKED.items()}},
                         **{f"node_modules/{name}": {"version": v} for name, v in LOCKED.items()}}}
    (tmp_path / "package-lock.json").write_text(json.dumps(lock))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "node", "#!/bin/sh\necho v20.20.2\n")
    _script(bin_dir / "npm", FAKE_NPM.format(python=os.path.realpath(sys.executable)))
    monkeypatch.setenv("PATH", str(bin_dir))
    return tmp_path


def _script(path, text):
    path.write_text(text)
    path.chmod(0o755)


def _runs(root):
    log = root / "npm-runs.log"
    return log.read_text().splitlines() if log.exists() else []


def test_missing_packages_are_installed_once_with_a_message(checkout):
    said = []
    assert stale_packages(checkout) == ["@sinonjs/fake-timers@15.0.0 (missing)", "pyodide@0.28.2 (missing)"]
    ensure_node_tools(checkout, say=said.append)
    assert _runs(checkout) == ["ci --no-audit --no-fund"]
    assert "Installing the Node tools pinned in package-lock.json" in said[0] and "pyodide@0.28.2" in said[0]
    assert said[1] == "added 2 packages in 0.2s"
    ensure_node_tools(checkout, say=said.append)  # in place now: npm is not run again
    assert _runs(checkout) == ["ci --no-audit --no-fund"] and len(said) == 2


def test_a_package_at_another_version_is_installed_again(checkout):
    ensure_node_tools(checkout, say=lambda line: None)
    (checkout / "node_modules" / "pyodide" / "package.json").write_text(json.dumps({"version": "0.27.0"}))
    assert stale_packages(checkout) == ["pyodide@0.28.2 (0.27.0 installed)"]
    ensure_node_tools(checkout, say=lambda line: None)
    assert len(_runs(checkout)) == 2 and stale_packages(checkout) == []


def test_processes_asking_at_once_run_npm_ci_once(checkout):
    errors = []

    def ask():
        try:
            ensure_node_tools(checkout, say=lambda line: None)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(4)]  # each opens the lock file itself
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(_runs(checkout)) == 1


def test_no_node_is_a_clear_error(checkout):
    (checkout / "bin" / "node").unlink()
    with pytest.raises(NodeToolsError, match="node is not on PATH: install Node 20 or later"):
        ensure_node_tools(checkout)


def test_an_old_node_is_a_clear_error(checkout):
    _script(checkout / "bin" / "node", "#!/bin/sh\necho v18.19.0\n")
    with pytest.raises(NodeToolsError, match="node v18.19.0 is too old"):
        ensure_node_tools(checkout)


def test_no_npm_is_a_clear_error_when_packages_are_missing(checkout):
    (checkout / "bin" / "npm").unlink()
    with pytest.raises(NodeToolsError, match="npm is not on PATH, and node_modules/ lacks .*pyodide@0.28.2"):
        ensure_node_tools(checkout)


def test_a_failing_npm_ci_is_reported_with_its_output(checkout):
    _script(checkout / "bin" / "npm", "#!/bin/sh\necho 'npm error network ETIMEDOUT' >&2\nexit 1\n")
    with pytest.raises(NodeToolsError, match="(?s)failed with exit code 1:.*ETIMEDOUT"):
        ensure_node_tools(checkout, say=lambda line: None)


def test_a_linked_node_modules_is_never_replaced(checkout, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("shared") / "node_modules"
    (elsewhere / "keep").mkdir(parents=True)
    (checkout / "node_modules").symlink_to(elsewhere)
    with pytest.raises(NodeToolsError, match="node_modules is a link to .* run `npm ci` where it points"):
        ensure_node_tools(checkout)
    assert _runs(checkout) == [] and (elsewhere / "keep").is_dir()
