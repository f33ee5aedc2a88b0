// One Durable Object's SQL storage for the Pyodide host: `ctx.storage.sql`
// and `transactionSync` with workerd's shapes, over sql.js (SQLite in WebAssembly).
//
// Lives here: cursors (toArray, one, raw, iteration, columnNames), the
// bindings workerd accepts, refused transaction statements, savepoints.
// Must not know: Pyodide, objects, RPC, alarms.
//
// Row counters: stock SQLite has no per-statement rowsRead / rowsWritten
// (workerd patches its SQLite for them), so reading either here throws
// rather than inventing a number; the conformance probe compares the
// embedded runtime's counts with real workerd instead.

const TRANSACTION_REFUSED =
  "To execute a transaction, please use the state.storage.transaction() or " +
  "state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION " +
  "or SAVEPOINT statements. The JavaScript API is safer because it will " +
  "automatically roll back on exceptions, and because it interacts correctly " +
  "with Durable Objects' automatic atomic write coalescing.";
const TRANSACTION_STATEMENT = /^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b/i;
const MAX_BOUND_PARAMETERS = 100;
const MULTIPLE_STATEMENTS_WITH_PARAMETERS =
  "When executing multiple SQL statements in a single call, only the last statement can have parameters.";

// Whether SQL text has a parameter outside its string literals and quoted names.
function takesParameters(text) {
  return /[?:@$]/.test(text.replace(/'(?:[^']|'')*'|"(?:[^"]|"")*"/g, ""));
}

function toBinding(value) {
  // workerd binds strings, numbers, null and byte buffers; a boolean becomes
  // its text ('true'), as observed on workerd; anything else is a TypeError.
  if (value === null || typeof value === "string" || typeof value === "number") return value;
  if (typeof value === "boolean") return String(value);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (typeof value === "bigint") throw new TypeError("Cannot convert a BigInt value to a number");
  throw new TypeError(`Unsupported SQL binding of type ${typeof value}`);
}

function fromColumn(value) {
  if (value instanceof Uint8Array) return value.slice().buffer;
  return value;
}

// sql.js throws SQLite's message; workerd adds where a syntax error is
// (found here as the token SQLite quotes) and the result code, which
// sql.js hides.
function sqliteError(error, statement = "") {
  const message = error instanceof Error ? error.message : String(error);
  const near = /^near "(.+)": syntax error$/.exec(message);
  if (near && statement.includes(near[1])) return new Error(`${message} at offset ${statement.indexOf(near[1])}`);
  return error instanceof Error ? error : new Error(message);
}

// The PRAGMAs workerd lets through; it refuses every other one.
const ALLOWED_PRAGMAS = new Set([
  "table_list", "table_info", "table_xinfo", "data_version", "page_size", "case_sensitive_like",
  "foreign_keys", "defer_foreign_keys", "ignore_check_constraints", "legacy_alter_table",
  "recursive_triggers", "reverse_unordered_selects", "foreign_key_check", "foreign_key_list",
  "index_info", "index_list", "index_xinfo", "quick_check", "optimize",
]);
const PRAGMA = /^\s*PRAGMA\s+(?:\w+\.)?(\w+)/i;

// What cursor.raw() returns: an iterator of row arrays (a class, as in
// workerd, so the SDK wraps it instead of converting it to a dict).
class SqlStorageRawCursor {
  #iterator;

  constructor(rows) {
    this.#iterator = rows[Symbol.iterator]();
  }

  next() {
    return this.#iterator.next();
  }

  toArray() {
    return [...this.#iterator];
  }

  [Symbol.iterator]() {
    return this;
  }
}

export class SqlStorageCursor {
  #columns;
  #rows;
  #next = 0;

  constructor(columns, rows) {
    this.#columns = columns;
    this.#rows = rows;
  }

  get columnNames() {
    return [...this.#columns];
  }

  get rowsRead() {
    throw new Error("the Pyodide host does not count rows read (stock SQLite has no counter)");
  }

  get rowsWritten() {
    throw new Error("the Pyodide host does not count rows written (stock SQLite has no counter)");
  }

  #object(row) {
    const result = {};
    this.#columns.forEach((name, i) => { result[name] = row[i]; });
    return result;
  }

  #rest() {
    const rest = this.#rows.slice(this.#next);
    this.#next = this.#rows.length;
    return rest;
  }

  toArray() {
    return this.#rest().map((row) => this.#object(row));
  }

  one() {
    const rest = this.#rest();
    if (rest.length === 0) throw new Error("Expected exactly one result from SQL query, but got no results.");
    if (rest.length > 1) throw new Error("Expected exactly one result from SQL query, but got multiple results.");
    return this.#object(rest[0]);
  }

  raw() {
    return new SqlStorageRawCursor(this.#rest());
  }

  next() {
    if (this.#next >= this.#rows.length) return { done: true, value: undefined };
    return { done: false, value: this.#object(this.#rows[this.#next++]) };
  }

  [Symbol.iterator]() {
    return this;
  }
}

export class SqlStorage {
  #db;

  constructor(db) {
    this.#db = db;
  }

  exec(query, ...bindings) {
    if (typeof query !== "string") throw new TypeError("SQL query must be a string");
    if (bindings.length > MAX_BOUND_PARAMETERS) throw new Error("too many SQL variables: SQLITE_ERROR");
    const values = bindings.map(toBinding);
    const statements = this.#db.iterateStatements(query);
    let cursor;
    try {
      // Each statement is prepared only after the one before it ran (it may
      // need a table that one created), as SQLite's own exec loop does.
      for (const statement of statements) {
        try {
          if (TRANSACTION_STATEMENT.test(statement.getSQL())) throw new Error(TRANSACTION_REFUSED);
          const pragma = PRAGMA.exec(statement.getSQL());
          if (pragma && !ALLOWED_PRAGMAS.has(pragma[1].toLowerCase())) throw new Error("not authorized");
          const last = !statements.getRemainingSQL().trim();
          if (!last && takesParameters(statement.getSQL())) throw new Error(MULTIPLE_STATEMENTS_WITH_PARAMETERS);
          if (last && values.length) statement.bind(values);
          const rows = [];
          while (statement.step()) rows.push(statement.get().map(fromColumn));
          cursor = new SqlStorageCursor(statement.getColumnNames(), rows);
        } finally {
          statement.free();
        }
      }
    } catch (error) {
      throw sqliteError(error, query);
    }
    if (cursor === undefined) throw new Error("SQL code did not contain a statement.");
    return cursor;
  }

  get databaseSize() {
    return this.#db.export().byteLength;
  }
}

let savepoints = 0;

// Runs `fn` inside a savepoint: its writes commit together, or none do when it throws.
export function runInSavepoint(db, fn) {
  const name = `_cf_sync_savepoint_${savepoints++}`;
  db.run(`SAVEPOINT ${name}`);
  let result;
  try {
    result = fn();
  } catch (error) {
    db.run(`ROLLBACK TO ${name}`);
    db.run(`RELEASE ${name}`);
    throw error;
  }
  db.run(`RELEASE ${name}`);
  return result;
}
