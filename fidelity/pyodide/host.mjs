// Runs a Python Worker in real Pyodide 0.28.2 under Node, with the real
// `workers` SDK and a workerd-like ctx and env, on virtual time.
//
//     node fidelity/pyodide/host.mjs REQUEST.json
//
// REQUEST names the directories to copy into Pyodide's file system (the
// Worker's modules, the vendored SDK, the scenarios), the Worker's main
// module and bindings, and one task:
//   {"kind": "import"}                      import the main module, list its classes
//   {"kind": "scenario", "module", "function", "args"}
//                                           await module.function(driver, **args)
// With "stubFetch": true, the global fetch answers requests to https://hooks.test
// (fetch_stub.mjs) and the report carries what it received as "fetches".
// It prints one JSON line: {"ok": true, "result": ...} or {"ok": false, "error": ...}.
//
// Lives here: loading Pyodide, the two modules the runtime provides to the
// SDK, copying files, running the task. Must not know: any Worker or scenario.
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { installVirtualClock } from "./clock.mjs";
import { installFetchStub } from "./fetch_stub.mjs";
import { WorkerHost } from "./objects.mjs";

const HERE = fileURLToPath(new URL(".", import.meta.url));

function copyTree(FS, from, to) {
  FS.mkdirTree(to);
  for (const name of readdirSync(from)) {
    if (name === "__pycache__" || name.endsWith(".pyc")) continue;
    const source = join(from, name);
    if (statSync(source).isDirectory()) copyTree(FS, source, `${to}/${name}`);
    else FS.writeFile(`${to}/${name}`, readFileSync(source));
  }
}

// The two modules workerd registers for the SDK before any Python runs.
function runtimeModules(getEnv) {
  const entrypointHelper = {
    doAnImport: async (name) => { throw new Error(`the Pyodide host cannot import ${name}`); },
    get cloudflareWorkersModule() { return { env: getEnv() }; },
    cloudflareSocketsModule: {},
    patchWaitUntil: () => {},
  };
  const compatFlags = {
    python_workflows_implicit_dependencies: false,
    python_request_headers_preserve_commas: false,
  };
  return { entrypointHelper, compatFlags };
}

async function main() {
  const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const logs = [];
  const log = (line) => logs.push(line);
  const { runUntil, nowMs } = installVirtualClock();
  // Before Pyodide loads: pyodide.http binds the global fetch when it is imported.
  const fetches = request.stubFetch ? installFetchStub() : undefined;
  const { loadPyodide } = await import("pyodide");
  const initSqlJs = (await import("sql.js")).default;
  const [pyodide, SQL] = await Promise.all([
    loadPyodide({ stdout: log, stderr: log }),
    initSqlJs(),
  ]);

  for (const { dir, mount } of request.trees) copyTree(pyodide.FS, dir, mount);
  copyTree(pyodide.FS, HERE, "/fidelity_host");
  let host = null;
  const { entrypointHelper, compatFlags } = runtimeModules(() => host?.env);
  pyodide.registerJsModule("_pyodide_entrypoint_helper", entrypointHelper);
  pyodide.registerJsModule("_cloudflare_compat_flags", compatFlags);
  const paths = [...request.paths, "/fidelity_host"];
  pyodide.runPython(`import sys\nsys.path[:0] = ${JSON.stringify(paths)}`);

  const glue = pyodide.pyimport("glue");
  const module = pyodide.pyimport(request.main);
  host = new WorkerHost({ SQL, glue, module, config: request.config, log });
  const task = request.task;
  let result;
  if (task.kind === "import") {
    result = glue.entrypoint_classes(module).toJs({ dict_converter: Object.fromEntries });
  } else if (task.kind === "scenario") {
    const driverModule = pyodide.pyimport("driver");
    const scenario = pyodide.pyimport(task.module)[task.function];
    const driver = driverModule.PyodideDriver(host, module, nowMs);
    const outcome = driverModule.run_scenario(scenario, driver, JSON.stringify(task.args ?? {}));
    const value = await runUntil(Promise.resolve(outcome));
    result = JSON.parse(driverModule.to_json(value));
  } else {
    throw new Error(`unknown task ${task.kind}`);
  }
  result = { ok: true, result, stats: host.stats, background_errors: host.errors, logs, fetches };
  process.stdout.write(JSON.stringify(result) + "\n");
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stdout.write(JSON.stringify({ ok: false, error: String(error?.stack ?? error) }) + "\n");
    process.exit(1);
  },
);
