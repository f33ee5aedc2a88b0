"""The leases a queue holds: their terms in memory, their counts from its items.

Lives here: ``LeaseBook``, the queue's view of each lease it knows
(``LocalLease``): the terms a holder's reply gave (permits, ttl), whether
this queue stopped drawing from it and when to report it again, kept in
memory, joined with the counts of the items drawn and released on it, read
from the rows. Must not know: the protocol, timers, or when anything happens.

No row is written for a lease. Its counts follow from one rule: a drawn
item is admitted until its release, then kept released or, with
``keep_done_ms`` 0 (when its key's holder lists every lease), deleted. So
every draw not running here was released: the released count is the drawn
count less the items running. Draws are numbered in order in their items'
rows (written with the draw, no row more), so the drawn count is the
highest known of: this instance's terms, the items kept, the highest draw
number among them, and the draws the holder says it heard of (no more than
were made). What a crash loses is recovered without a lease row:

- the items drawn on a lease and not yet deleted name it, so a new
  instance knows every lease it drew from and is still using, with its
  counts as above. It takes such a lease as stopped, its permits what it
  drew, and reports it at once: the holder takes its undrawn permits back
  and settles it once every draw is released. The holder's answer says
  how many draws it heard of: if more than counted here, the rest are
  draws whose items went at their release, and the queue counts them so.
  A draw the holder never heard of, released and deleted, is footprint
  neither side counts any more;
- a lease with no item left: its key has a row (the queue registers the
  key of every lease it learns), so a new instance asks the holder about
  the key at once, and the holder lists the lease in its reply with the
  draws it heard of; the queue takes it as stopped, every draw released,
  and it settles with the report. Only a lease issued for this instance's
  own request is drawn from: any other may have been drawn from by an
  older instance whose numbers are gone;
- when to report a lease again: a new instance reports every lease it
  knows at once. (A lease settled here whose items are still kept is so
  rebuilt and reported once more: the holder answers it settled.)

The terms kept here are memory, changed inside the queue's transactions:
the queue takes a ``snapshot`` before each commit and ``restore``s it if
the commit fails, so memory never holds what storage does not.

Before, a lease had a row (written when learned, deleted once settled: two
rows per lease, about two per admitted job under contention). Rows older
versions wrote are read once; a settled one is deleted then, a live one
once its lease is settled.
"""

from __future__ import annotations

from dataclasses import replace

from .pure.states import ADMITTED, RELEASED, Counts, LocalLease
from .store import QueueStore

#: The ttl taken for a lease known only from its items (its terms were lost
#: with an instance): it only spaces the reports of a stopped lease.
RECOVERED_TTL_MS = 60_000.0


class LeaseBook:
    def __init__(self, store: QueueStore, remember_ms: float, now: float) -> None:
        """``remember_ms``: how long a lease settled here stays known as settled,
        so that a reply sent before it was settled cannot revive it (a reply
        never arrives later than a request's time limit)."""
        self._store = store
        self._remember_ms = remember_ms
        self._terms: dict[str, LocalLease] = {}
        self._settled: dict[str, float] = {}  #: lease id -> when it was settled here
        self._rows: set[str] = set()  #: leases with a row an older version wrote
        for lease in store.legacy_leases():
            if lease.settled_at is not None:
                store.drop_lease(lease.lease_id)
                self._settled[lease.lease_id] = now
            else:
                self._terms[lease.lease_id] = lease
                self._rows.add(lease.lease_id)

    def leases(self, key: str | None = None) -> list[LocalLease]:
        """The leases held here, not settled (of one key, or all), by lease id."""
        counts = self._store.lease_counts(key)
        ids = {i for i in counts if i not in self._settled}
        ids |= {i for i, t in self._terms.items() if key is None or t.key == key}
        return [self._joined(i, counts.get(i)) for i in sorted(ids)]

    def lease(self, lease_id: str) -> LocalLease | None:
        if lease_id in self._settled:
            return None
        counts = self._store.lease_counts(lease_id=lease_id).get(lease_id)
        if lease_id not in self._terms and counts is None:
            return None
        return self._joined(lease_id, counts)

    def snapshot(self) -> tuple[dict[str, LocalLease], dict[str, float], set[str]]:
        """What this book keeps in memory, for ``restore`` to put back (a commit that failed)."""
        return dict(self._terms), dict(self._settled), set(self._rows)

    def restore(self, snapshot: tuple[dict[str, LocalLease], dict[str, float], set[str]]) -> None:
        terms, settled, rows = snapshot
        self._terms, self._settled, self._rows = dict(terms), dict(settled), set(rows)

    def keep(self, lease: LocalLease) -> None:
        """Keep a lease's terms (its drawn and released counts are its items')."""
        self._terms[lease.lease_id] = lease
        self._settled.pop(lease.lease_id, None)

    def forget(self, lease_id: str, now: float) -> None:
        """The holder settled the lease, every draw released."""
        self._terms.pop(lease_id, None)
        if lease_id in self._rows:
            self._rows.discard(lease_id)
            self._store.drop_lease(lease_id)
        self._settled[lease_id] = now

    def settled(self, lease_id: str) -> bool:
        """Settled here: a listing of it is a reply older than its settlement."""
        return lease_id in self._settled

    def prune(self, now: float) -> None:
        """Stop remembering leases settled long enough ago (no reply sent before
        can still arrive) whose items are all deleted (a new instance would
        not know them either)."""
        old = [i for i, at in self._settled.items() if at + self._remember_ms < now]
        if old:
            with_items = self._store.lease_counts()
            for lease_id in old:
                if lease_id not in with_items:
                    del self._settled[lease_id]

    def earliest_renewal(self) -> float | None:
        due = [lease.renew_at for lease in self.leases()]
        return min(due) if due else None

    def _joined(self, lease_id: str, counts: Counts | None) -> LocalLease:
        # Every draw not running here was released: a drawn item is admitted
        # until its release, then kept released or deleted. So the released
        # count is the drawn count less the items running, and the drawn count
        # is the highest known: the terms' (this instance's), the items kept,
        # or the highest draw number among them (draws are numbered in order).
        by_state = counts.by_state if counts is not None else {}
        running = by_state.get(ADMITTED, 0)
        drawn_here = max(running + by_state.get(RELEASED, 0), counts.last_draw if counts is not None else 0)
        terms = self._terms.get(lease_id)
        if terms is None:  # known from its items only (a new instance): stopped, reported at once
            assert counts is not None  # a lease is known from its items, from a reply, or from both
            return LocalLease(lease_id, counts.key, counts.group, drawn_here, drawn_here, drawn_here - running, True,
                              RECOVERED_TTL_MS, 0.0, None)
        drawn = max(terms.drawn, drawn_here)
        return replace(terms, drawn=drawn, released=max(terms.released, drawn - running))
