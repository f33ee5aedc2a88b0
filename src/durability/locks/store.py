"""The holder object's storage: the table of places, its schema versions and every query on it.

Lives here: SQL for places (load them, insert a granted one, move its stored
lease end, delete it). Must not know: the line's rules, RPC or the clock.

Places are rows of a WITHOUT ROWID table keyed by token, with no other
index: a grant writes one row, a release or an expiry deletes one, and a
renewal that must move the stored lease end updates one. Waiters are not
stored: a waiter is a call in progress, and a call does not survive its
object's restart either (its client calls again).
"""

from __future__ import annotations

from .._common.schema import migrate
from .._common.sql import Sql
from .line import Place

COMPONENT = "locks"
PLACES = "durability_lock_places"
TABLES = (PLACES,)  #: what ``migrate(ctx, None)`` removes
_SCHEMA = {
    1: [
        f"""
        CREATE TABLE IF NOT EXISTS {PLACES} (
          token TEXT PRIMARY KEY,
          request_id TEXT NOT NULL,
          lim INTEGER NOT NULL,
          ttl_ms REAL NOT NULL,
          granted_at REAL NOT NULL,
          stored_until REAL NOT NULL,
          hold_until REAL
        ) WITHOUT ROWID
        """
    ]
}


class PlaceStore:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        migrate(sql, COMPONENT, _SCHEMA)

    def load(self) -> list[Place]:
        """Every stored place; a restarted holder trusts the stored (later) lease end."""
        rows = self.sql.exec(
            f"SELECT token, request_id, lim, ttl_ms, granted_at, stored_until, hold_until FROM {PLACES}"
        )
        return [Place(r["token"], r["request_id"], int(r["lim"]), float(r["ttl_ms"]), float(r["granted_at"]),
                      float(r["stored_until"]), None if r["hold_until"] is None else float(r["hold_until"]),
                      float(r["stored_until"]))
                for r in rows]

    def insert(self, place: Place) -> None:
        self.sql.exec(
            f"INSERT INTO {PLACES} (token, request_id, lim, ttl_ms, granted_at, stored_until, hold_until) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            place.token, place.request_id, place.limit, place.ttl_ms, place.granted_at,
            place.stored_until, place.hold_until,
        )

    def extend(self, place: Place) -> None:
        self.sql.exec(f"UPDATE {PLACES} SET stored_until = ? WHERE token = ?", place.stored_until, place.token)

    def delete(self, place: Place) -> None:
        self.sql.exec(f"DELETE FROM {PLACES} WHERE token = ?", place.token)
