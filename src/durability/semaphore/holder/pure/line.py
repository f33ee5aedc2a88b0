"""The holder's line of parked requests: demand it answered at once and serves later by a call, pure.

Lives here: ``Parked`` (a client's latest demand the holder keeps after
answering its request at once, with what the holder knows of it beyond
the message) and ``ParkedLine``: a request parked or taken out
(``park``), what a round's new grants and leases take off a client's
demand (``served``), the requests a round sees (``requests``), a reply
the client sent back to a call (``refresh``), a client whose calls fail
(``suspend``: kept in line, served no more until it is heard from), and
the line as rows keep it (``Waiting``). Must not know: how a round decides, how a client
is called, storage or the clock (``now`` is handed in).

Why a line of parked requests: a request held open (a long poll) keeps
both the holder and its client awake, and Cloudflare bills every second
an object is awake. A parked request is answered at once; its demand
stays here, so every round sees it, and the round that has permits for
it reaches the client with one short call. The client asks again by
itself only once its wait (``wait_ms``) is over with nothing heard: the
fallback when every call is lost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ...messages import Demand, Request


@dataclass(frozen=True)
class Parked:
    """A client's demand as the holder keeps it between rounds (no reports: those were heard)."""

    request: Request
    since: float  #: when it joined the line: ties in age go to the client parked first
    heard_at: float  #: when the client last spoke (a request, a sync, a reply to a call)
    version: int = 0  #: grows with each request of the client: a call's reply older than one is ignored
    suspended: bool = False  #: a call to it failed: in line, but served no more until it is heard from
    #: the leases the client knows of, and whether it knows each one is retired
    #: (it reported them, or a reply listed them): no news to it
    known_leases: frozenset[tuple[str, bool]] = frozenset()

    @property
    def client_id(self) -> str:
        return self.request.client_id


@dataclass(frozen=True)
class Waiting:
    """One (client, group) of the line as its row keeps it: enough for a new
    instance to serve oldest first before the client speaks again."""

    client_id: str
    group: str
    count: int
    times: tuple[float, ...]  #: the oldest items' enqueue times, oldest first (at least one)
    since: float
    wait_ms: float
    claims: bool
    leases: bool

    def demand(self) -> Demand:
        return Demand(self.group, self.count, self.times[0], self.times)


class ParkedLine:
    """Each parked client's latest demand, by client id, in the order they joined."""

    def __init__(self) -> None:
        self._entries: dict[str, Parked] = {}
        #: per client, the version of its latest request (kept when it leaves the line)
        self._versions: dict[str, int] = {}
        #: clients whose demand changed since their rows were last written (``take_changed``)
        self._changed: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._entries

    def get(self, client_id: str) -> Parked | None:
        return self._entries.get(client_id)

    def version_of(self, client_id: str) -> int:
        """The version of the client's latest request (-1: none in this instance)."""
        return self._versions.get(client_id, -1)

    def entries(self) -> list[Parked]:
        return list(self._entries.values())

    def rows(self) -> set[tuple[str, str]]:
        """The (client, group) pairs that wait in line."""
        return {(p.client_id, d.group) for p in self._entries.values() for d in p.request.demand}

    def park(self, request: Request, now: float) -> Parked | None:
        """The client's latest request: its demand replaces what was kept (a
        client with no demand left leaves the line). Returns its entry."""
        version = self._versions[request.client_id] = self._versions.get(request.client_id, -1) + 1
        return self._put(request, now, version)

    def _put(self, request: Request, now: float, version: int) -> Parked | None:
        kept = self._entries.get(request.client_id)
        self._changed.add(request.client_id)
        if not request.demand:
            self._entries.pop(request.client_id, None)
            return None
        known = frozenset((report.lease_id, report.stopped) for report in request.lease_reports) | (
            kept.known_leases if kept else frozenset())
        entry = Parked(replace(request, reports=(), lease_reports=()), kept.since if kept else now, now, version,
                       known_leases=known)
        self._entries[request.client_id] = entry
        return entry

    def heard(self, client_id: str, now: float) -> None:
        """The client spoke (a sync, say): not silent, and served again if it was suspended."""
        kept = self._entries.get(client_id)
        if kept is not None:
            self._entries[client_id] = replace(kept, heard_at=now, suspended=False)

    def refresh(self, client_id: str, version: int, request: Request, now: float) -> bool:
        """A client's reply to a call made at ``version``: its demand now (it
        rejoins the line if a round took it out, taking its demand for served).
        Ignored if a newer request of the client came meanwhile (False)."""
        if self._versions.get(client_id, -1) != version:
            return False
        self._put(replace(request, client_id=client_id), now, version)
        return True

    def told(self, client_id: str, leases: Iterable[tuple[str, bool]]) -> None:
        """A reply on its way to the client lists these leases (id, retired): no news any more."""
        kept = self._entries.get(client_id)
        if kept is not None:
            self._entries[client_id] = replace(kept, known_leases=kept.known_leases | frozenset(leases))

    def served(self, client_id: str, granted: dict[str, int], heard_up_to: float) -> None:
        """A round handed the client ``granted`` permits per group: its demand
        loses as many items, oldest first, and it is taken to know those
        grants (``heard_up_to``), so that no later round counts them twice
        before the client's reply refreshes its demand."""
        kept = self._entries.get(client_id)
        if kept is None:
            return
        self._changed.add(client_id)
        demand = tuple(d for d in (_less(d, granted.get(d.group, 0)) for d in kept.request.demand) if d is not None)
        if not demand:
            del self._entries[client_id]
            return
        request = replace(kept.request, demand=demand, heard_up_to=max(kept.request.heard_up_to, heard_up_to))
        self._entries[client_id] = replace(kept, request=request)

    def suspend(self, client_id: str) -> None:
        kept = self._entries.get(client_id)
        if kept is not None:
            self._entries[client_id] = replace(kept, suspended=True)

    def forget(self, client_id: str) -> None:
        self._entries.pop(client_id, None)
        self._changed.add(client_id)

    def take_changed(self) -> set[str]:
        """The clients whose demand changed since this was last taken (their rows may need writing)."""
        changed, self._changed = self._changed, set()
        return changed

    def changed_again(self, clients: set[str]) -> None:
        """Their rows were not written after all."""
        self._changed |= clients

    def snapshot(self) -> tuple[dict[str, Parked], dict[str, int], set[str]]:
        return dict(self._entries), dict(self._versions), set(self._changed)

    def restore_snapshot(self, snapshot: tuple[dict[str, Parked], dict[str, int], set[str]]) -> None:
        """Be as at ``snapshot`` again (a round whose rows were not written)."""
        self._entries, self._versions, self._changed = dict(snapshot[0]), dict(snapshot[1]), set(snapshot[2])

    def requests(self, leaving_out: str | None = None) -> list[Request]:
        """The requests a round sees, in the order their clients joined:
        every entry not suspended (and not ``leaving_out``, whose newer
        request the round has)."""
        entries = sorted(self._entries.values(), key=lambda e: (e.since, e.client_id))
        return [e.request for e in entries if not e.suspended and e.client_id != leaving_out]

    # -- rows ------------------------------------------------------------------------
    def waiting(self, client_id: str) -> list[Waiting]:
        """The client's demand as rows keep it, per group."""
        kept = self._entries.get(client_id)
        if kept is None:
            return []
        request = kept.request
        return [Waiting(client_id, d.group, d.count, d.times or (d.oldest_at,), kept.since, request.wait_ms,
                        request.claims, request.leases) for d in request.demand]

    def restore(self, rows: Iterable[Waiting], now: float, names: dict[str, str],
                heard_up_to: dict[str, float] | None = None) -> None:
        """A new instance's line, from the rows (``names``: its clients' objects'
        names; ``heard_up_to``: per client, the grants taken as known to it):
        each client as if it had just spoken."""
        by_client: dict[str, list[Waiting]] = {}
        for row in rows:
            by_client.setdefault(row.client_id, []).append(row)
        for client_id, groups in sorted(by_client.items(), key=lambda item: (item[1][0].since, item[0])):
            first = groups[0]
            request = Request(client_id, tuple(w.demand() for w in groups), (), first.wait_ms, first.leases,
                              claims=first.claims, heard_up_to=(heard_up_to or {}).get(client_id, 0.0), wake=True,
                              name=names.get(client_id))
            self._entries[client_id] = Parked(request, first.since, now)
            self._versions[client_id] = 0


def _less(demand: Demand, served: int) -> Demand | None:
    """``demand`` with its ``served`` oldest items taken off (None: nothing left).
    Past the last time it gave, the rest stand at that time."""
    count = demand.count - served
    if count <= 0:
        return None
    if not demand.times:
        return demand
    times = demand.times[served:] or demand.times[-1:]
    return Demand(demand.group, count, times[0], times[:count])
