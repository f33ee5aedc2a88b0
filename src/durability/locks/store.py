"""The holder object's storage: the table of places, its schema versions and every query on it.

Lives here: SQL for places (load them, insert a granted one, move its stored
lease end, delete it). Must not know: the line's rules, RPC or the clock.

Places are rows of a WITHOUT ROWID table keyed by token, with no other
index: a grant writes one row, a release or an expiry deletes one, and a
renewal that must move the stored lease end updates one. Under a start
rate a place gone stays, marked gone, while it counts in its window (the
release writes one row all the same), and a place granted later takes
over a gone row out of every window (one row written, as an insert): in
a steady flow at the rate, no row more per hold. Waiters are not
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
    ],
    # A place granted under a start rate: by when its work starts, its rate's
    # period, and whether it is gone (released or expired: kept while it
    # counts in the window, then its row holds the next place granted).
    2: [
        f"ALTER TABLE {PLACES} ADD COLUMN start_by REAL",
        f"ALTER TABLE {PLACES} ADD COLUMN period_ms REAL NOT NULL DEFAULT 0",
        f"ALTER TABLE {PLACES} ADD COLUMN gone INTEGER NOT NULL DEFAULT 0",
    ],
}


class PlaceStore:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        migrate(sql, COMPONENT, _SCHEMA)

    def load(self) -> tuple[list[Place], list[Place]]:
        """Every stored place, held and gone; a restarted holder trusts the stored (later) lease end."""
        rows = self.sql.exec(
            f"SELECT token, request_id, lim, ttl_ms, granted_at, stored_until, hold_until, start_by, period_ms, gone "
            f"FROM {PLACES}"
        )
        held: list[Place] = []
        gone: list[Place] = []
        for r in rows:
            place = Place(r["token"], r["request_id"], int(r["lim"]), float(r["ttl_ms"]), float(r["granted_at"]),
                          float(r["stored_until"]), None if r["hold_until"] is None else float(r["hold_until"]),
                          float(r["stored_until"]), None if r["start_by"] is None else float(r["start_by"]),
                          float(r["period_ms"]))
            (gone if r["gone"] else held).append(place)
        return held, gone

    def insert(self, place: Place, over: Place | None = None) -> None:
        """A granted place: a row of its own, or ``over`` a gone one out of its window (one row written)."""
        values = (place.token, place.request_id, place.limit, place.ttl_ms, place.granted_at,
                  place.stored_until, place.hold_until, place.start_by, place.period_ms)
        if over is not None:
            self.sql.exec(
                f"UPDATE {PLACES} SET token = ?, request_id = ?, lim = ?, ttl_ms = ?, granted_at = ?, "
                "stored_until = ?, hold_until = ?, start_by = ?, period_ms = ?, gone = 0 WHERE token = ?",
                *values, over.token,
            )
            return
        self.sql.exec(
            f"INSERT INTO {PLACES} (token, request_id, lim, ttl_ms, granted_at, stored_until, hold_until, "
            "start_by, period_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            *values,
        )

    def extend(self, place: Place) -> None:
        self.sql.exec(f"UPDATE {PLACES} SET stored_until = ? WHERE token = ?", place.stored_until, place.token)

    def delete(self, place: Place) -> None:
        """A place gone: its row deleted, or, under a start rate, kept as gone (one row written either way)."""
        if place.start_by is None:
            self.sql.exec(f"DELETE FROM {PLACES} WHERE token = ?", place.token)
        else:
            self.sql.exec(f"UPDATE {PLACES} SET gone = 1 WHERE token = ?", place.token)
