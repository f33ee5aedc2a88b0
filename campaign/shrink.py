"""Shrinking a failing scenario, and printing it as a pytest case.

Lives here: ``shrink(scenario, fails)``, a greedy search that keeps the first
smaller candidate (``scenario.smaller``) that still fails, until none does
or the budget of runs is spent, and ``as_pytest_case``. Must not know: how a
run is checked; ``fails`` decides.
"""

from __future__ import annotations

from collections.abc import Callable

from .scenario import Scenario, smaller


def shrink(scenario: Scenario, fails: Callable[[Scenario], bool], budget: int = 400) -> tuple[Scenario, int]:
    """The smallest failing scenario found, and how many runs it took."""
    runs = 0
    current = scenario
    improved = True
    while improved and runs < budget:
        improved = False
        for candidate in smaller(current):
            if runs >= budget:
                break
            runs += 1
            if candidate.size() < current.size() and fails(candidate):
                current, improved = candidate, True
                break
    return current, runs


def as_pytest_case(scenario: Scenario, invariants: list[str]) -> str:
    name = f"test_campaign_{scenario.mode}_seed_{scenario.seed}" + (f"_{scenario.plant}" if scenario.plant else "")
    return (
        "from campaign.run import run\n"
        "from campaign.scenario import Change, Hold, Job, Outage, Partition, Restart, Scenario\n\n\n"
        f"def {name}():\n"
        f"    # shrunk from a failing campaign run: {', '.join(invariants)}\n"
        f"    scenario = {scenario.to_literal()}\n"
        "    outcome = run(scenario)\n"
        "    assert not outcome.violations, outcome.violations.first\n"
    )
