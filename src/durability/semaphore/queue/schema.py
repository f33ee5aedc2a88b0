"""The queue's schema: its tables, and what each version of it added.

Lives here: the names of the queue's tables (``TABLES``, which
``migrate(ctx, None)`` removes) and ``_SCHEMA``, each version's steps,
which ``QueueStore`` runs at construction up to the newest
(``_common/schema.migrate``), among them the one that reads rows (version 6's),
with the check it shares with the store (``_holds_anything``). Must not
know: the queries on the tables (``queue/store``), the protocol with the
holder, timers, or when anything happens.

Version 2 added the lease table; version 3 the pacing table: per key, the
interval the holder asks between requests, written only when that
interval changes (about once per key), so that a new instance paces its
first request as the holder asked; version 4 the items' ``done_at``;
version 8 the record a released item keeps; version 9 stopped making the
tables only older versions wrote to (grants, leases, the identity they spoke
as) in a queue made new, nor opening the old outbox: nine rows a new
object writes no more (workerd bills a ``CREATE TABLE`` two rows; the
outbox's version row is the ninth). A queue made before keeps them, and a
row of its own in the version table says so (``LEGACY``), read once per
start. A later version that changes one of those tables must do it
through ``OlderTable`` too: a queue made new has none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..._common.schema import Step
from ..._common.sql import Sql

COMPONENT = "semaphore-queue"
ITEMS = "durability_queue_items"
GRANTS = "durability_queue_grants"
LEASES = "durability_queue_leases"
PACING = "durability_queue_pacing"
SPOKEN = "durability_queue_spoken_as_given"
LABEL = "durability_queue_label"
TABLES = (ITEMS, GRANTS, LEASES, PACING, SPOKEN, LABEL)
#: the version table's row that marks a queue made before version 9: it has
#: the tables those versions wrote to, and may hold rows in them
LEGACY = f"{COMPONENT}.legacy"
_HELD_TABLES = (ITEMS, PACING, GRANTS, LEASES)


def _holds_anything(sql: Sql) -> bool:
    """A row in any table that stands for something a holder may charge to the queue."""
    return any(sql.one(f"SELECT 1 AS held FROM {table} LIMIT 1") for table in _HELD_TABLES)


@dataclass(frozen=True)
class OlderTable:
    """A table only a queue made before version 9 has: made new since, a
    queue writes nothing there, so it is not made (``statement`` makes it)."""

    statement: str

    def __call__(self, sql: Sql, before: int) -> None:
        if before > 0:
            sql.exec(self.statement)


def _made_before_9(sql: Sql, before: int) -> None:
    """Version 9: a queue upgraded to it says it has the older tables (``LEGACY``)."""
    if before > 0:
        sql.exec("INSERT INTO durability_schema (component, version) VALUES (?, ?) "
                 "ON CONFLICT (component) DO NOTHING", LEGACY, before)


def _spoken_since(sql: Sql, before: int) -> None:
    """Version 6, for a queue of an older version that holds anything: it spoke as given (a new one holds nothing)."""
    if before > 0 and _holds_anything(sql):
        sql.exec(f"INSERT INTO {SPOKEN} (since) VALUES (?)", before)


_SCHEMA: dict[int, list[Step]] = {
    1: [
        f"""
        CREATE TABLE IF NOT EXISTS {ITEMS} (
          id TEXT PRIMARY KEY,
          key TEXT NOT NULL,
          grp TEXT NOT NULL,
          body TEXT NOT NULL,
          seq INTEGER NOT NULL,
          enqueued_at REAL NOT NULL,
          state TEXT NOT NULL,
          grant_id TEXT,
          via TEXT,
          admitted_at REAL  -- when the item was admitted (when admit() returned, before version 3)
        ) WITHOUT ROWID
        """,
        OlderTable(f"""
        CREATE TABLE IF NOT EXISTS {GRANTS} (
          grant_id TEXT PRIMARY KEY,
          key TEXT NOT NULL,
          grp TEXT NOT NULL,
          permits INTEGER NOT NULL,
          claimed INTEGER NOT NULL,
          confirmed INTEGER NOT NULL,
          released INTEGER NOT NULL,
          claim_deadline REAL NOT NULL
        ) WITHOUT ROWID
        """),
    ],
    2: [
        OlderTable(f"""
        CREATE TABLE IF NOT EXISTS {LEASES} (
          lease_id TEXT PRIMARY KEY,
          key TEXT NOT NULL,
          grp TEXT NOT NULL,
          permits INTEGER NOT NULL,
          drawn INTEGER NOT NULL,
          released INTEGER NOT NULL,
          stopped INTEGER NOT NULL,
          ttl_ms REAL NOT NULL,
          renew_at REAL NOT NULL,
          settled_at REAL
        ) WITHOUT ROWID
        """),
    ],
    3: [
        f"""
        CREATE TABLE IF NOT EXISTS {PACING} (
          key TEXT PRIMARY KEY,
          interval_ms REAL NOT NULL
        ) WITHOUT ROWID
        """,
    ],
    4: [f"ALTER TABLE {ITEMS} ADD COLUMN done_at REAL"],  # when released or cancelled (see QueueStore.purge_done)
    # A draw's number in its lease (1, 2, ...), written with the draw itself:
    # no row more (see lease_book).
    5: [f"ALTER TABLE {ITEMS} ADD COLUMN draw INTEGER"],
    # Before version 6 a queue spoke to its holders as the client_id it was
    # given; since, as its object's id (semaphore/identity). A queue that holds
    # anything from before keeps speaking as given until it holds nothing
    # (see QueueStore.spoken_as_given): its holders charge what it holds to that id.
    6: [OlderTable(f"CREATE TABLE IF NOT EXISTS {SPOKEN} (since INTEGER PRIMARY KEY)"), _spoken_since],
    # The label a queue was given, for an instance given none: an object
    # reached through its id alone (a holder calling back a client it knows
    # by id) may not know the name its label was made from (see QueueStore.label).
    7: [f"CREATE TABLE IF NOT EXISTS {LABEL} (label TEXT NOT NULL)"],
    # What a released item keeps of its work (``release_keeping``): the
    # record is written by the release's own update, no row more.
    8: [f"ALTER TABLE {ITEMS} ADD COLUMN record TEXT"],
    # A queue made new has no grant, lease or spoken-as table (``OlderTable``):
    # one made before says it has them.
    9: [_made_before_9],
}
