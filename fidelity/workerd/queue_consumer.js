// A JavaScript Worker with a queue producer and consumer, run on real workerd
// by fidelity/workerd/queues.mjs. Each message body says what the consumer
// does with it, as tests/workers/queues.py's consumer does: "ack", "retry",
// "retry_all", "ack_all", "raise" (the handler throws), or nothing.
//
// Lives here: the consumer's handler and a record of what it saw.
// Must not know: which messages a scenario sends or what is expected.
const SEEN = [];

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/send") {
      const { body, options } = await request.json();
      await env.JOBS.send(body, options ?? undefined);
      return new Response("sent");
    }
    return Response.json(SEEN);
  },

  async queue(batch, env, ctx) {
    let failing = false;
    const words = new Set();
    for (const message of batch.messages) {
      const body = message.body;
      SEEN.push({
        queue: batch.queue, body, attempts: message.attempts,
        id: typeof message.id, idLength: message.id.length,
        timestamp: message.timestamp instanceof Date ? "Date" : typeof message.timestamp,
      });
      const word = body !== null && typeof body === "object" && !Array.isArray(body) ? body.do : undefined;
      if (word === "ack") message.ack();
      else if (word === "retry") message.retry({ delaySeconds: body.delay ?? 0 });
      else if (word === "raise") failing = true;
      words.add(word);
    }
    if (words.has("ack_all")) batch.ackAll();
    if (words.has("retry_all")) batch.retryAll({ delaySeconds: 3 });
    if (failing) throw new Error("the consumer failed");
  },
};
