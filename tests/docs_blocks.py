"""The docs' Python blocks: found, run, and counted, for tests/test_docs.py.

Each fenced ```python block runs as a module of its own, on CPython, with
the embedded runtime at hand. Two HTML comments, invisible on the rendered
page, may sit beside it:

- ``<!-- setup`` ... ``-->`` just before the opening fence: code run first
  in the block's module (imports, or stand-ins for what the page leaves to
  the reader). ``include(page, text)`` there runs the setup and code of
  another block (the first of ``page`` containing ``text``) in this
  module, for a block that builds on one shown before it;
- ``<!-- check`` ... ``-->`` just after the closing fence: code run last in
  the same module, with ``worker`` bound to that module, which drives what
  the block defined (its Durable Objects through a ``Runtime``) and asserts
  what the page says it does.

A block that cannot run says why on the line just before its fence:
``<!-- not run: REASON -->``. A block that is neither runnable nor marked
fails, naming its file and line; so does a block that defines a Durable
Object and has no check to drive it (tests/test_docs.py). Run this file
as a script for the count of blocks to run and marked.
Must not know: pytest; the tests decide what a failure means.
"""

from __future__ import annotations

import re
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import durability.testing  # noqa: F401  (puts the `workers` stand-in in place before any block imports it)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
NOT_RUN = re.compile(r"^\s*<!-- not run: (\S.*?)\s*-->\s*$")
OPENS = {"setup": re.compile(r"^\s*<!-- setup\s*$"), "check": re.compile(r"^\s*<!-- check\s*$")}
CLOSES = re.compile(r"^\s*-->\s*$")

#: what the blocks came to in this run, for the terminal summary (conftest.py)
CENSUS: dict[str, list[str]] = {"run": [], "not run": []}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  #: the opening fence's line, from 1
    code: str
    code_line: int  #: the first code line's number
    setup: str = ""
    setup_line: int = 0
    check: str = ""
    check_line: int = 0
    not_run: str | None = None  #: the reason, when the page marks it not runnable

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _comment_before(lines: list[str], fence: int) -> tuple[str, int]:
    """The ``<!-- setup`` comment ending on the line before ``fence`` (0-based): its code and first line."""
    end = fence - 1
    if end < 0 or not CLOSES.match(lines[end]):
        return "", 0
    start = end - 1
    while start >= 0 and not CLOSES.match(lines[start]) and not OPENS["setup"].match(lines[start]):
        start -= 1
    if start < 0 or not OPENS["setup"].match(lines[start]):
        return "", 0
    return "\n".join(lines[start + 1:end]), start + 2


def _comment_after(lines: list[str], closing: int) -> tuple[str, int]:
    """The ``<!-- check`` comment starting on the line after ``closing`` (0-based)."""
    start = closing + 1
    if start >= len(lines) or not OPENS["check"].match(lines[start]):
        return "", 0
    end = start + 1
    while end < len(lines) and not CLOSES.match(lines[end]):
        end += 1
    return "\n".join(lines[start + 1:end]), start + 2


def blocks(path: Path) -> list[Block]:
    """The Python blocks of one page, with their setup, check or mark."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        closing = i + 1
        while closing < len(lines) and not lines[closing].strip().startswith(fence):
            closing += 1
        if language.lower() in PYTHON:
            code = textwrap.dedent("\n".join(line[len(indent):] if line.startswith(indent) else line
                                             for line in lines[i + 1:closing]))
            mark = NOT_RUN.match(lines[i - 1]) if i > 0 else None
            setup, setup_line = _comment_before(lines, i)
            check, check_line = _comment_after(lines, closing)
            found.append(Block(path, i + 1, code, i + 2, setup, setup_line, check, check_line,
                               mark.group(1) if mark else None))
        i = closing + 1
    return found


def every_block() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def _exec(source: str, first_line: int, path: Path, namespace: dict) -> None:
    # Padded so that a traceback names the page's own line numbers.
    exec(compile("\n" * (first_line - 1) + source, str(path), "exec"), namespace)


def _include(namespace: dict) -> Callable[[str, str], None]:
    def include(page: str, text: str) -> None:
        """Run, in this module, the setup and code of the first block of ``page`` containing ``text``."""
        found = [block for block in blocks(ROOT / page) if text in block.code]
        if not found:
            raise LookupError(f"no python block of {page} contains {text!r}")
        if found[0].setup:
            _exec(found[0].setup, found[0].setup_line, found[0].path, namespace)
        _exec(found[0].code, found[0].code_line, found[0].path, namespace)

    return include


def run_block(block: Block) -> types.ModuleType:
    """Run a block's setup, code and check in one fresh module; return the module."""
    name = "docs_" + re.sub(r"\W", "_", f"{block.path.stem}_{block.line}")
    module = types.ModuleType(name)
    module.__file__ = str(block.path)
    module.__dict__["include"] = _include(module.__dict__)
    sys.modules[name] = module  # dataclasses and pickling look classes up there
    try:
        if block.setup:
            _exec(block.setup, block.setup_line, block.path, module.__dict__)
        _exec(block.code, block.code_line, block.path, module.__dict__)
        if block.check:
            module.__dict__["worker"] = module
            _exec(block.check, block.check_line, block.path, module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module


def defines_durable_objects(module: types.ModuleType) -> bool:
    from workers import DurableObject

    return any(isinstance(value, type) and issubclass(value, DurableObject) and value.__module__ == module.__name__
               for value in vars(module).values())


def census_lines() -> list[str]:
    if not (CENSUS["run"] or CENSUS["not run"]):
        return []
    return [f"{len(CENSUS['run'])} Python blocks of the docs run, {len(CENSUS['not run'])} marked not run"]


if __name__ == "__main__":
    everything = every_block()
    marked = [block for block in everything if block.not_run is not None]
    print(f"{len(everything) - len(marked)} Python blocks of the docs to run, {len(marked)} marked not run:")
    for block in marked:
        print(f"  {block.where}: {block.not_run}")
