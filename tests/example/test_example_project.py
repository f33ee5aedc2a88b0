"""examples/minimal, a Worker project of its own, against the durability-workers
wheel built from this checkout (scripts/check_example.py): its tests pass with
the wheel installed, and its dry-run bundle, which vendors the wheel's
library without durability/testing, imports in Pyodide. About 30 s."""

import subprocess
import sys

import pytest

from fidelity.pyodide_host import ROOT

pytestmark = [pytest.mark.pyodide]


def test_the_minimal_example_passes_its_tests_on_the_wheel_and_its_bundle_imports_in_pyodide(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_example.py"), "--workdir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "Built durability_workers-0.1.0-py3-none-any.whl" in output
    assert " passed" in output and "failed" not in output
    bundle = tmp_path / "examples" / "minimal" / "build" / "deployment"
    assert (bundle / "python_modules" / "durability" / "semaphore" / "queue" / "shell.py").is_file()
    assert not (bundle / "python_modules" / "durability" / "testing").exists()
    assert "Bundle imports in Pyodide: Durable Objects CallSlots, TaskShard, TenantLimit; entrypoint Default" in output
