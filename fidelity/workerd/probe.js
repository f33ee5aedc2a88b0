// The conformance probe's Durable Object on real workerd: runs a script of
// storage and alarm operations and records what happened.
//
// Lives here: the JavaScript interpreter of probe operations (its Python
// twin is fidelity/workers/conformance.py; both record the same shapes).
// Must not know: which statements a script holds or what is expected.

// JSON has no BigInt: {"bigint": "digits"} stands for one (what Pyodide makes of a large int).
function bindings(op) {
  return (op.bindings ?? []).map((b) => (b !== null && typeof b === "object" && "bigint" in b ? BigInt(b.bigint) : b));
}

function record(run) {
  try {
    return run();
  } catch (error) {
    return { error: String(error.message), kind: error.name };
  }
}

function cursorRecord(cursor, how) {
  const result = { columns: cursor.columnNames };
  if (how === "raw") result.rows = [...cursor.raw()];
  else if (how === "one") result.rows = [cursor.one()];
  else result.rows = cursor.toArray();
  result.rowsRead = cursor.rowsRead;
  result.rowsWritten = cursor.rowsWritten;
  return result;
}

export class Probe {
  constructor(state) {
    this.storage = state.storage;
    this.sql = state.storage.sql;
  }

  step(op) {
    switch (op.op) {
      case "sql":
        return record(() => cursorRecord(this.sql.exec(op.query, ...bindings(op)), op.how));
      case "counters_twice": {
        // Counters read before and after consuming the cursor.
        return record(() => {
          const cursor = this.sql.exec(op.query, ...bindings(op));
          const before = [cursor.rowsRead, cursor.rowsWritten];
          cursor.toArray();
          return { before, after: [cursor.rowsRead, cursor.rowsWritten] };
        });
      }
      case "transaction":
        return record(() => ({
          value: this.storage.transactionSync(() => {
            op.ops.forEach((inner) => {
              const result = this.step(inner);
              if (result.error) throw new Error(result.error);
            });
            if (op.fail) throw new Error("rolled back on purpose");
            return op.value ?? null;
          }),
        }));
      default:
        return { error: `unknown op ${op.op}`, kind: "Error" };
    }
  }

  async fetch(request) {
    const { ops } = await request.json();
    const results = [];
    for (const op of ops) {
      if (op.op === "set_alarm_in_past") {
        this.sql.exec("CREATE TABLE IF NOT EXISTS probe_alarms (run INTEGER, retry INTEGER, is_retry INTEGER, alarm_during REAL)");
        await this.storage.setAlarm(Date.now() - op.ago_ms);
        results.push({ alarmSet: true });
      } else if (op.op === "sync") {
        await this.storage.sync();
        results.push({ synced: true });
      } else if (op.op === "alarm_log") {
        const rows = this.sql.exec("SELECT run, retry, is_retry, alarm_during FROM probe_alarms ORDER BY run").toArray();
        results.push({ runs: rows, alarmAfter: await this.storage.getAlarm() });
      } else {
        results.push(this.step(op));
      }
    }
    return Response.json(results);
  }

  async alarm(info) {
    // getAlarm() inside the handler; the first run throws, so it is retried.
    const during = await this.storage.getAlarm();
    const runs = this.sql.exec("SELECT count(*) AS n FROM probe_alarms").one().n;
    this.sql.exec("INSERT INTO probe_alarms VALUES (?, ?, ?, ?)", runs + 1, info?.retryCount ?? -1,
      info?.isRetry ? 1 : 0, during);
    if (runs === 0) throw new Error("the first alarm run fails on purpose");
  }
}

export default {
  async fetch(request, env) {
    const name = new URL(request.url).searchParams.get("object") ?? "probe";
    return env.PROBE.get(env.PROBE.idFromName(name)).fetch(request);
  },
};
