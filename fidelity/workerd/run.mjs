// Runs conformance scripts on real workerd (through the pinned wrangler's
// miniflare, offline) and prints what the probe object recorded.
//
//     node fidelity/workerd/run.mjs REQUEST.json
//
// REQUEST: {"scripts": [{"object": name, "ops": [...]}, ...],
//           "alarm": {"object": name, "runs": n, "timeout_ms": t} | null}
// Each script runs in one request to the named object, in order. With
// "alarm", the runner then polls that object's alarm log until it holds
// `runs` runs (the first run throws, so the second is workerd's retry).
// Prints one JSON line: {"ok": true, "results": [...], "alarm": {...}}.
//
// Lives here: starting workerd and carrying scripts to the probe.
// Must not know: what the scripts hold or what is expected of them.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";

const PROBE = fileURLToPath(new URL("./probe.js", import.meta.url));

async function main() {
  const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const mf = new Miniflare({
    modules: true,
    scriptPath: PROBE,
    compatibilityDate: "2026-04-21",
    durableObjects: { PROBE: { className: "Probe", useSQLite: true } },
  });
  try {
    const send = async (object, ops) => {
      const response = await mf.dispatchFetch(`http://probe/?object=${encodeURIComponent(object)}`, {
        method: "POST",
        body: JSON.stringify({ ops }),
      });
      if (!response.ok) throw new Error(`probe answered ${response.status}: ${await response.text()}`);
      return await response.json();
    };
    const results = [];
    for (const script of request.scripts) results.push(await send(script.object, script.ops));
    let alarm = null;
    if (request.alarm) {
      const { object, runs, timeout_ms: timeoutMs } = request.alarm;
      const deadline = Date.now() + timeoutMs;
      do {
        await new Promise((resolve) => setTimeout(resolve, 250));
        [alarm] = await send(object, [{ op: "alarm_log" }]);
      } while (alarm.runs.length < runs && Date.now() < deadline);
    }
    process.stdout.write(JSON.stringify({ ok: true, results, alarm }) + "\n");
  } finally {
    await mf.dispose();
  }
}

main().catch((error) => {
  process.stdout.write(JSON.stringify({ ok: false, error: String(error?.stack ?? error) }) + "\n");
  process.exitCode = 1;
});
