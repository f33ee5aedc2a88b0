// How a call, a message or a request reaches Python in the Pyodide host: in
// an event of its own, as in workerd, never inside the Python step that made it.
//
// Pyodide runs a coroutine that JavaScript starts in the context of the
// Python step running then: a call to another object made within a step,
// delivered at once, would inherit the caller's contextvars (a flag one
// object sets while it runs its admit(), say, seen by the object it calls).
// Must not know: objects, queues, Python.

// Await this first: the caller's step ends before the callee's begins.
export const eventOfItsOwn = () => Promise.resolve();
