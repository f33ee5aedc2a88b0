"""The queue's rules, as pure functions: no I/O, no clock, no storage.

Lives here: its vocabulary (``states``: item states and their one table
of moves, timer kinds, the records), its decisions about grants, pacing,
the line and retries (``core``), and its lease rules (``lease_rules``, the
client-side twin of the holder's ``leases``).
"""
