"""Fixtures: a runtime over the probe Worker and one over the example Worker;
the pinned Node tools installed before the tiers that need them run."""

import pytest

from fidelity.node_tools import NodeToolsError, ensure_node_tools
from support import example_runtime, probe_runtime

NODE_TIERS = ("pyodide", "workerd")  # the marks of the tests that run Node (docs/fidelity.md)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what will not run
def pytest_collection_modifyitems(config, items):
    """Install the Node tools of package-lock.json when a selected test needs them and
    they are missing; stop the session with a clear error when Node is not there."""
    needing = [item for item in items if any(item.get_closest_marker(mark) for mark in NODE_TIERS)]
    if not needing or config.option.collectonly:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(line):
        if reporter is None:
            print(line)
            return
        reporter.ensure_newline()
        reporter.write_line(line)

    try:
        ensure_node_tools(say=say)
    except NodeToolsError as error:
        raise pytest.UsageError(
            f"{len(needing)} selected tests of the Pyodide and workerd tiers need the pinned Node tools: {error}\n"
            f"To run the other tests without them: uv run pytest -m 'not pyodide and not workerd'"
        ) from None


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
