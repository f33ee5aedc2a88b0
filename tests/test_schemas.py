"""A component made new gets, in fewer statements, the very tables an old one upgraded step by step has."""

import types

import pytest

from durability import outbox
from durability._common.schema import folded, migrate
from durability._common.sql import Sql
from durability.jobs import records
from durability.locks import store as locks_store
from durability.scheduler import alarm
from durability.semaphore import DurabilitySemaphoreQueue
from durability.semaphore.holder import store as holder_store
from durability.semaphore.queue import schema as queue_schema
from support import SchemaStorage

SCHEMAS = {
    "scheduler": alarm._SCHEMA, "jobs": records._SCHEMA, "outbox": outbox._SCHEMA,
    "semaphore": holder_store._SCHEMA, "semaphore-queue": queue_schema._SCHEMA, "locks": locks_store._SCHEMA,
}


#: the queue's tables only objects made before its version 9 have
OLDER_QUEUE_TABLES = {queue_schema.GRANTS, queue_schema.LEASES, queue_schema.SPOKEN}


def as_older_versions_ran(steps):
    """The steps as the versions that wrote them ran them: every table made."""
    return {v: [s.statement if isinstance(s, queue_schema.OlderTable) else s for s in vs] for v, vs in steps.items()}


def made(steps, *, from_version=None, storage=None, component="c"):
    storage = storage or SchemaStorage()
    sql = Sql(types.SimpleNamespace(storage=storage))
    if from_version is not None:  # an object made by an old version, then upgraded
        migrate(sql, component, {v: s for v, s in as_older_versions_ran(steps).items() if v <= from_version})
    before = storage.db.rows_written
    migrate(sql, component, steps)
    return storage.shape(), storage.db.rows_written - before


@pytest.mark.parametrize("component", sorted(SCHEMAS))
def test_a_component_made_new_has_the_tables_of_one_upgraded_from_its_first_version(component):
    steps = SCHEMAS[component]
    new, _ = made(steps)
    upgraded, _ = made(steps, from_version=1)
    older = OLDER_QUEUE_TABLES if component == "semaphore-queue" else set()
    assert new == {table: shape for table, shape in upgraded.items() if table not in older}
    assert older <= set(upgraded)


@pytest.mark.parametrize("from_version", [1, 5, 8])
def test_only_a_queue_made_before_version_9_says_it_has_the_older_tables(from_version):
    new, upgraded = SchemaStorage(), SchemaStorage()
    _, new_rows = made(queue_schema._SCHEMA, storage=new)
    made(queue_schema._SCHEMA, from_version=from_version, storage=upgraded)
    legacy = "SELECT version FROM durability_schema WHERE component = 'semaphore-queue.legacy'"
    assert new.exec(legacy).toArray() == [] and not OLDER_QUEUE_TABLES & new.tables()
    # The version table, the items', the pacing and the label tables (two rows
    # a CREATE TABLE, as workerd bills it), and the version's row.
    assert new_rows == 9
    assert upgraded.exec(legacy).toArray() == [{"version": from_version}]


def test_a_queue_removed_leaves_no_version_row_of_its_own():
    storage = SchemaStorage()
    made(queue_schema._SCHEMA, from_version=8, storage=storage, component=queue_schema.COMPONENT)
    DurabilitySemaphoreQueue.migrate(types.SimpleNamespace(storage=storage), None)
    assert storage.exec("SELECT component FROM durability_schema").toArray() == []
    assert storage.tables() == {"durability_schema"}


def test_a_new_queue_and_job_runner_are_made_with_no_alter_table():
    for steps in (queue_schema._SCHEMA, records._SCHEMA):
        statements = [s for v in sorted(steps) for s in steps[v]]
        assert not [s for s in folded(statements) if isinstance(s, str) and "ALTER TABLE" in s]
        assert [s for s in statements if isinstance(s, str) and "ALTER TABLE" in s]  # (the steps do add columns)


@pytest.mark.parametrize("create", [
    "CREATE TABLE t (a TEXT, b TEXT, PRIMARY KEY (a, b)) WITHOUT ROWID",
    "CREATE TABLE t (a TEXT, b TEXT, CONSTRAINT ab PRIMARY KEY (a, b)) WITHOUT ROWID",
    "CREATE TABLE t (a TEXT, b TEXT,  -- the pair\n  UNIQUE (a, b))",
])
def test_a_table_with_a_constraint_after_its_columns_is_left_to_its_alter_table(create):
    statements = [create, "ALTER TABLE t ADD COLUMN c REAL"]
    assert folded(statements) == statements


def test_a_folded_table_is_the_table_its_statements_make_however_they_end():
    steps = {1: ["CREATE TABLE IF NOT EXISTS t (a TEXT PRIMARY KEY,  -- a note\n  b TEXT) WITHOUT ROWID;"],
             2: ["ALTER TABLE t ADD COLUMN c REAL NOT NULL DEFAULT 0;"], 3: ["ALTER TABLE t ADD d INTEGER"]}
    new, new_rows = made(steps)
    upgraded, _ = made(steps, from_version=1)
    assert new == upgraded and len(new["t"][1]) == 4
