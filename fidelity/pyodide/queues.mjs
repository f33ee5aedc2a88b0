// Cloudflare Queues for the Pyodide host: a producer binding shaped as
// workerd's and delivery to Default.queue(batch, env, ctx) as workerd calls a
// class entrypoint's handler, so that the real SDK wraps both as it does in
// production (its env wrapper converts what a WorkerQueue is sent; its queue
// wrapper converts what a handler reads of the batch).
//
// Lives here: WorkerQueue (send, sendBatch), QueueMessage and MessageBatch
// (ack, retry, ackAll, retryAll, kept as workerd keeps them: the first word
// about a message stands and outranks the batch's), and QueueBroker: from each
// send on, deliver what waits until nothing is left, a batch once max_batch_size
// messages are ready or the oldest ready one has waited max_batch_timeout,
// on the virtual clock, every batch due at once (the embedded runtime's tests
// show the rest of the broker's rules; this tier shows the handler's
// shape); settle() waits for it. Must not know: any Worker.
import { randomBytes } from "node:crypto";
import { eventOfItsOwn } from "./events.mjs";

export class WorkerQueue {
  #broker;

  constructor(broker) {
    this.#broker = broker;
  }

  async send(body, options) {
    this.#broker.put(body, options ?? {});
  }

  async sendBatch(messages, options) {
    for (const message of messages) this.#broker.put(message.body, { ...(options ?? {}), ...message });
  }
}

class QueueMessage {
  constructor(stored) {
    this.id = stored.id;
    this.timestamp = new Date(stored.sentAt);
    this.body = structuredClone(stored.body);
    this.attempts = stored.attempts;
    this.decided = null;
    this.delaySeconds = undefined;
  }

  ack() {
    if (this.decided === null) this.decided = "ack";
  }

  retry(options) {
    if (this.decided === "ack") return;
    this.decided = "retry";
    if (options?.delaySeconds !== undefined) this.delaySeconds = options.delaySeconds;
  }
}

class MessageBatch {
  constructor(queue, messages) {
    this.queue = queue;
    this.messages = messages;
    this.decided = null;
    this.delaySeconds = undefined;
  }

  ackAll() {
    if (this.decided === null) this.decided = "ack";
  }

  retryAll(options) {
    if (this.decided !== null) return;
    this.decided = "retry";
    this.delaySeconds = options?.delaySeconds;
  }
}

export class QueueBroker {
  constructor(host, name, consumer) {
    this.host = host;
    this.name = name;
    this.consumer = { max_batch_size: 10, max_batch_timeout: 5, max_retries: 3, retry_delay: 0, ...consumer };
    this.waiting = [];
    this.sequence = 0;
    this.handling = 0;  // batches being handled
    this.timer = null;
    this.stats = { sent: 0, batches: 0, acked: 0, retried: 0, dropped: 0 };
  }

  // Delivered in the background from the send on, as the runtime does:
  // every batch due is handed out at once, and the next comes due on a timer.
  put(body, options) {
    this.store(body, options);
    this.kick();
  }

  store(body, options) {
    const type = options.contentType ?? "json";
    if (type === "text" && typeof body !== "string") throw new TypeError('Content Type "text" requires a value of type string');
    const stored = type === "json" ? JSON.parse(JSON.stringify(body)) : structuredClone(body);
    const now = Date.now();
    this.waiting.push({ id: randomBytes(16).toString("hex"), seq: this.sequence++, body: stored, sentAt: now,
                        readyAt: now + 1000 * (options.delaySeconds ?? 0), attempts: 0 });
    this.stats.sent += 1;
  }

  kick() {
    clearTimeout(this.timer);
    this.timer = null;
    const batches = this.dueBatches(Date.now());
    for (const batch of batches) this.waiting = this.waiting.filter((m) => !batch.includes(m));
    for (const batch of batches) {
      this.handling += 1;
      this.host.track(this.deliver(batch).finally(() => { this.handling -= 1; this.kick(); }));
    }
    if (this.waiting.length > 0) this.timer = setTimeout(() => this.kick(), this.nextDue(Date.now()) - Date.now());
  }

  // Wait until the queue has handled everything it holds.
  async settle() {
    while (this.handling > 0 || this.waiting.length > 0) await new Promise((resolve) => setTimeout(resolve, 100));
  }

  dueBatches(now) {
    const { max_batch_size: size, max_batch_timeout: timeout } = this.consumer;
    const ready = this.waiting.filter((m) => m.readyAt <= now).sort((a, b) => a.readyAt - b.readyAt || a.seq - b.seq);
    const batches = [];
    while (ready.length >= size || (ready.length > 0 && ready[0].readyAt + 1000 * timeout <= now)) {
      batches.push(ready.splice(0, size));
    }
    return batches;
  }

  nextDue(now) {
    const ready = this.waiting.filter((m) => m.readyAt <= now).map((m) => m.readyAt + 1000 * this.consumer.max_batch_timeout);
    return Math.min(...this.waiting.filter((m) => m.readyAt > now).map((m) => m.readyAt), ...ready);
  }

  async deliver(stored) {
    await eventOfItsOwn();
    for (const message of stored) message.attempts += 1;
    const batch = new MessageBatch(this.name, stored.map((m) => new QueueMessage(m)));
    this.stats.batches += 1;
    let returned = true;
    try {
      const instance = this.host.defaultEntrypoint();
      await this.host.glue.call_queue(instance, batch);
    } catch (error) {
      returned = false;
      this.host.log(`queue consumer failed: ${error.message}`);
    }
    stored.forEach((message, i) => this.settleOne(message, batch, batch.messages[i], returned));
  }

  settleOne(stored, batch, message, returned) {
    const decided = message.decided ?? batch.decided ?? (returned ? "ack" : "retry");
    if (decided === "ack") {
      this.stats.acked += 1;
      return;
    }
    this.stats.retried += 1;
    if (stored.attempts > this.consumer.max_retries) {
      this.stats.dropped += 1;
      return;
    }
    const delay = message.delaySeconds ?? batch.delaySeconds ?? this.consumer.retry_delay;
    stored.readyAt = Date.now() + 1000 * delay;
    this.waiting.push(stored);
  }
}

// The brokers of a Worker's queues and the producer bindings for its env.
export function queueBindings(host, queues) {
  const brokers = new Map();
  for (const consumer of queues?.consumers ?? []) {
    brokers.set(consumer.queue, new QueueBroker(host, consumer.queue, consumer));
  }
  const bindings = {};
  for (const [binding, name] of Object.entries(queues?.producers ?? {})) {
    if (!brokers.has(name)) brokers.set(name, new QueueBroker(host, name, {}));
    bindings[binding] = new WorkerQueue(brokers.get(name));
  }
  return { brokers, bindings };
}
