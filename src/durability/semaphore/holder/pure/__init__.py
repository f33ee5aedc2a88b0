"""The holder's rules, as pure functions: no I/O, no clock, no storage.

Lives here: the round (``allocation``: reports, then the round in named
phases, ``round``; its terms, ``round_terms``; its shares, ``shares``), the
records it works on (``records``), reclaiming expired grants
(``reclaim``), what replies list (``news``), leases (``leases``,
``holder/pure/lease_entry``), fair share between keys (``fairness``), the line of
parked requests (``line``) and the mark a reply carries of it
(``line_mark``).
"""
