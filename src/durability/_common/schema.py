"""Versioned schemas: each primitive's tables, created and migrated in place.

Lives here: one small table recording each component's schema version,
``migrate``/``drop`` that move a component from the version it has to the
version the code needs, in one transaction, and ``public_migrate``, the
``migrate(ctx, version)`` each primitive offers its users.
Must not know: any component's tables beyond the statements it is handed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .sql import Sql

_VERSIONS = """
CREATE TABLE IF NOT EXISTS durability_schema (
  component TEXT PRIMARY KEY,
  version INTEGER NOT NULL
) WITHOUT ROWID
"""


def schema_version(sql: Sql, component: str) -> int:
    sql.exec(_VERSIONS)
    row = sql.one("SELECT version FROM durability_schema WHERE component = ?", component)
    return int(row["version"]) if row else 0


#: a step's statement, or a function of the storage and the version the component had before this migration
Step = str | Callable[[Sql, int], None]


def migrate(sql: Sql, component: str, steps: Mapping[int, Sequence[Step]]) -> int:
    """Bring ``component`` to the highest version in ``steps``; return that version.

    ``steps[n]`` holds the statements that take version ``n - 1`` to ``n``
    (a function among them is called with the storage and the version the
    component had, in the same transaction).
    A database already at a newer version than the code knows is refused
    rather than silently used. A component made new (version 0) gets each
    column a later version adds in the ``CREATE TABLE`` that makes its
    table (``folded``): the same table, with no ``ALTER TABLE``, which
    workerd bills a row written and a read of the whole schema each.
    """
    target = max(steps)
    current = schema_version(sql, component)
    if current == target:
        return current
    if current > target:
        raise RuntimeError(
            f"{component}: storage holds schema version {current}, newer than this code's {target}"
        )

    def apply() -> None:
        statements = [step for version in range(current + 1, target + 1) for step in steps[version]]
        for statement in folded(statements) if current == 0 else statements:
            if callable(statement):
                statement(sql, current)
            else:
                sql.exec(statement)
        sql.exec(
            "INSERT INTO durability_schema (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            component,
            target,
        )

    sql.transaction(apply)
    return target


_CREATE = re.compile(r"\s*CREATE TABLE (?:IF NOT EXISTS )?(\w+) \((.*)\)(\s*WITHOUT ROWID)?\s*;?\s*$",
                     re.DOTALL | re.IGNORECASE)
_ADD_COLUMN = re.compile(r"\s*ALTER TABLE (\w+) ADD (?:COLUMN )?([^;]+?)\s*;?\s*$", re.DOTALL | re.IGNORECASE)
#: a table constraint after the columns (a line comment may come between): a
#: column added must come before it, so such a table is not folded
_TABLE_CONSTRAINT = re.compile(
    r",(?:\s|--[^\n]*\n)*(?:CONSTRAINT\s+\w+\s+)?(?:PRIMARY KEY|UNIQUE|CHECK|FOREIGN KEY)\s*\(", re.IGNORECASE)


def folded(statements: Sequence[Step]) -> list[Step]:
    """``statements`` with each ``ALTER TABLE t ADD COLUMN c`` moved into the
    ``CREATE TABLE t`` made earlier among them, when that statement lists
    columns only: the table they make is the same, column for column. (For a
    component made new: a ``CREATE TABLE IF NOT EXISTS`` that finds its table
    made would skip the columns its ALTERs added; every version of this library
    writes a component's version row in the transaction that makes its tables.)"""
    out: list[Step] = []
    creates: dict[str, int] = {}  # table -> index of its CREATE in ``out``
    for statement in statements:
        create = _CREATE.match(statement) if isinstance(statement, str) else None
        add = _ADD_COLUMN.match(statement) if isinstance(statement, str) else None
        if create and ";" not in create.group(2) and not _TABLE_CONSTRAINT.search(create.group(2)):
            creates[create.group(1)] = len(out)
        elif add and add.group(1) in creates:
            at = creates[add.group(1)]
            made = _CREATE.match(str(out[at]))
            assert made is not None
            # (The comma on a line of its own: the last column's line may end with a comment.)
            out[at] = (f"CREATE TABLE IF NOT EXISTS {made.group(1)} ({made.group(2)}\n"
                       f"  , {add.group(2)}\n){made.group(3) or ''}")
            continue
        out.append(statement)
    return out


def drop(sql: Sql, component: str, tables: Sequence[str]) -> None:
    """Remove a component's tables and its version records (its own, and
    any ``component.<name>`` row it keeps there), in one transaction."""

    def apply() -> None:
        for table in tables:
            sql.exec(f"DROP TABLE IF EXISTS {table}")
        sql.exec(_VERSIONS)
        sql.exec("DELETE FROM durability_schema WHERE component = ? OR component GLOB ?", component, f"{component}.*")

    sql.transaction(apply)


def public_migrate(component: str, tables: Sequence[str], what: str) -> Callable[[Any, int | None], None]:
    """The ``migrate(ctx, version)`` a primitive offers (as a staticmethod):
    ``None`` removes ``tables``, described to users as ``what``; any other
    version is refused (schemas move forward by themselves, at construction)."""

    def migrate(ctx: Any, version: int | None) -> None:
        if version is not None:
            raise ValueError("only migrate(ctx, None), which removes the schema, is supported")
        drop(Sql(ctx), component, tables)

    migrate.__doc__ = f"``migrate(ctx, None)`` removes {what}."
    return staticmethod(migrate)
