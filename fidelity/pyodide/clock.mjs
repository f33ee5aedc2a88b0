// Virtual time for the Pyodide host: timers, Date and performance jump
// instead of waiting, so an hour of alarms and sleeps runs in seconds.
//
// Lives here: the fake clock and the loop that drives it (run queued
// immediates until none is left, then jump to the next timer).
// Must not know: Pyodide, objects, SQL.
import FakeTimers from "@sinonjs/fake-timers";

const EPOCH_MS = Date.UTC(2026, 0, 1);

export function installVirtualClock() {
  // Pyodide's event loop schedules ready callbacks with setImmediate (real,
  // so they run at once); counting the outstanding ones tells when the
  // process is idle and virtual time may jump.
  const realSetImmediate = globalThis.setImmediate;
  let pending = 0;
  globalThis.setImmediate = (fn, ...args) => {
    pending += 1;
    return realSetImmediate(() => {
      pending -= 1;
      fn(...args);
    });
  };
  const clock = FakeTimers.install({
    now: EPOCH_MS,
    toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval", "Date", "performance"],
  });
  const turn = () => new Promise((resolve) => realSetImmediate(resolve));

  // Run until `promise` settles; throws when nothing is left to run but it has not.
  async function runUntil(promise, { maxVirtualMs = 24 * 3_600_000 } = {}) {
    let settled = false;
    let outcome;
    promise.then(
      (value) => { settled = true; outcome = { value }; },
      (error) => { settled = true; outcome = { error }; },
    );
    const deadline = clock.now + maxVirtualMs;
    let turns = 0;
    while (!settled) {
      if (process.env.FIDELITY_TRACE && ++turns % 2000 === 0) {
        process.stderr.write(`virtual ${(clock.now - EPOCH_MS) / 1000} s, ${turns} turns, ${pending} pending, ${clock.countTimers()} timers\n`);
      }
      await turn();
      if (pending > 0 || settled) continue;
      await turn(); // a last microtask may have queued more
      if (pending > 0 || settled) continue;
      if (clock.countTimers() === 0) {
        throw new Error("deadlock: the task is waiting, and no timer or callback is left to run");
      }
      clock.next();
      if (clock.now > deadline) throw new Error(`gave up after ${maxVirtualMs} virtual ms`);
    }
    if (outcome.error) throw outcome.error;
    return outcome.value;
  }

  return { clock, runUntil, nowMs: () => clock.now };
}
