"""The Markdown tables the benchmark scripts print: a header of column names, then one row per system.

Lives here: ``markdown``, which joins cells already formatted by the script.
Must not know what any column measures: each script formats its own cells.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: ``columns`` as the header, each of ``rows`` a line of cells."""
    lines = ["| " + " | ".join(columns) + " |", "| --- " * len(columns) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
