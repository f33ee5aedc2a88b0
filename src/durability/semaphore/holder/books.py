"""The holder's books: grants, leases and lease ids in memory, and the rows that keep them.

Lives here: ``HolderBooks``: each book loaded once per instance, and
``commit``: a change's rows (the clients' rows, with the line they carry,
and the leases' rows) and the reclaim timer written in one transaction,
then memory updated; which changes need a row at all (a grant at its first
claim; a lease as ``leases.needs_row`` says; a tree's partial give-back of
a loan not at all), and the lease ids reserved in blocks. Must not know:
how a round decides, messages, or the line's rules (``ParkedLine`` says
which clients' entries changed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from ..._common.clock import now_ms
from ...scheduler.alarm import DurabilityScheduler
from ..tree.pure.rules import parent_of
from .pure.allocation import Changes, Grant, merged, merged_leases, next_reclaim_at
from .pure.leases import DEFAULT_TTL_MS, Lease, LeaseIds, LeasePolicy, needs_row
from .pure.line import ParkedLine, Waiting
from .pure.reclaim import forgotten_with_row
from .store import ClientRows, HolderStore

RECLAIM = "reclaim"
LEASE_ID_BLOCK = 64  #: lease ids reserved per write of the issued count


class HolderBooks:
    def __init__(self, store: HolderStore, scheduler: DurabilityScheduler, participant: str,
                 policy: LeasePolicy | None) -> None:
        self.store, self.scheduler, self._participant, self._policy = store, scheduler, participant, policy
        self._book: dict[str, Grant] | None = None
        self.rows = ClientRows({})  #: what the clients' rows hold (loaded with the book)
        self._lease_book: dict[str, Lease] | None = None
        self._ids: LeaseIds | None = None
        # Grants in the books that have no row yet: nothing was claimed on
        # them (see rows_to_write).
        self._unwritten: set[str] = set()
        self._lease_rows: dict[str, Lease] = {}  #: each lease as its row holds it (see leases.needs_row)
        self._ids_reserved = 0  #: lease ids reserved in the row (set when the ids are loaded)
        #: grants and leases this instance made that no reply or call has
        #: named yet (see ``first_listing``); memory only
        self._unlisted: set[str] = set()

    def grants(self) -> dict[str, Grant]:
        if self._book is None:
            self.rows = ClientRows(self.store.load_clients())
            self._book = self.rows.grants()
        return self._book

    def leases(self) -> dict[str, Lease]:
        if self._lease_book is None:
            self._lease_book = self.store.load_leases()
            self._lease_rows = dict(self._lease_book)
        return self._lease_book

    def lease_ids(self) -> LeaseIds:
        if self._ids is None:
            # The row keeps how far ids are reserved (see _reserve_lease_ids):
            # a new instance takes every id up to there as issued, and
            # numbers its own after them.
            self._ids = self.scheduler.transaction(lambda: self.store.lease_ids(now_ms(), ttl_of(self._policy)))
            self._ids_reserved = self._ids.issued
        return self._ids

    def known_ids(self) -> LeaseIds | None:
        """The lease ids, if this instance has read them (a reclaim needs them only then)."""
        return self._ids

    def schedule_reclaim(self, due: float | None) -> None:
        if due is None:
            self.scheduler.cancel(self._participant, RECLAIM)
        else:
            self.scheduler.schedule(self._participant, RECLAIM, due)

    def commit(self, changes: Changes, line: ParkedLine | None, parent_key: str | None,
               name_of: Callable[[str], str | None] = lambda _: None) -> None:
        """Persist changes, the line entries that changed with them (``line``)
        and the reclaim timer together, then update memory. ``parent_key``:
        this holder's key when it lends to a tree's children."""
        self._forget_kept_with_rows(changes)
        waiting = line.rows() if line is not None else self.rows.waiting_rows()
        due = next_reclaim_at(merged(self.grants(), changes), merged_leases(self.leases(), changes), self._ids,
                              waiting)
        to_write, unwritten = self.rows_to_write(changes, parent_key)
        to_write.issued = self._reserve_lease_ids(changes.issued)
        changed = line.take_changed() if line is not None else set()
        rows = self.rows.to_write(to_write.written.values(), [self.grants()[g] for g in to_write.deleted],
                                  changed, _kept_line(line), name_of)

        def write() -> None:
            self.store.write_clients(rows)
            self.store.write_leases(to_write)
            self.schedule_reclaim(due)

        try:
            if rows or to_write.leases_written or to_write.leases_deleted or to_write.issued is not None:
                self.scheduler.transaction(write)
            else:  # a round that hands out nothing writes no row: no transaction
                self.schedule_reclaim(due)  # a timer in memory
        except BaseException:
            if line is not None:
                line.changed_again(changed)
            raise
        self.rows.written(rows)
        self._unwritten = unwritten
        self._lease_rows.update(to_write.leases_written)
        for lease_id in to_write.leases_deleted:
            self._lease_rows.pop(lease_id, None)
        if to_write.issued is not None:
            self._ids_reserved = to_write.issued
        self._unlisted |= {grant_id for grant_id in changes.written if grant_id not in self.grants()}
        self._unlisted |= {lease_id for lease_id in changes.leases_written if lease_id not in self.leases()}
        self._unlisted -= set(changes.deleted) | set(changes.leases_deleted)
        changes.apply_to(self.grants(), self.leases())
        if changes.issued is not None:
            self._ids = replace(self.lease_ids(), issued=changes.issued)

    def _forget_kept_with_rows(self, changes: Changes) -> None:
        """Grants a start rate kept past its window leave with the rows this
        change writes anyway (``reclaim.kept_for_rate``)."""
        book = self.grants()
        rows = {(g.client_id, g.group) for g in changes.written.values()}
        rows |= {(book[i].client_id, book[i].group) for i in changes.deleted if i in book}
        for grant_id in forgotten_with_row(book.values(), rows, now_ms()):
            if grant_id not in changes.written:
                changes.delete(grant_id)

    def first_listing(self, ids: Iterable[str]) -> set[str]:
        """Of the grants and leases a reply or call about to leave names, those
        it names first: it says they are new, and no later one will.

        A client that hears of a grant it knows nothing of cannot tell one
        a round just made for it (claimed for its request: it admits on the
        claims) from one an earlier instance of it used and released, and
        forgot with its items' rows, its report maybe still on the way
        (admitting again would run beyond the limit). Only the first
        listing of what this instance made says new; a new instance of the
        holder says new of nothing, and a client gives back what it cannot
        place (``queue/pure/core.usable_claims``). Memory only: no row."""
        first = self._unlisted.intersection(ids)
        self._unlisted -= first
        return first

    def rows_to_write(self, changes: Changes, parent_key: str | None) -> tuple[Changes, set[str]]:
        """The changes as rows: a grant is written at its first claim, not when
        it is made.

        A grant nothing was claimed on lives only in the books in memory.
        Losing it with the instance is safe: its client admits nothing
        before the holder confirms a claim, and a claim on a grant the
        holder does not know is answered ``not_found``, so its items wait
        for the next grant while its permits go back to the pool at once.
        It saves a row per grant (the insert, then the update of the first
        claim, become one write), and a grant reclaimed or settled with
        nothing claimed is forgotten without a row at all. A lease's counts
        and heartbeats are written only as ``leases.needs_row`` says, and a
        child's partial give-back of a loan as ``release_needs_row`` says.
        """
        unwritten = set(self._unwritten)
        rows = replace(changes, written=dict(changes.written), deleted=dict(changes.deleted))
        for grant_id, grant in changes.written.items():
            new = grant_id not in self.grants() or grant_id in unwritten
            if new and grant.claimed == 0:
                unwritten.add(grant_id)
                del rows.written[grant_id]
            elif not new and not release_needs_row(self.grants()[grant_id], grant, parent_key):
                del rows.written[grant_id]
            else:
                unwritten.discard(grant_id)
        for grant_id in changes.deleted:
            if grant_id in unwritten:
                unwritten.discard(grant_id)
                del rows.deleted[grant_id]
        self.leases()  # loads the leases' rows with the book
        rows.leases_written = {lease_id: lease for lease_id, lease in changes.leases_written.items()
                               if needs_row(self._lease_rows.get(lease_id), lease, ttl_of(self._policy))}
        return rows, unwritten

    def _reserve_lease_ids(self, issued: int | None) -> int | None:
        """The lease-id count to write for a round that issued up to ``issued``:
        none while the ids stay within the block already reserved, else the
        end of a new block of ``LEASE_ID_BLOCK``.

        Reserving ids in blocks writes the row once per block instead of in
        every round that issues a lease (about a row per job with leases).
        The ids of a block left unused when the instance goes are never
        issued: the next instance starts after the block, and takes the
        whole block as issued, so a report naming one of them is answered
        as for a lease it settled, never mistaken for one it issues later.
        """
        if issued is None or issued <= self._ids_reserved:
            return None
        return issued + LEASE_ID_BLOCK


def release_needs_row(before: Grant, after: Grant, parent_key: str | None) -> bool:
    """False for a loan to a child of this holder whose only change is
    permits given back, some still held: its row keeps the older count. A
    child reports every loan's cumulative counts in each request and sync
    (``tree.Borrowed.reports``), at least every half of ``fresh_for_ms``
    while it holds any, and a new instance of the parent wakes the quiet
    ones at once (``tree/link.Waker``), so one that read the older count
    counts those permits as lent (the safe side) only until the child's
    next exchange. The loan's last give-back deletes the row as ever. It
    saves a row per give-back at a tree's parents (a child gives back
    about once a period while lines differ: 2% of the rows per admission
    at ``bench_tree.py``'s 10,000 clients)."""
    same = (before.permits, before.claimed, before.reclaimed) == (after.permits, after.claimed, after.reclaimed)
    child = parent_key is not None and parent_of(after.client_id) == parent_key
    return not (same and after.released > before.released and child)


def ttl_of(policy: LeasePolicy | None) -> float:
    return policy.ttl_ms if policy is not None else DEFAULT_TTL_MS


def _kept_line(line: ParkedLine | None) -> Callable[[str], list[Waiting]] | None:
    """The line entries rows keep: not a tree's children's. A child waiting
    asks again each beat (a round period), so a new instance hears its
    demand within one; a row per child per beat would cost more than the
    period it saves (a row written per child's request)."""
    if line is None:
        return None
    return lambda client_id: [] if parent_of(client_id) is not None else line.waiting(client_id)
