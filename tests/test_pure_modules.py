"""The protocol's decisions stay pure: their modules import no I/O, and storage knows no protocol.

Read from the source, not by importing: an import added anywhere in a
pure module (or in a module it imports) fails here.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

#: decisions and vocabularies, each tested without any runtime
PURE = [
    "durability._checks", "durability._wire", "durability.locks.line",
    "durability.semaphore.messages", "durability.semaphore.allocation", "durability.semaphore.leases",
    "durability.semaphore.queue_states", "durability.semaphore.queue_core", "durability.semaphore.queue_lease_rules",
    "durability.semaphore.holder_line", "durability.semaphore.tree", "durability.semaphore.fairness",
    "durability.semaphore.parked", "durability.semaphore.lease_entry",
    "durability.semaphore.allocation_records", "durability.semaphore.allocation_reclaim",
    "durability.semaphore.allocation_replies", "durability.semaphore.allocation_terms",
    "durability.semaphore.allocation_shares", "durability.semaphore.allocation_round",
    "durability.semaphore.wire_checks", "durability.semaphore.wire_requests", "durability.semaphore.wire_replies",
    "durability.semaphore.wire_usage",
    "durability.retention",
]
#: the standard library a pure module may use: nothing that waits, reads a clock, or touches the outside
PURE_STDLIB = {"__future__", "bisect", "collections", "collections.abc", "dataclasses", "enum", "functools",
               "hashlib", "heapq", "itertools", "json", "math", "operator", "typing"}
#: modules that keep rows: they must not know the protocol or its decisions
STORAGE = ["durability.semaphore.queue_store", "durability.semaphore.queue_schema", "durability.semaphore.grant_book",
           "durability.semaphore.lease_book"]
PROTOCOL = {"durability.semaphore.messages", "durability.semaphore.wire_checks", "durability.semaphore.wire_requests",
            "durability.semaphore.wire_replies", "durability.semaphore.wire_usage", "durability.semaphore.queue_core",
            "durability.semaphore.queue_lease_rules", "durability.semaphore.allocation"}


def imports_of(module: str) -> set[str]:
    """The absolute names of every module ``module`` imports (relative imports resolved)."""
    path = SRC.joinpath(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = module if path.is_dir() else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            names.add(f"{base}.{node.module}" if node.level and node.module else (node.module or base))
    return names


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_only_pure_modules_and_a_pure_part_of_the_standard_library(module):
    for name in imports_of(module):
        assert name in PURE or name in PURE_STDLIB, f"{module} imports {name}"


@pytest.mark.parametrize("module", STORAGE)
def test_storage_imports_neither_the_wire_nor_the_decisions(module):
    assert not imports_of(module) & PROTOCOL


def test_the_check_reads_imports_as_python_does():
    assert "durability.semaphore.messages" in imports_of("durability.semaphore.queue_core")
    assert "durability._checks" in imports_of("durability.semaphore.leases")
    assert "asyncio" in imports_of("durability.semaphore.queue_requests")  # a shell module does I/O


def test_no_class_of_the_library_is_over_400_lines():
    for path in (SRC / "durability").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno < 400, f"{path.name}: {node.name} is over 400 lines"
