"""Versioned schemas: each primitive's tables, created and migrated in place.

Lives here: one small table recording each component's schema version,
``migrate``/``drop`` that move a component from the version it has to the
version the code needs, in one transaction, and ``public_migrate``, the
``migrate(ctx, version)`` each primitive offers its users.
Must not know: any component's tables beyond the statements it is handed.
"""

from __future__ import annotations

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
    rather than silently used.
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
        for version in range(current + 1, target + 1):
            for statement in steps[version]:
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


def drop(sql: Sql, component: str, tables: Sequence[str]) -> None:
    """Remove a component's tables and its version record, in one transaction."""

    def apply() -> None:
        for table in tables:
            sql.exec(f"DROP TABLE IF EXISTS {table}")
        sql.exec(_VERSIONS)
        sql.exec("DELETE FROM durability_schema WHERE component = ?", component)

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
