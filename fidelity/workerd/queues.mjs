// Runs a JavaScript queue consumer on real workerd (through the pinned
// wrangler's miniflare and its queue broker, offline) and prints what it saw.
//
//     node fidelity/workerd/queues.mjs REQUEST.json
//
// REQUEST: {"messages": [[body, options | null], ...],
//           "consumer": {miniflare's queue consumer options},
//           "quiet_ms": q, "timeout_ms": t}
// Each message is sent in its own request, in order, to the "jobs" queue;
// the runner then polls the consumer's record until it has not changed for
// `quiet_ms` (the broker has nothing more to deliver) or `timeout_ms` passed.
// Prints one JSON line: {"ok": true, "seen": [...], "settled": bool}.
//
// Lives here: starting workerd with a queue and carrying messages to it.
// Must not know: what the messages say or what is expected of them.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";

const CONSUMER = fileURLToPath(new URL("./queue_consumer.js", import.meta.url));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function settle(mf, quietMs, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let seen = [];
  let changedAt = Date.now();
  while (Date.now() < deadline) {
    await sleep(250);
    const now = await (await mf.dispatchFetch("http://consumer/seen")).json();
    if (now.length !== seen.length) [seen, changedAt] = [now, Date.now()];
    else if (Date.now() - changedAt >= quietMs) return { seen, settled: true };
  }
  return { seen, settled: false };
}

async function main() {
  const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const mf = new Miniflare({
    modules: true,
    scriptPath: CONSUMER,
    compatibilityDate: "2026-04-21",
    queueProducers: { JOBS: { queueName: "jobs" } },
    queueConsumers: { jobs: request.consumer },
  });
  try {
    for (const [body, options] of request.messages) {
      const response = await mf.dispatchFetch("http://consumer/send", {
        method: "POST",
        body: JSON.stringify({ body, options }),
      });
      if (!response.ok) throw new Error(`send answered ${response.status}: ${await response.text()}`);
    }
    const outcome = await settle(mf, request.quiet_ms, request.timeout_ms);
    process.stdout.write(JSON.stringify({ ok: true, ...outcome }) + "\n");
  } finally {
    await mf.dispose();
  }
}

main().catch((error) => {
  process.stdout.write(JSON.stringify({ ok: false, error: String(error?.stack ?? error) }) + "\n");
  process.exitCode = 1;
});
