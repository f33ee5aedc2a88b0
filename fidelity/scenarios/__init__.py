"""Scenarios of the example Worker that run unchanged on every tier.

Lives here: nothing but the package; each module holds one scenario that
talks to the Worker only through a driver. Must not know: which tier runs it.
"""
