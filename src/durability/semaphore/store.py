"""The holder's storage: the grant and lease tables, their schema versions and every query on them.

Lives here: SQL for grants and leases (load the books, write a round's
changes), the lease ids issued so far, and the schema's migrations.
Must not know: the protocol's rules or the clock.

Grants and leases are rows of WITHOUT ROWID tables keyed by id, with no
other index: a new grant or lease, a report that moves its counts, a
reclaim, a retirement and a settlement each write one row. The holder
writes a grant at its first claim, not when a round makes it (see
``DurabilitySemaphore._rows_to_write``). The lease ids issued so far are
one row, holding how far ids are reserved: it is written once per block of
ids (``LEASE_ID_BLOCK``), not by every round that issues a lease. The
holder keeps the books in memory and reads the tables once per instance.

Version 2 added the lease tables; a version 1 holder migrates in place and
keeps its grants. Version 3 added the loans table: in a budget tree, what a
child gave back of a loan from its parent (``tree.Loan``), written just
before each report that gives permits of the loan back leaves and deleted
once the parent settles it: two rows for a loan given back whole in one
report, none for one its parent never hears anything of. Version 4
added when the lease ids' epoch began (``LeaseIds.started_at``), written
with the epoch; a table older than that counts its epoch as begun long ago,
and keeps a lease of another epoch it charges until that lease's next report.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from .._schema import migrate
from .._sql import Sql
from .allocation import Changes, Grant
from .leases import Lease, LeaseIds
from .tree import Loan

COMPONENT = "semaphore"
GRANTS = "durability_semaphore_grants"
LEASES = "durability_semaphore_leases"
LEASE_IDS = "durability_semaphore_lease_ids"
LOANS = "durability_semaphore_loans"
TABLES = (GRANTS, LEASES, LEASE_IDS, LOANS)
NEVER = 2**53  #: an expiry that never comes (the latest time a reply may carry)
_SCHEMA = {
    1: [
        f"""
        CREATE TABLE IF NOT EXISTS {GRANTS} (
          grant_id TEXT PRIMARY KEY,
          client_id TEXT NOT NULL,
          grp TEXT NOT NULL,
          permits INTEGER NOT NULL,
          claimed INTEGER NOT NULL,
          released INTEGER NOT NULL,
          claim_deadline REAL NOT NULL,
          reclaimed INTEGER NOT NULL
        ) WITHOUT ROWID
        """
    ],
    2: [
        f"""
        CREATE TABLE IF NOT EXISTS {LEASES} (
          lease_id TEXT PRIMARY KEY,
          client_id TEXT NOT NULL,
          grp TEXT NOT NULL,
          permits INTEGER NOT NULL,
          drawn INTEGER NOT NULL,
          released INTEGER NOT NULL,
          expires_at REAL NOT NULL,
          retired INTEGER NOT NULL,
          limit_at_issue INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
        f"""
        CREATE TABLE IF NOT EXISTS {LEASE_IDS} (
          epoch TEXT PRIMARY KEY,
          issued INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
    ],
    3: [
        f"""
        CREATE TABLE IF NOT EXISTS {LOANS} (
          grant_id TEXT PRIMARY KEY,
          grp TEXT NOT NULL,
          permits INTEGER NOT NULL,
          released INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
    ],
    4: [
        f"ALTER TABLE {LEASE_IDS} ADD COLUMN started_at REAL NOT NULL DEFAULT 0",
        # A lease of another epoch still charged (issued under no limit, 0)
        # was never heartbeated: it stays charged until its next report,
        # which starts its bound. (A retired lease of its own uses its expiry
        # no more.)
        f"UPDATE {LEASES} SET expires_at = {NEVER} WHERE retired = 1 AND released < permits AND limit_at_issue = 0",
    ],
}
_LEASE_COLUMNS = "lease_id, client_id, grp, permits, drawn, released, expires_at, retired, limit_at_issue"


class HolderStore:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        migrate(sql, COMPONENT, _SCHEMA)

    def load(self) -> dict[str, Grant]:
        rows = self.sql.exec(
            f"SELECT grant_id, client_id, grp, permits, claimed, released, claim_deadline, reclaimed "
            f"FROM {GRANTS} ORDER BY grant_id"
        )
        return {
            r["grant_id"]: Grant(r["grant_id"], r["client_id"], r["grp"], r["permits"], r["claimed"],
                                 r["released"], r["claim_deadline"], bool(r["reclaimed"]))
            for r in rows
        }

    def load_leases(self) -> dict[str, Lease]:
        rows = self.sql.exec(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} ORDER BY lease_id")
        return {
            r["lease_id"]: Lease(r["lease_id"], r["client_id"], r["grp"], r["permits"], r["drawn"],
                                 r["released"], r["expires_at"], bool(r["retired"]), r["limit_at_issue"])
            for r in rows
        }

    def load_loans(self) -> dict[str, Loan]:
        rows = self.sql.exec(f"SELECT grant_id, grp, permits, released FROM {LOANS} ORDER BY grant_id")
        return {r["grant_id"]: Loan(r["grant_id"], r["grp"], r["permits"], r["released"], 0) for r in rows}

    def write_loans(self, written: Iterable[Loan], deleted: Iterable[str]) -> None:
        for loan in written:
            self.sql.exec(
                f"INSERT INTO {LOANS} (grant_id, grp, permits, released) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (grant_id) DO UPDATE SET released = excluded.released",
                loan.grant_id, loan.group, loan.permits, loan.released,
            )
        for grant_id in deleted:
            self.sql.exec(f"DELETE FROM {LOANS} WHERE grant_id = ?", grant_id)

    def lease_ids(self, now: float, ttl_ms: float) -> LeaseIds:
        """The ids issued so far, with the holder's lease ``ttl_ms``; the first
        call on a new table picks its epoch, begun ``now``."""
        row = self.sql.one(f"SELECT epoch, issued, started_at FROM {LEASE_IDS}")
        if row is not None:
            return LeaseIds(row["epoch"], row["issued"], row["started_at"], ttl_ms)
        # Drawn from `random` so that seeded test runs replay.
        epoch = f"{random.getrandbits(48):012x}"
        self.sql.exec(f"INSERT INTO {LEASE_IDS} (epoch, issued, started_at) VALUES (?, 0, ?)", epoch, now)
        return LeaseIds(epoch, 0, now, ttl_ms)

    def write(self, changes: Changes) -> None:
        """Persist a round's decisions; call inside the round's transaction."""
        for grant in changes.written.values():
            self.sql.exec(
                f"INSERT INTO {GRANTS} (grant_id, client_id, grp, permits, claimed, released, "
                "claim_deadline, reclaimed) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (grant_id) DO UPDATE SET permits = excluded.permits, "
                "claimed = excluded.claimed, released = excluded.released, "
                "reclaimed = excluded.reclaimed",
                grant.grant_id, grant.client_id, grant.group, grant.permits, grant.claimed,
                grant.released, grant.claim_deadline, int(grant.reclaimed),
            )
        for grant_id in changes.deleted:
            self.sql.exec(f"DELETE FROM {GRANTS} WHERE grant_id = ?", grant_id)
        for lease in changes.leases_written.values():
            self.sql.exec(
                f"INSERT INTO {LEASES} ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (lease_id) DO UPDATE SET permits = excluded.permits, drawn = excluded.drawn, "
                "released = excluded.released, expires_at = excluded.expires_at, retired = excluded.retired",
                lease.lease_id, lease.client_id, lease.group, lease.permits, lease.drawn, lease.released,
                lease.expires_at, int(lease.retired), lease.limit_at_issue,
            )
        for lease_id in changes.leases_deleted:
            self.sql.exec(f"DELETE FROM {LEASES} WHERE lease_id = ?", lease_id)
        if changes.issued is not None:
            self.sql.exec(f"UPDATE {LEASE_IDS} SET issued = ?", changes.issued)
