"""The grants a queue holds: their terms in memory, their counts from its items.

Lives here: ``GrantBook``, the queue's view of each grant it knows
(``LocalGrant``): the terms a holder's reply gave (permits, claim deadline)
and the claims made here, kept in memory, joined with the counts of the
items admitted and released on the grant, read from the rows. Must not
know: the protocol, timers, or when anything happens.

No row is written for a grant. What a crash loses is recovered without one:

- the items admitted or released on a grant name it, so a new instance
  knows every grant it admitted on, with its confirmed and released counts
  (its permits taken as its claims, its deadline as past: the holder's next
  listing gives them again);
- claims the holder confirmed that no item here counts (a reply lost, or
  applied by an instance that is gone; items released and deleted with
  ``keep_done_ms`` 0): the holder lists every grant of the client not yet
  settled in each reply (``allocation.held_grants``), with its confirmed
  claims and the releases it heard, and the queue admits on those claims
  (never on more than the holder has not heard released) or gives them back
  (``extra``: claims with no item, released);
- unclaimed permits (a grant from a holder that does not claim for its
  clients) the holder takes back at their claim deadline.

Before this, a grant had a row (written when first claimed on, deleted once
settled: two rows per grant, about two per admitted job on the demo's
workload). Rows older versions wrote are read once and deleted once their
grant is settled.
"""

from __future__ import annotations

from dataclasses import replace

from .pure.states import ADMITTED, CLAIMING, RELEASED, Counts, LocalGrant
from .store import QueueStore


class GrantBook:
    def __init__(self, store: QueueStore, remember_ms: float) -> None:
        """``remember_ms``: how long a grant settled here stays known as settled,
        so that a reply sent before it was settled cannot revive it (a reply
        never arrives later than a request's time limit)."""
        self._store = store
        self._remember_ms = remember_ms
        self._terms: dict[str, LocalGrant] = {}
        # Grants settled here: id -> (when, the claims made on them by then).
        # Their items, kept a while, name them still: they are not held.
        self._settled: dict[str, tuple[float, int]] = {}
        self._rows: set[str] = set()  #: grants with a row an older version wrote
        for grant in store.legacy_grants():
            self._terms[grant.grant_id] = grant
            self._rows.add(grant.grant_id)

    def grants(self, key: str | None = None) -> list[LocalGrant]:
        """The grants held here, not settled (of one key, or all), by grant id."""
        counts = self._store.grant_counts(key)
        ids = {i for i in counts if self._held(i)} | {i for i, t in self._terms.items() if key is None or t.key == key}
        return [self._joined(i, counts.get(i)) for i in sorted(ids)]

    def grant(self, grant_id: str) -> LocalGrant | None:
        counts = self._store.grant_counts(grant_id=grant_id).get(grant_id)
        if grant_id not in self._terms and (counts is None or not self._held(grant_id)):
            return None
        return self._joined(grant_id, counts)

    def _held(self, grant_id: str) -> bool:
        return grant_id in self._terms or grant_id not in self._settled

    def snapshot(self) -> tuple[dict[str, LocalGrant], dict[str, tuple[float, int]], set[str]]:
        """What this book keeps in memory, for ``restore`` to put back (a commit that failed)."""
        return dict(self._terms), dict(self._settled), set(self._rows)

    def restore(self, snapshot: tuple[dict[str, LocalGrant], dict[str, tuple[float, int]], set[str]]) -> None:
        terms, settled, rows = snapshot
        self._terms, self._settled, self._rows = dict(terms), dict(settled), set(rows)

    def keep(self, grant: LocalGrant) -> None:
        """Keep a grant's terms and claims (its confirmed and released counts are its items')."""
        self._terms[grant.grant_id] = grant
        self._settled.pop(grant.grant_id, None)  # taken up again (see stale)

    def forget(self, grant_id: str, now: float, claimed: int) -> None:
        """The grant is settled here, with ``claimed`` claims made on it."""
        self._terms.pop(grant_id, None)
        if grant_id in self._rows:
            self._rows.discard(grant_id)
            self._store.delete_grant(grant_id)
        self._settled[grant_id] = (now, claimed)

    def prune(self, now: float) -> None:
        """Stop remembering grants settled here long enough ago (no reply sent
        before can still arrive) whose items are all deleted (a new instance
        would not know them either)."""
        old = [i for i, (at, _) in self._settled.items() if at + self._remember_ms < now]
        if old:
            with_items = self._store.grant_counts()
            for grant_id in old:
                if grant_id not in with_items:
                    del self._settled[grant_id]

    def stale(self, grant_id: str, claimed: int) -> bool:
        """Is a listing of a grant with ``claimed`` confirmed claims older than
        its settlement here? Claims beyond those it was settled with were made
        by an older instance: the listing is news, not stale."""
        settled = self._settled.get(grant_id)
        return settled is not None and claimed <= settled[1]

    def knows_terms(self, grant_id: str) -> bool:
        """Known from a holder's reply in this instance, not only from its items."""
        return grant_id in self._terms

    def _joined(self, grant_id: str, counts: Counts | None) -> LocalGrant:
        terms = self._terms.get(grant_id)
        by_state: dict[str, int]
        if counts is not None:
            key, group, by_state = counts[:3]
        else:
            assert terms is not None  # a grant is known from its items, from a reply, or from both
            key, group, by_state = terms.key, terms.group, {}
        extra = terms.extra if terms is not None else 0
        released = by_state.get(RELEASED, 0) + extra
        confirmed = by_state.get(ADMITTED, 0) + by_state.get(RELEASED, 0) + extra
        claiming_rows = by_state.get(CLAIMING, 0)
        if terms is None:  # known from its items only (a new instance): the holder's listing says more
            claimed = confirmed + claiming_rows
            return LocalGrant(grant_id, key, group, claimed, claimed, confirmed, released, 0.0, claiming_rows)
        claimed = max(terms.claimed, confirmed + claiming_rows)
        return replace(terms, claimed=claimed, confirmed=confirmed, released=released, claiming_rows=claiming_rows)
