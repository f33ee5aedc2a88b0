"""The conformance probe (tier T3): real workerd, the embedded runtime and
real Pyodide run one script of storage and alarm operations, and the
statements the library issues are replayed on workerd; any difference
outside ``fidelity.conformance.ALLOWED`` fails.
"""

import pytest

from durability.testing._sql import SqlCursor, SqlDatabase
from fidelity import conformance

pytestmark = [pytest.mark.workerd]


@pytest.fixture(scope="module")
def scripts():
    return conformance.basic_scripts()


@pytest.fixture(scope="module")
def workerd(scripts):
    return conformance.run_workerd(scripts)


@pytest.fixture(scope="module")
def library():
    scripts = conformance.library_statements(jobs=30)
    return scripts, conformance.run_workerd(scripts, alarm=None)


def test_workerd_did_what_the_script_asks(workerd):
    # The alarm set in the past ran, threw, and was retried once; getAlarm()
    # answered null inside the handler.
    runs = workerd["alarm"]["runs"]
    assert [(r["run"], r["retry"], r["is_retry"], r["alarm_during"]) for r in runs] == [
        (1, 0, 0, None), (2, 1, 1, None)]
    assert workerd["alarm"]["alarmAfter"] is None


def test_embedded_runtime_matches_workerd(scripts, workerd):
    assert conformance.differences(workerd, conformance.run_embedded(scripts), "embedded", scripts) == []


@pytest.mark.pyodide
def test_pyodide_host_matches_workerd(scripts, workerd):
    assert conformance.differences(workerd, conformance.run_pyodide(scripts), "pyodide", scripts) == []


def test_library_statements_cost_on_workerd_what_the_runtime_bills(library):
    scripts, workerd = library
    found, totals = conformance.replay_differences(scripts, workerd)
    assert found == []
    # Dozens of distinct statements over thousands of executions, every one
    # billed the rows read and written that workerd bills.
    assert totals["distinct"] >= 40 and totals["statements"] >= 1_000
    assert totals["embedded_written"] == totals["workerd_written"] > 0
    assert totals["embedded_read"] == totals["workerd_read"] > 0


def test_the_probe_catches_a_wrong_write_count(library, monkeypatch):
    scripts, workerd = library
    real_cost = SqlDatabase._cost

    def cost_with_free_deletes(self, shape, *args):
        reads, writes = real_cost(self, shape, *args)
        return reads, 0 if shape.deletes else writes

    monkeypatch.setattr(SqlDatabase, "_cost", cost_with_free_deletes)
    replayed = conformance.library_statements(jobs=30)
    found, _ = conformance.replay_differences(replayed, workerd)
    assert any("DELETE" in line and "embedded read" in line for line in found)


def test_the_probe_catches_a_wrong_cursor(scripts, workerd, monkeypatch):
    # A one() that returns the first of many rows instead of throwing.
    monkeypatch.setattr(SqlCursor, "one", lambda self: self.toArray()[0])
    found = conformance.differences(workerd, conformance.run_embedded(scripts), "embedded", scripts)
    assert any("SELECT n FROM t" in line for line in found)
