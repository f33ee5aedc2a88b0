"""The account-concurrency demo with leases: its ground-truth check uses limit + extra for "over"."""

import json
import subprocess
import sys

import pytest

from support import ROOT


@pytest.mark.parametrize("mode", ["strict", "over"])
def test_the_demo_with_leases_keeps_every_promise(mode):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--json", "--jobs", "80", "--shards", "4",
         "--seed", "5", "--fault-rate", "0.05", "--leases", mode],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["leases"] == mode and summary["submitted"] == summary["admitted"] == 80
    expected = {a: limit + (limit // 2 if mode == "over" else 0) for a, limit in summary["limit"].items()}
    assert summary["ceiling"] == expected
    assert all(summary["max_running"][a] <= expected[a] for a in expected)
    assert summary["admitted_via"]["lease"] > 0
    assert summary["leaked_permits"] == 0 and summary["lease_footprint_left"] == 0
    assert summary["jobs_run_twice_at_once"] == 0
