"""workerd's rules for SQL: its limits, what it refuses, and how it words SQLite's errors.

Lives here: the limits of one statement, the messages of the statements
workerd refuses (transactions, most PRAGMAs, temporary objects, its own
``_cf_`` tables, parameters before the last statement), and a SQLite error
as workerd reports it (message, offset, code, extended code).
Must not know: the database; its authorizer and its ``exec`` apply these.
"""

from __future__ import annotations

import re
import sqlite3

from ._values import JsException

# workerd's limits for one statement (see shared platform notes).
MAX_BOUND_PARAMETERS = 100
MAX_STATEMENT_BYTES = 100_000
MAX_ROW_BYTES = 2_000_000

TRANSACTION_REFUSED = (
    "To execute a transaction, please use the state.storage.transaction() or "
    "state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION "
    "or SAVEPOINT statements. The JavaScript API is safer because it will "
    "automatically roll back on exceptions, and because it interacts correctly "
    "with Durable Objects' automatic atomic write coalescing."
)

MULTIPLE_STATEMENTS_WITH_PARAMETERS = (
    "When executing multiple SQL statements in a single call, only the last "
    "statement can have parameters."
)

_PRIMARY_ERROR_NAMES = {
    1: "SQLITE_ERROR", 2: "SQLITE_INTERNAL", 3: "SQLITE_PERM", 4: "SQLITE_ABORT",
    5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 7: "SQLITE_NOMEM", 8: "SQLITE_READONLY",
    9: "SQLITE_INTERRUPT", 10: "SQLITE_IOERR", 11: "SQLITE_CORRUPT",
    13: "SQLITE_FULL", 18: "SQLITE_TOOBIG", 19: "SQLITE_CONSTRAINT",
    20: "SQLITE_MISMATCH", 21: "SQLITE_MISUSE", 23: "SQLITE_AUTH", 25: "SQLITE_RANGE",
}

# The PRAGMAs workerd lets through (its authorizer); every other one is refused.
_ALLOWED_PRAGMAS = {
    "table_list", "table_info", "table_xinfo", "data_version", "page_size",
    "case_sensitive_like", "foreign_keys", "defer_foreign_keys",
    "ignore_check_constraints", "legacy_alter_table", "recursive_triggers",
    "reverse_unordered_selects", "foreign_key_check", "foreign_key_list",
    "index_info", "index_list", "index_xinfo", "quick_check", "optimize",
}
NOT_AUTHORIZED = "not authorized: SQLITE_AUTH"
_TEMP_ACTIONS = {
    sqlite3.SQLITE_CREATE_TEMP_TABLE, sqlite3.SQLITE_CREATE_TEMP_INDEX,
    sqlite3.SQLITE_CREATE_TEMP_VIEW, sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
    sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH,
}

_SYNTAX_ERROR = re.compile(r'near "(.+)": syntax error')


def _js_error(error: sqlite3.Error, statement: str = "") -> JsException:
    """A SQLite error worded as workerd words it: message, offset, code, extended code."""
    code = getattr(error, "sqlite_errorcode", None)
    extended = getattr(error, "sqlite_errorname", None)
    if code is None:
        return JsException(str(error))
    primary = _PRIMARY_ERROR_NAMES.get(code & 0xFF, extended or "SQLITE_ERROR")
    message = str(error)
    # workerd adds where the syntax error is; Python's sqlite3 does not say,
    # but the token SQLite quotes is found at that offset.
    near = _SYNTAX_ERROR.fullmatch(message)
    if near and near.group(1) in statement:
        message += f" at offset {statement.index(near.group(1))}"
    message = f"{message}: {primary}"
    if extended and extended != primary:
        message += f" (extended: {extended})"
    return JsException(message)
