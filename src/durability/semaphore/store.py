"""The holder's storage: the grant table, its schema versions and every query on it.

Lives here: SQL for grants (load the book, write a round's changes) and the
schema's migrations. Must not know: the protocol's rules or the clock.

Grants are rows of a WITHOUT ROWID table keyed by grant id, with no other
index: a new grant, a report that moves its counts, a reclaim and a
settlement each write one row. The holder keeps the book in memory and
reads the table once per instance.
"""

from __future__ import annotations

from .._schema import drop, migrate
from .._sql import Sql
from .allocation import Changes, Grant

COMPONENT = "semaphore"
GRANTS = "durability_semaphore_grants"
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
    ]
}


class HolderStore:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        migrate(sql, COMPONENT, _SCHEMA)

    @staticmethod
    def drop(sql: Sql) -> None:
        drop(sql, COMPONENT, [GRANTS])

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
