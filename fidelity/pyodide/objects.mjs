// The Durable Object surface workerd gives a Python Worker, for the Pyodide
// host: ids, namespaces, stubs whose calls cross as RPC does, ctx.storage
// with SQL and the one alarm, and the ExecutionContext of an entrypoint.
//
// Lives here: object instances (one per id, created on first call), the
// structured clone of arguments and replies, how errors reach the caller,
// alarm delivery with retries. Must not know: Pyodide internals (Python is
// reached only through the `glue` functions handed in) or any Worker.
import { createHash, randomBytes } from "node:crypto";
import { eventOfItsOwn } from "./events.mjs";
import { queueBindings } from "./queues.mjs";
import { SqlStorage, runInSavepoint } from "./sql.mjs";

const ALARM_MAX_RETRIES = 6;
const ALARM_FIRST_BACKOFF_MS = 2_000;
const MAX_TIMER_MS = 2 ** 31 - 1;
const STANDARD_ERRORS = { TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError };

export class DurableObjectId {
  #hex;
  #name;

  constructor(hex, name) {
    this.#hex = hex;
    this.#name = name;
  }

  get name() {
    return this.#name;
  }

  toString() {
    return this.#hex;
  }

  equals(other) {
    return other instanceof DurableObjectId && other.toString() === this.#hex;
  }
}

// An error as the caller of an RPC method sees it: a copy that keeps the
// name and message (Python exceptions arrive as name "PythonError").
function asRemoteError(error) {
  const name = error?.name ?? "Error";
  const Kind = STANDARD_ERRORS[name] ?? Error;
  const copy = new Kind(error?.message ?? String(error));
  if (copy.name !== name) copy.name = name;
  return copy;
}

export class DurableObjectStorage {
  #object;
  sql;

  constructor(object) {
    this.#object = object;
    this.sql = new SqlStorage(object.db);
  }

  transactionSync(fn) {
    return runInSavepoint(this.#object.db, () => fn());
  }

  async getAlarm() {
    return this.#object.alarmAt;
  }

  // sql.js writes at once: every write is as durable here as it will be.
  async sync() {}

  async setAlarm(time) {
    const at = time instanceof Date ? time.getTime() : time;
    if (typeof at !== "number" || !Number.isFinite(at)) throw new TypeError("setAlarm() requires a number or Date");
    this.#object.setAlarm(at);
  }

  async deleteAlarm() {
    this.#object.setAlarm(null);
  }
}

export class DurableObjectState {
  id;
  storage;
  #object;

  constructor(object) {
    this.#object = object;
    this.id = object.id;
    this.storage = new DurableObjectStorage(object);
  }

  waitUntil(promise) {
    this.#object.host.track(promise);
  }

  async blockConcurrencyWhile(fn) {
    return await fn();
  }

  abort(reason) {
    this.#object.reset();
    throw new Error(reason ?? "Durable Object abort requested");
  }
}

export class ExecutionContext {
  #host;

  constructor(host) {
    this.#host = host;
  }

  waitUntil(promise) {
    this.#host.track(promise);
  }

  passThroughOnException() {}
}

class ObjectInstance {
  constructor(host, className, id) {
    this.host = host;
    this.className = className;
    this.id = id;
    this.db = new host.SQL.Database();
    this.alarmAt = null;
    this.alarmRetry = 0;
    this.alarmTimer = null;
    this.alarmRunning = false;
    this.instance = null;
  }

  python() {
    if (this.instance === null) {
      const ctx = new DurableObjectState(this);
      this.instance = this.host.glue.construct(this.host.pythonClass(this.className), ctx, this.host.env);
    }
    return this.instance;
  }

  reset() {
    this.instance = null;
  }

  async call(method, args) {
    await eventOfItsOwn();
    try {
      return await this.host.glue.call_method(this.python(), method, ...args);
    } catch (error) {
      throw asRemoteError(error);
    }
  }

  setAlarm(at) {
    this.alarmAt = at;
    this.alarmRetry = 0;
    this.armAlarm();
  }

  armAlarm() {
    clearTimeout(this.alarmTimer);
    this.alarmTimer = null;
    if (this.alarmAt === null || this.alarmRunning) return;
    // A timer longer than 2^31 - 1 ms fires after 1 ms (as in browsers and
    // Node), so a far alarm (a month's retention, say) waits in steps.
    const delay = Math.min(MAX_TIMER_MS, Math.max(0, this.alarmAt - Date.now()));
    this.alarmTimer = setTimeout(() => {
      if (Date.now() < this.alarmAt) this.armAlarm();
      else this.host.track(this.deliverAlarm());
    }, delay);
  }

  async deliverAlarm() {
    this.alarmTimer = null;
    const retry = this.alarmRetry;
    this.alarmAt = null; // getAlarm() answers null while the handler runs
    this.alarmRunning = true;
    this.host.stats.alarms += 1;
    let failed = false;
    try {
      await this.host.glue.call_alarm(this.python(), { retryCount: retry, isRetry: retry > 0 });
    } catch (error) {
      failed = true;
      this.host.log(`alarm of ${this.className} failed: ${error.message}`);
    } finally {
      this.alarmRunning = false;
    }
    if (failed && retry < ALARM_MAX_RETRIES) {
      const retryAt = Date.now() + ALARM_FIRST_BACKOFF_MS * 2 ** retry;
      if (this.alarmAt === null || retryAt <= this.alarmAt) {
        this.alarmAt = retryAt;
        this.alarmRetry = retry + 1;
      }
    }
    this.armAlarm();
  }
}

// A stub: any property but `id`, `name` and `then` is an RPC method.
function makeStub(object) {
  const target = { id: object.id, name: object.id.name };
  return new Proxy(target, {
    get(t, prop) {
      if (typeof prop !== "string") return undefined;
      if (prop in t) return t[prop];
      if (prop === "then" || prop === "toJSON") return undefined;
      return async (...args) => {
        object.host.stats.rpcCalls += 1;
        const sent = structuredClone(args);
        const reply = await object.call(prop, sent);
        return structuredClone(reply);
      };
    },
  });
}

export class DurableObjectNamespace {
  #host;
  #className;

  constructor(host, className) {
    this.#host = host;
    this.#className = className;
  }

  idFromName(name) {
    const hex = createHash("sha256").update(`${this.#className}\0${name}`).digest("hex");
    return new DurableObjectId(hex, name);
  }

  idFromString(hex) {
    if (!/^[0-9a-f]{64}$/.test(hex)) throw new TypeError("Invalid Durable Object ID: must be 64 hex digits");
    return new DurableObjectId(hex, undefined);
  }

  newUniqueId() {
    return new DurableObjectId(randomBytes(32).toString("hex"), undefined);
  }

  get(id) {
    return makeStub(this.#host.object(this.#className, id));
  }

  getByName(name) {
    return this.get(this.idFromName(name));
  }
}

// Every object of one Worker, its env, and the entrypoint calls into it.
export class WorkerHost {
  constructor({ SQL, glue, module, config, log }) {
    this.SQL = SQL;
    this.glue = glue;
    this.module = module;
    this.objects = new Map();
    this.background = new Set();
    this.errors = [];
    this.stats = { rpcCalls: 0, alarms: 0, entrypointCalls: 0 };
    this.log = log;
    this.env = { ...config.vars };
    for (const binding of config.durableObjects) {
      this.env[binding.name] = new DurableObjectNamespace(this, binding.className);
    }
    const { brokers, bindings } = queueBindings(this, config.queues);
    this.queues = brokers;
    Object.assign(this.env, bindings);
  }

  defaultEntrypoint() {
    return this.glue.construct(this.pythonClass("Default"), new ExecutionContext(this), this.env);
  }

  // Deliver what every queue holds until nothing is left; what each queue did.
  async settleQueues() {
    const stats = {};
    for (const [name, broker] of this.queues) {
      await broker.settle();
      stats[name] = broker.stats;
    }
    return stats;
  }

  pythonClass(className) {
    const cls = this.module[className];
    if (typeof cls !== "function") throw new TypeError(`There is no '${className}' class in the Worker's main module`);
    return cls;
  }

  object(className, id) {
    const key = `${className}:${id.toString()}`;
    let object = this.objects.get(key);
    if (!object) {
      object = new ObjectInstance(this, className, id);
      this.objects.set(key, object);
    }
    return object;
  }

  // As if the runtime gave up on an object's alarm and evicted the object.
  loseAlarm(className, name) {
    const object = this.object(className, new DurableObjectNamespace(this, className).idFromName(name));
    object.setAlarm(null);
    object.reset();
  }

  track(promise) {
    const tracked = Promise.resolve(promise).catch((error) => this.errors.push(String(error?.message ?? error)));
    this.background.add(tracked);
    tracked.finally(() => this.background.delete(tracked));
  }

  // One call of a method of the Default entrypoint, as a service binding makes it.
  async callEntrypoint(method, args) {
    this.stats.entrypointCalls += 1;
    await eventOfItsOwn();
    const ctx = new ExecutionContext(this);
    const instance = this.glue.construct(this.pythonClass("Default"), ctx, this.env);
    try {
      const reply = await this.glue.call_method(instance, method, ...structuredClone(args));
      return structuredClone(reply);
    } catch (error) {
      throw asRemoteError(error);
    }
  }

  // One HTTP request to the Default entrypoint's fetch, as workerd makes it:
  // the handler gets the JavaScript Request itself and may return the SDK's
  // Response, whose js_object workerd sends. Resolves to {status, body}.
  async fetchEntrypoint({ url, method, headers, body }) {
    this.stats.entrypointCalls += 1;
    await eventOfItsOwn();
    const ctx = new ExecutionContext(this);
    const instance = this.glue.construct(this.pythonClass("Default"), ctx, this.env);
    const request = new Request(url, { method, headers, body: body ?? undefined });
    const result = await this.glue.call_fetch(instance, request);
    const response = result?.js_object ?? result;
    return { status: response.status, body: await response.text() };
  }
}
