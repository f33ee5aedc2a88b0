"""Fixtures: a runtime over the probe Worker and one over the example Worker."""

import pytest

from support import example_runtime, probe_runtime


@pytest.fixture
def probe():
    with probe_runtime() as runtime:
        yield runtime


@pytest.fixture
def example():
    with example_runtime() as runtime:
        yield runtime


def pytest_terminal_summary(terminalreporter):
    """The hostile-message property tests' counts (refused, accepted, crashed),
    and the docs' Python blocks run and marked not run."""
    from docs_blocks import census_lines
    from hostile import Tally

    for title, lines in (("hostile messages", Tally.lines()), ("docs", census_lines())):
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)
