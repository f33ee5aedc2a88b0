"""The holder's storage: its clients' rows, the lease tables, their schema versions and every query on them.

Lives here: SQL for grants, the line and leases (load them, write a
round's changes), the lease ids issued so far, and the schema's
migrations. Must not know: the protocol's rules or the clock.

A client's grants in one group and its place in the line there are one
row of a WITHOUT ROWID table keyed by (client, group), with no other
index (``ClientRow``): whatever a round or a report changes for a client
costs one row written, however many of its grants it touches, and the
line rides on the rows a round writes anyway (a grant takes the client's
oldest items off its line entry in the same row). A client that joins
the line when nothing can be granted to it costs a row then; one that
leaves it with its last grant costs nothing more. Version 5 moved the
grants of the older table (one row per grant) into these rows. Leases
are rows of their own, keyed by id: a new lease, a report that moves its
counts, a retirement and a settlement each write one row. The holder
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

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..._common.schema import Step, migrate
from ..._common.sql import Sql
from ..tree.pure.rules import Loan
from .pure.allocation import Changes, Grant
from .pure.leases import Lease, LeaseIds
from .pure.line import Waiting

COMPONENT = "semaphore"
GRANTS = "durability_semaphore_grants"
LEASES = "durability_semaphore_leases"
LEASE_IDS = "durability_semaphore_lease_ids"
LOANS = "durability_semaphore_loans"
CLIENTS = "durability_semaphore_clients"
TABLES = (GRANTS, LEASES, LEASE_IDS, LOANS, CLIENTS)
#: every grant the rows hold, one row each (for tests and operators reading storage)
GRANT_ROWS = (
    "SELECT json_extract(g.value, '$[0]') AS grant_id, c.client_id, c.grp, "
    "json_extract(g.value, '$[1]') AS permits, json_extract(g.value, '$[2]') AS claimed, "
    "json_extract(g.value, '$[3]') AS released, json_extract(g.value, '$[4]') AS claim_deadline, "
    f"json_extract(g.value, '$[5]') AS reclaimed FROM {CLIENTS} AS c, json_each(c.grants) AS g"
)


@dataclass(frozen=True)
class ClientRow:
    """One client's grants in one group, as written, and its place in the line there."""

    grants: tuple[Grant, ...] = ()
    waiting: Waiting | None = None
    name: str | None = None  #: the name of the client's object, if it gave one (to call it by)

    def __bool__(self) -> bool:
        return bool(self.grants) or self.waiting is not None


def _grants_json(grants: tuple[Grant, ...]) -> str:
    # A grant a start rate keeps has a seventh field (its kept_until) and, once
    # the holder knew when it was heard of, an eighth (placed_at); no other grant pays for them.
    return json.dumps([[g.grant_id, g.permits, g.claimed, g.released, g.claim_deadline, int(g.reclaimed)]
                       + ([g.kept_until] if g.kept_until else []) + ([g.placed_at] if g.placed_at else [])
                       for g in grants], separators=(",", ":"))


def _waiting_json(waiting: Waiting | None) -> str | None:
    if waiting is None:
        return None
    return json.dumps({"count": waiting.count, "times": list(waiting.times), "since": waiting.since,
                       "wait": waiting.wait_ms, "claims": waiting.claims, "leases": waiting.leases},
                      separators=(",", ":"))


def _client_row(row: dict[str, Any]) -> ClientRow:
    client_id, group = row["client_id"], row["grp"]
    grants = tuple(Grant(grant_id, client_id, group, permits, claimed, released, deadline, bool(reclaimed), *kept)
                   for grant_id, permits, claimed, released, deadline, reclaimed, *kept in json.loads(row["grants"]))
    waiting = None
    if row["waiting"] is not None:
        w = json.loads(row["waiting"])
        waiting = Waiting(client_id, group, w["count"], tuple(w["times"]), w["since"], w["wait"], w["claims"],
                          w["leases"])
    return ClientRow(grants, waiting, row["name"])


def _grants_into_client_rows(sql: Sql, _before: int) -> None:
    """Version 5: each (client, group)'s grant rows become its one row."""
    by_client: dict[tuple[str, str], list[Grant]] = {}
    for r in sql.exec(f"SELECT grant_id, client_id, grp, permits, claimed, released, claim_deadline, reclaimed "
                      f"FROM {GRANTS} ORDER BY grant_id"):
        grant = Grant(r["grant_id"], r["client_id"], r["grp"], r["permits"], r["claimed"], r["released"],
                      r["claim_deadline"], bool(r["reclaimed"]))
        by_client.setdefault((grant.client_id, grant.group), []).append(grant)
    for (client_id, group), grants in by_client.items():
        sql.exec(f"INSERT INTO {CLIENTS} (client_id, grp, grants, waiting) VALUES (?, ?, ?, NULL)",
                 client_id, group, _grants_json(tuple(grants)))
    sql.exec(f"DELETE FROM {GRANTS}")
NEVER = 2**53  #: an expiry that never comes (the latest time a reply may carry)
_SCHEMA: dict[int, list[Step]] = {
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
    5: [
        f"""
        CREATE TABLE IF NOT EXISTS {CLIENTS} (
          client_id TEXT NOT NULL,
          grp TEXT NOT NULL,
          grants TEXT NOT NULL,
          waiting TEXT,
          name TEXT,
          PRIMARY KEY (client_id, grp)
        ) WITHOUT ROWID
        """,
        _grants_into_client_rows,
    ],
}
_LEASE_COLUMNS = "lease_id, client_id, grp, permits, drawn, released, expires_at, retired, limit_at_issue"


class HolderStore:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        migrate(sql, COMPONENT, _SCHEMA)

    def load_clients(self) -> dict[tuple[str, str], ClientRow]:
        """Every client's row, by (client, group)."""
        rows = self.sql.exec(f"SELECT client_id, grp, grants, waiting, name FROM {CLIENTS} ORDER BY client_id, grp")
        return {(r["client_id"], r["grp"]): _client_row(r) for r in rows}

    def write_clients(self, rows: dict[tuple[str, str], ClientRow]) -> None:
        """Write these clients' rows (an empty one is deleted); call inside a transaction."""
        for (client_id, group), row in rows.items():
            if not row:
                self.sql.exec(f"DELETE FROM {CLIENTS} WHERE client_id = ? AND grp = ?", client_id, group)
                continue
            self.sql.exec(
                f"INSERT INTO {CLIENTS} (client_id, grp, grants, waiting, name) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (client_id, grp) DO UPDATE SET grants = excluded.grants, waiting = excluded.waiting, "
                "name = excluded.name",
                client_id, group, _grants_json(row.grants), _waiting_json(row.waiting), row.name,
            )

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

    def write_leases(self, changes: Changes) -> None:
        """Persist a round's lease decisions; call inside the round's transaction."""
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


class ClientRows:
    """What the clients' rows hold, kept beside the books: which rows a change rewrites, and with what.

    A row is written when a grant in it changes (as ``_rows_to_write``
    decides), or when its client's place in the line changes in a way a
    new instance must know: joining or leaving it, or its oldest item
    (how many items wait rides along with the next write of the row)."""

    def __init__(self, rows: dict[tuple[str, str], ClientRow]) -> None:
        self._rows = dict(rows)

    def grants(self) -> dict[str, Grant]:
        return {g.grant_id: g for row in self._rows.values() for g in row.grants}

    def waiting(self) -> list[Waiting]:
        return [row.waiting for row in self._rows.values() if row.waiting is not None]

    def waiting_rows(self) -> set[tuple[str, str]]:
        """The (client, group) rows whose client waits in line there."""
        return {key for key, row in self._rows.items() if row.waiting is not None}

    def names(self) -> dict[str, str]:
        """The names of the clients' objects, as their rows keep them."""
        return {client_id: row.name for (client_id, _), row in self._rows.items() if row.name is not None}

    def to_write(self, written: Iterable[Grant], deleted: Iterable[Grant], changed: Iterable[str],
                 line_of: Callable[[str], list[Waiting]] | None,
                 name_of: Callable[[str], str | None] = lambda _: None) -> dict[tuple[str, str], ClientRow]:
        """The rows to write for grants ``written`` and ``deleted`` (as rows hold
        them) and the clients whose line entry ``changed`` (``line_of``: a
        client's entry now, per group; None: this holder keeps no line, and
        rows keep what they hold); rows that would not change are left out.
        A row written carries its client's object's name (``name_of``)."""
        grants: dict[tuple[str, str], dict[str, Grant | None]] = {}
        for grant in written:
            grants.setdefault((grant.client_id, grant.group), {})[grant.grant_id] = grant
        for grant in deleted:
            grants.setdefault((grant.client_id, grant.group), {})[grant.grant_id] = None
        lines: dict[str, dict[str, Waiting]] = {}

        def line(client_id: str) -> dict[str, Waiting]:
            if client_id not in lines:
                lines[client_id] = {w.group: w for w in line_of(client_id)} if line_of is not None else {}
            return lines[client_id]

        moved: set[tuple[str, str]] = set()
        for client_id in changed if line_of is not None else ():
            for group in set(line(client_id)) | {g for (c, g) in self._rows if c == client_id}:
                if _moved(self._rows.get((client_id, group), ClientRow()).waiting, line(client_id).get(group)):
                    moved.add((client_id, group))
        rows = {}
        for key in sorted(set(grants) | moved):
            old = self._rows.get(key, ClientRow())
            kept = {g.grant_id: g for g in old.grants}
            for grant_id, change in grants.get(key, {}).items():
                if change is None:
                    kept.pop(grant_id, None)
                else:
                    kept[grant_id] = change
            waiting = line(key[0]).get(key[1]) if line_of is not None else old.waiting
            row = ClientRow(tuple(sorted(kept.values())), waiting, name_of(key[0]) or old.name)
            if row != old:
                rows[key] = row
        return rows

    def written(self, rows: dict[tuple[str, str], ClientRow]) -> None:
        """``rows`` are written now."""
        for key, row in rows.items():
            if row:
                self._rows[key] = row
            else:
                self._rows.pop(key, None)


def _moved(old: Waiting | None, new: Waiting | None) -> bool:
    """Has a line entry changed in a way a new instance must know (see ``ClientRows``)?"""
    if old is None or new is None:
        return old is not new
    return (old.times[0], old.since, old.wait_ms, old.claims, old.leases) != (
        new.times[0], new.since, new.wait_ms, new.claims, new.leases)


