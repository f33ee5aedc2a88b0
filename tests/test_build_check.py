"""``python -m durability.build``, the deployment check the wheel ships: what it needs, and what it says without it.

The whole build runs on examples/minimal in tests/example/test_example_project.py
(through scripts/build_deployment.py, which calls it).
"""

import json
import subprocess
import sys
import tomllib

from durability import build
from support import ROOT


def test_the_check_names_the_versions_this_library_is_tested_with():
    with open(ROOT / "pyproject.toml", "rb") as f:
        assert f"workers-runtime-sdk=={build.SDK_VERSION}" in tomllib.load(f)["dependency-groups"]["dev"]
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]
    assert {name: pinned[name] for name in build.NODE_PACKAGES} == build.NODE_PACKAGES
    assert (build.HOST_DIR / "host.mjs").is_file()


def test_it_imports_the_standard_library_only():
    code = ("import sys; before = set(sys.modules); import durability.build; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
            "- set(sys.stdlib_module_names) - {'durability'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_without_the_node_tools_it_says_what_to_install(tmp_path):
    (tmp_path / "wrangler.toml").write_text('main = "src/entry.py"\n')
    done = subprocess.run([sys.executable, "-m", "durability.build", "--project", str(tmp_path),
                           "--node-modules", str(tmp_path / "node_modules")], capture_output=True, text=True)
    assert done.returncode == 1
    assert "durability.build: ERROR:" in done.stderr
    assert "npm install --save-dev wrangler@4.86.0 pyodide@0.28.2 sql.js@1.13.0" in done.stderr


def test_a_directory_without_wrangler_toml_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "durability.build", "--project", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "has no wrangler.toml" in done.stderr
