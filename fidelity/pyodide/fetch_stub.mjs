// A stand-in for workerd's global `fetch` in the Pyodide host, for requests
// to STUB_ORIGIN only: it answers by path as the tests' receiver on
// 127.0.0.1 does, after 20 ms of virtual time, and records every request
// and how many of one account were in flight at once.
//   /ok 200 · /flaky 503 to a job's first request, then 200 ·
//   /reset rejects a job's first request as a lost connection, then 200 · /gone 410
//
// Lives here: the stub and its record. Must not know: Pyodide, the Worker.
export const STUB_ORIGIN = "https://hooks.test";

export function installFetchStub() {
  const realFetch = globalThis.fetch;
  const record = { deliveries: {}, peak: {} };
  const inFlight = {};
  globalThis.fetch = async (input, init) => {
    const request = new Request(input, init);
    if (!request.url.startsWith(`${STUB_ORIGIN}/`)) return realFetch(input, init);
    const body = JSON.parse(await request.text());
    const seen = (record.deliveries[body.id] ??= []);
    seen.push({
      ...body,
      method: request.method,
      redirect: request.redirect,
      idempotency_key: request.headers.get("idempotency-key"),
      content_type: request.headers.get("content-type"),
    });
    const account = body.account;
    inFlight[account] = (inFlight[account] ?? 0) + 1;
    record.peak[account] = Math.max(record.peak[account] ?? 0, inFlight[account]);
    try {
      await new Promise((resolve) => setTimeout(resolve, 20));
      const path = new URL(request.url).pathname;
      if (path === "/reset" && seen.length === 1) throw new TypeError("Network connection lost.");
      const status = path === "/gone" ? 410 : path === "/flaky" && seen.length === 1 ? 503 : 200;
      return new Response(null, { status });
    } finally {
      inFlight[account] -= 1;
    }
  };
  return record;
}
