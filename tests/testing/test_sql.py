"""ctx.storage.sql as workerd gives it: cursors, counters, refusals, transactions.

The rows read / written figures are those measured on real workerd (a
JavaScript Durable Object under wrangler dev, wrangler 4.86) and listed in
the project's platform notes.
"""

import pytest

from durability.testing import JsException
from durability.testing._sql import TRANSACTION_REFUSED, SqlDatabase, split_statements


@pytest.fixture
def db():
    database = SqlDatabase()
    database.exec("CREATE TABLE g(id TEXT PRIMARY KEY, deadline INTEGER, v INTEGER)", ())
    database.exec("CREATE INDEX g_deadline ON g(deadline)", ())
    database.exec("CREATE TABLE a(id INTEGER PRIMARY KEY AUTOINCREMENT, x TEXT)", ())
    database.exec("INSERT INTO g VALUES ('x', 1, 1), ('y', 2, 2)", ())
    return database


def counts(db, query, *bindings):
    cursor = db.exec(query, bindings)
    cursor.toArray()
    return cursor.rowsRead, cursor.rowsWritten


@pytest.mark.parametrize(
    "query, bindings, read, written",
    [
        ("INSERT INTO g VALUES (?, NULL, 1)", ("a",), 0, 3),
        ("INSERT INTO g VALUES (?, 5, 1)", ("a",), 0, 3),
        ("UPDATE g SET v = 9 WHERE id = ?", ("x",), 1, 1),
        ("UPDATE g SET deadline = 9 WHERE id = ?", ("x",), 1, 2),
        ("UPDATE g SET v = 9 WHERE id = ?", ("nope",), 0, 0),
        ("UPDATE g SET v = 9 WHERE id = ? RETURNING v", ("x",), 2, 1),
        ("INSERT INTO g VALUES (?, 1, 7) ON CONFLICT (id) DO UPDATE SET v = excluded.v", ("x",), 1, 1),
        ("DELETE FROM g WHERE id = ?", ("x",), 1, 1),
        ("INSERT INTO a (x) VALUES (?)", ("q",), 1, 2),
        ("SELECT * FROM g WHERE id = ?", ("x",), 1, 0),
        ("SELECT * FROM g ORDER BY deadline LIMIT 1", (), 1, 0),
        ("SELECT count(*) FROM g", (), 2, 0),
    ],
)
def test_rows_read_and_written_match_workerd(db, query, bindings, read, written):
    assert counts(db, query, *bindings) == (read, written)


def test_a_full_scan_reads_every_row_even_when_it_returns_none(db):
    assert counts(db, "SELECT * FROM g WHERE v = 100") == (2, 0)


def test_totals_accumulate_over_statements(db):
    before = db.rows_written
    db.exec("INSERT INTO g VALUES ('n', 1, 1)", ())
    db.exec("DELETE FROM g WHERE id = 'n'", ())
    assert db.rows_written - before == 4


def test_bound_number_is_real_and_reads_back_whole():
    db = SqlDatabase()
    row = db.exec("SELECT ? AS v, typeof(?) AS t", (3, 3)).one()
    assert row == {"v": 3, "t": "real"} and type(row["v"]) is int
    assert row.v == 3  # rows allow attribute access like the SDK's JsDict


def test_integers_beyond_2_53_read_back_rounded():
    db = SqlDatabase()
    assert db.exec("SELECT 9007199254740993 AS big", ()).one()["big"] == 9007199254740992.0


def test_cursor_shapes(db):
    cursor = db.exec("SELECT id, v FROM g ORDER BY id", ())
    assert cursor.columnNames == ["id", "v"]
    assert list(cursor.raw()) == [["x", 1], ["y", 2]]
    assert db.exec("SELECT id FROM g ORDER BY id", ()).toArray() == [{"id": "x"}, {"id": "y"}]
    assert [r["id"] for r in db.exec("SELECT id FROM g ORDER BY id", ())] == ["x", "y"]
    cursor = db.exec("SELECT id FROM g WHERE id = 'x'", ())
    assert cursor.next() == {"done": False, "value": {"id": "x"}}
    assert cursor.next()["done"] is True


def test_one_requires_exactly_one_row(db):
    with pytest.raises(JsException, match="but got no results"):
        db.exec("SELECT * FROM g WHERE id = 'none'", ()).one()
    with pytest.raises(JsException, match="but got multiple results"):
        db.exec("SELECT * FROM g", ()).one()


def test_counters_freeze_at_first_read_like_the_sdk_wrapper(db):
    cursor = db.exec("SELECT * FROM g", ())
    assert cursor.rowsRead == 0  # read before consuming: frozen at a partial value
    cursor.toArray()
    assert cursor.rowsRead == 0
    cursor = db.exec("SELECT * FROM g", ())
    cursor.toArray()
    assert cursor.rowsRead == 2


@pytest.mark.parametrize(
    "statement", ["BEGIN", "BEGIN TRANSACTION", "COMMIT", "ROLLBACK", "SAVEPOINT s", "RELEASE s"]
)
def test_transaction_statements_are_refused_with_workerds_message(db, statement):
    with pytest.raises(JsException) as caught:
        db.exec(statement, ())
    assert caught.value.message == TRANSACTION_REFUSED


@pytest.mark.parametrize(
    "statement",
    ["PRAGMA journal_mode = OFF", "ATTACH DATABASE ':memory:' AS other",
     "CREATE TEMP TABLE t (x)", "CREATE TABLE _cf_mine (x)"],
)
def test_other_forbidden_statements_are_not_authorized(db, statement):
    with pytest.raises(JsException, match="not authorized: SQLITE_AUTH"):
        db.exec(statement, ())


def test_allowed_pragma_runs(db):
    assert [r["name"] for r in db.exec("PRAGMA table_info(g)", ()).toArray()] == ["id", "deadline", "v"]


def test_errors_are_worded_as_workerd_words_them(db):
    with pytest.raises(JsException) as caught:
        db.exec("INSERT INTO g VALUES ('x', 1, 1)", ())
    assert caught.value.message == (
        "UNIQUE constraint failed: g.id: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY)"
    )
    with pytest.raises(JsException) as caught:
        db.exec("SELECT * FROM nope", ())
    assert caught.value.message == "no such table: nope: SQLITE_ERROR"


def test_bad_bindings_change_nothing(db):
    before = db.exec("SELECT count(*) AS n FROM g", ()).one()["n"]
    for value in (True, 2**60):
        with pytest.raises(TypeError):
            db.exec("INSERT INTO g VALUES ('z', ?, 1)", (value,))
    assert db.exec("SELECT count(*) AS n FROM g", ()).one()["n"] == before


def test_at_most_100_bound_parameters(db):
    with pytest.raises(JsException, match="too many SQL variables"):
        db.exec("SELECT " + ", ".join("?" * 101), tuple(range(101)))


def test_transaction_sync_rolls_back_on_exception_and_nests(db):
    def inner():
        db.exec("INSERT INTO g VALUES ('inner', 1, 1)", ())
        raise KeyError("inner fails")

    def outer():
        db.exec("INSERT INTO g VALUES ('outer', 1, 1)", ())
        with pytest.raises(KeyError):
            db.run_in_savepoint(inner)
        return "outer result"

    assert db.run_in_savepoint(outer) == "outer result"
    ids = {r["id"] for r in db.exec("SELECT id FROM g", ()).toArray()}
    assert "outer" in ids and "inner" not in ids

    def failing():
        db.exec("INSERT INTO g VALUES ('gone', 1, 1)", ())
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):  # the same exception comes back
        db.run_in_savepoint(failing)
    assert db.exec("SELECT count(*) AS n FROM g WHERE id = 'gone'", ()).one()["n"] == 0


def test_several_statements_run_in_order_and_the_cursor_is_the_last(db):
    cursor = db.exec("CREATE TABLE IF NOT EXISTS s1 (a); INSERT INTO s1 VALUES (1); SELECT a FROM s1", ())
    assert cursor.toArray() == [{"a": 1}]
    assert split_statements("SELECT ';'; SELECT 2") == ["SELECT ';'", "SELECT 2"]


def test_rollback_of_the_batch_discards_uncommitted_writes(db):
    db.commit_batch()
    db.exec("INSERT INTO g VALUES ('uncommitted', 1, 1)", ())
    db.rollback_batch()
    assert db.exec("SELECT count(*) AS n FROM g WHERE id = 'uncommitted'", ()).one()["n"] == 0


def test_writes_are_still_counted_after_the_schema_changes():
    db = SqlDatabase()
    db.exec("CREATE TABLE t (id TEXT PRIMARY KEY, v) WITHOUT ROWID", ())
    first = counts(db, "INSERT INTO t VALUES (?, ?)", "a", 1)
    db.exec("CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, v) WITHOUT ROWID", ())  # a no-op
    db.exec("CREATE TABLE other (x)", ())
    second = counts(db, "INSERT INTO t VALUES (?, ?)", "b", 1)
    db.exec("CREATE INDEX t_v ON t (v)", ())
    third = counts(db, "INSERT INTO t VALUES (?, ?)", "c", 1)
    assert (first, second, third) == ((0, 1), (0, 1), (0, 2))
