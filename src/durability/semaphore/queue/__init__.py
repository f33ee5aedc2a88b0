"""The queue: work queued in a client object, admitted under a holder's budget.

Lives here: the object's shell (``shell``: ``DurabilitySemaphoreQueue``,
its public calls, the timers a new instance derives, the purge), releases
(``releases``), what its parts share and how a change commits (``memory``),
each key's requests (``requests``), grants and leases (``grants``,
``leases``, counted from rows by ``queue/grant_book`` and ``queue/lease_book``),
``admit()`` and ``finished()`` (``admission``), checks of its input
(``input``), the old outbox drained (``old_outbox``), its rows (``store``,
``schema``), and the rules it applies, pure (``pure/``). Must not know:
the holder's side.
"""
