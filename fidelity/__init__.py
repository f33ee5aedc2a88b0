"""Proof that the Worker behaves on the real runtime as on the embedded one.

Lives here: the Pyodide host's launcher, the embedded driver, the
conformance probe and the scenarios the tiers share (see docs/fidelity.md).
Must not know: pytest; the tests in tests/ drive these modules.
"""
