"""A lease as the holder's book keeps it, and which of its changes need a row.

Lives here: ``Lease``, the book's entry for one lease (what it reserves
for its client, what was drawn and released, what it charges), and
``needs_row``, which says whether a change of one must be written. Must
not know: storage, RPC, clocks or the user's callbacks.

Accounting. A lease reserves ``permits`` for one (client, group); the client
draws them one item at a time without asking and reports ``drawn`` and
``released`` as cumulative high-water marks, kept clamped (``released <=
drawn <= permits``). Its footprint, ``permits - released``, is charged
against the budget: drawn work still running plus permits still drawable.
A retired lease may no longer be drawn from, but the client may have drawn
after its last report, so its footprint stays in full until the client
reports that it stopped; ``drawn`` is then final and ``permits`` shrinks to
it, returning the undrawn rest. A lease whose permits are all released is
settled and leaves the book.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    lease_id: str
    client_id: str
    group: str
    permits: int
    drawn: int
    released: int
    expires_at: float  #: epoch ms: retired unless a report comes first
    retired: bool  #: no more draws; counted in full until the client says it stopped
    limit_at_issue: int  #: the limit it was issued under: a lower limit retires it

    @property
    def footprint(self) -> int:
        return self.permits - self.released

    @property
    def drawable(self) -> int:
        """Permits the client may still draw, as far as the holder knows."""
        return 0 if self.retired else self.permits - self.drawn

    @property
    def settled(self) -> bool:
        return self.released == self.permits


def needs_row(row: Lease | None, lease: Lease, ttl_ms: float) -> bool:
    """Must the holder write this change of a lease, whose row is ``row``?

    Not when it only moves what, lost with the instance, leaves the holder
    counting more than its client uses: the counts drawn and released (short
    of settling it, which deletes the row), and a heartbeat that keeps the
    row's expiry within half a lifetime of the one in memory. A new instance
    reading the row then counts released permits as still in use, and its
    client as holding permits it drew, until that client's next report
    (cumulative, so it restores both); a lease whose reports stopped is
    retired at worst half a lifetime early, and stays counted until its
    client says what it drew. Under contention a lease lives for about one
    job, and its report of the draw was a row written per job.
    """
    if row is None or lease.retired != row.retired or lease.permits != row.permits:
        return True
    if lease.settled:  # one of another epoch, remembered settled (see remembered): the row must say so
        return True
    if lease.retired:
        # Only a lease of another epoch moves its expiry once retired: its
        # heartbeat bounds how long it is charged, so a new instance must not
        # forget it sooner (it exists only after the holder lost its rows).
        return lease.expires_at != row.expires_at
    return lease.expires_at - row.expires_at >= ttl_ms / 2
