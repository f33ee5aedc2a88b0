"""The semaphore's wire format, both directions: every message and reply, written and read, imported from here.

Lives here: the one place the wire format is imported from; it gathers
it from the modules that spell it. ``messages/checks``: the version, the
bounds and the vocabularies (report statuses, blocked reasons), and the
checks every field is read with. ``messages/requests``: the camelCase
messages clients send (``request``, ``sync``) and the bodies older
queues put in their outbox (``queued_grant_report``,
``queued_lease_id``). ``messages/replies``: the replies the holder sends
(``grants``, ``synced``; the refusal is ``durability._wire``'s), and the
pacing and the line a grants reply carries (``pacing_in``,
``Reply.line``). ``messages/usage``: the ``usage`` reply. Each message and
reply is a typed class with ``to_wire`` (the dict the wire carries) and
``parse`` (the dict checked completely into the class). Every field name
of the protocol is spelled in those modules and nowhere else. Must not
know: storage, time, allocation, how a message travels.
"""

from __future__ import annotations

# (ErrorCode and ProtocolError are shared with the locks: re-exported here, where callers found them.)
from ..._common.wire import ErrorCode as ErrorCode, ProtocolError as ProtocolError
from .checks import (
    EXPIRED as EXPIRED,
    GROUP_LIMIT as GROUP_LIMIT,
    LIMIT as LIMIT,
    LIMIT_RESOLUTION_ERROR as LIMIT_RESOLUTION_ERROR,
    MAX_COUNT as MAX_COUNT,
    MAX_DEMAND_ENTRIES as MAX_DEMAND_ENTRIES,
    MAX_DEMAND_TIMES as MAX_DEMAND_TIMES,
    MAX_ID_LENGTH as MAX_ID_LENGTH,
    MAX_REPLY_ENTRIES as MAX_REPLY_ENTRIES,
    MAX_REPORTS as MAX_REPORTS,
    MAX_TREE_DEMAND_TIMES as MAX_TREE_DEMAND_TIMES,
    MAX_WAIT_MS as MAX_WAIT_MS,
    NOT_FOUND as NOT_FOUND,
    NOT_PERMITTED as NOT_PERMITTED,
    OK as OK,
    RATE as RATE,
    RETIRED as RETIRED,
    SETTLED as SETTLED,
    VERSION as VERSION,
    BlockedReason as BlockedReason,
    ReportStatus as ReportStatus,
)
from .replies import (
    BLOCKED_REASONS as BLOCKED_REASONS,
    LEASE_STATUSES as LEASE_STATUSES,
    REPORT_STATUSES as REPORT_STATUSES,
    Blocked as Blocked,
    GrantEntry as GrantEntry,
    LeaseEntry as LeaseEntry,
    LeaseOutcome as LeaseOutcome,
    Reply as Reply,
    ReportOutcome as ReportOutcome,
    pacing_in as pacing_in,
    parse_reply as parse_reply,
)
from .requests import (
    Demand as Demand,
    LeaseReport as LeaseReport,
    Report as Report,
    Request as Request,
    Sync as Sync,
    parse as parse,
    queued_grant_report as queued_grant_report,
    queued_lease_id as queued_lease_id,
)
from .usage import (
    GroupUsage as GroupUsage,
    RateUsage as RateUsage,
    ShareUsage as ShareUsage,
    Usage as Usage,
    WaitingUsage as WaitingUsage,
)
