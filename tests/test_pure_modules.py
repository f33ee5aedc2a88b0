"""Each folder of the library imports only what its place in the map allows (docs/design.md, "The map").

Read from the source, not by importing: an import added anywhere that
crosses a line the map draws fails here. The pure rules (every module
under a ``pure/`` folder, the wire format, the checks) import nothing that
waits, reads a clock or touches the outside; storage knows no protocol.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
LIB = SRC / "durability"

#: the standard library a pure module may use: nothing that waits, reads a clock, or touches the outside
PURE_STDLIB = {"__future__", "bisect", "collections", "collections.abc", "dataclasses", "enum", "functools",
               "hashlib", "heapq", "itertools", "json", "math", "operator", "typing"}
#: pure modules outside a pure/ folder
PURE_SHARED = ("durability._common.checks", "durability._common.wire", "durability._common.rates",
               "durability.locks.line",
               "durability.jobs.retention")
PURE_FOLDERS = ("durability.semaphore.messages",)

#: a folder (the longest prefix wins) -> the library's folders and modules it may import
MAY_IMPORT = {
    "durability._common": ["durability._common"],
    "durability.retry": [],
    "durability.scheduler": ["durability._common", "durability.retry", "durability.scheduler"],
    "durability.jobs": ["durability._common", "durability.retry", "durability.scheduler", "durability.jobs"],
    "durability.outbox": ["durability._common", "durability.retry", "durability.scheduler"],
    "durability.semaphore.messages": ["durability._common.checks", "durability._common.wire",
                                      "durability.semaphore.messages"],
    "durability.semaphore.holder.pure": ["durability._common.checks", "durability._common.rates",
                                         "durability.semaphore.messages", "durability.semaphore.holder.pure"],
    "durability.semaphore.queue.pure": ["durability._common.checks", "durability.semaphore.messages",
                                        "durability.semaphore.queue.pure"],
    "durability.semaphore.tree.pure": ["durability.semaphore.messages", "durability.semaphore.holder.pure",
                                       "durability.semaphore.tree.pure"],
    # The holder reaches its tree through the tree's folder, and its clients by their ids.
    "durability.semaphore.holder": ["durability._common", "durability.scheduler", "durability.semaphore.messages",
                                    "durability.semaphore.holder", "durability.semaphore.tree",
                                    "durability.semaphore.identity", "durability.semaphore.client"],
    "durability.semaphore.queue": ["durability._common", "durability.retry", "durability.scheduler",
                                   "durability.outbox", "durability.semaphore.messages",
                                   "durability.semaphore.queue", "durability.semaphore.identity",
                                   "durability.semaphore.client"],
    # A tree's link is a holder's: it keeps its loans in the holder's rows and reaches its parent as a client.
    "durability.semaphore.tree": ["durability._common", "durability.scheduler", "durability.semaphore.messages",
                                  "durability.semaphore.holder.pure", "durability.semaphore.holder.store",
                                  "durability.semaphore.tree", "durability.semaphore.client"],
    "durability.semaphore.client": ["durability.semaphore.messages", "durability.semaphore.tree.pure"],
    "durability.semaphore.identity": ["durability.semaphore.messages", "durability.semaphore.queue.input"],
    "durability.semaphore": ["durability.semaphore"],  # the package's public face: its parts
    "durability.locks": ["durability._common", "durability.locks"],
    "durability.transforms": ["durability._common"],
    "durability.experimental": ["durability.semaphore"],
    "durability.build": ["durability.build"],
    "durability.testing": ["durability._common", "durability.testing"],
    "durability": ["durability"],  # the library's public face: its parts
}
#: modules that keep rows: they must not know the protocol or its decisions
STORAGE = ["durability.semaphore.queue.store", "durability.semaphore.queue.schema",
           "durability.semaphore.queue.grant_book", "durability.semaphore.queue.lease_book"]
PROTOCOL = ("durability.semaphore.messages", "durability.semaphore.queue.pure.core",
            "durability.semaphore.queue.pure.lease_rules", "durability.semaphore.holder.pure")


def modules() -> list[str]:
    names = []
    for path in sorted(LIB.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


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
            module = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            names.add(module)
            if within(module, "durability"):  # "from .. import semaphore" imports durability.semaphore
                names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def is_pure(module: str) -> bool:
    """In a pure module, or a name imported from one."""
    return any(within(module, m) for m in PURE_SHARED + PURE_FOLDERS) or ".pure." in module + "."


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def folder_of(module: str) -> str | None:
    return max((f for f in MAY_IMPORT if within(module, f)), key=len, default=None)


PURE = [m for m in modules() if is_pure(m)]


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_imports_only_pure_modules_and_a_pure_part_of_the_standard_library(module):
    for name in imports_of(module):
        assert is_pure(name) or name in PURE_STDLIB, f"{module} imports {name}"


@pytest.mark.parametrize("module", [m for m in modules() if folder_of(m)])
def test_a_module_imports_only_what_its_folder_may(module):
    allowed = MAY_IMPORT[folder_of(module)]
    for name in imports_of(module):
        if within(name, "durability"):
            assert any(within(name, a) for a in allowed), f"{module} imports {name}"


@pytest.mark.parametrize("module", STORAGE)
def test_storage_imports_neither_the_wire_nor_the_decisions(module):
    assert not {n for n in imports_of(module) if any(within(n, p) for p in PROTOCOL)}


def test_every_module_of_the_library_has_a_place_in_the_map():
    assert len(PURE) > 10  # (a rule over no module checks nothing)
    assert [m for m in modules() if folder_of(m) in (None, "durability") and m != "durability"] == []


def test_the_check_reads_imports_as_python_does():
    assert "durability.semaphore.messages" in imports_of("durability.semaphore.queue.pure.core")
    assert "durability._common.checks" in imports_of("durability.semaphore.holder.pure.leases")
    assert "asyncio" in imports_of("durability.semaphore.queue.requests")  # a shell module does I/O


def test_no_module_of_the_library_is_over_400_lines():
    for path in LIB.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, f"{path.relative_to(SRC)} is over 400 lines"
