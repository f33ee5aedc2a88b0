"""The example Worker: jobs admitted under each account's concurrency budget,
and counters that report to tallies through a durable outbox.

Lives here: the Durable Object classes and the ``Default`` entrypoint that
``wrangler deploy`` ships, written the way a user of the library writes them.
Must not know: the embedded runtime; this module runs unmodified on
Cloudflare and in tests.

Account concurrency: jobs are submitted to one of ``SHARDS`` ``JobShard``
objects (by a hash of the job id). Each shard queues its jobs per account
with ``DurabilitySemaphoreQueue``; the account's ``AccountLimit`` holder
admits them, oldest first across all shards, within the account's limit
(``ACCOUNT_LIMITS`` per account, else ``ACCOUNT_CONCURRENCY``) and each
workflow's limit (``WORKFLOW_LIMITS``); with ``ACCOUNT_FAIR_SHARE`` set,
the account's workflows share its limit by weight, floor and priority
instead of oldest first across them. An admitted job runs through the
``DurabilityJobs`` runner, each attempt handed to the consumer of the
``job-attempts`` queue (``Default.queue``), which runs it where a stateless
Worker bills CPU only and reports to the shard (``JOBS_RUN_IN``: "shard"
runs it in the shard instead); its permit goes back when the job ends, and
the queue's ``finished()`` sweep returns any permit whose release was lost.

Webhooks: a job submitted with a ``url`` is POSTed there once its work is
done, inside its attempt (in the consumer), so under the account's permit: never more
deliveries of an account at once than its limit. A delivery that gets no
answer, or a 5xx, 408, 425 or 429, fails the attempt and the runner retries
it; any other answer outside 2xx (a redirect included: none is followed)
fails the job at once. Delivery is at least once: every attempt carries the
job id in its ``Idempotency-Key`` header, for the receiver to drop repeats.

Outbox: each ``Counter`` counts increments per tally. Its increment and the
report of its new cumulative count to the ``Tally`` commit in one
transaction; the outbox then delivers the report at least once. A tally
keeps, per counter, the highest count it was told, so lost, repeated and
reordered reports still add up to exactly what was counted.

Retention: a shard keeps a finished job a day (``JOBS_KEPT_MS``; its
newest ``JOBS_KEPT`` at most, and any that finished within the hour), then
deletes its row (its queue item's, which keeps the outcome of a job that
ended in its first attempt, or the job runner's) within the hour after;
``GET /jobs/{id}`` answers ``not_found`` from then on, and submitting the
id again runs a new job. A job whose queue item is still kept is not
deleted, so the queue can never run it twice.

Uploads: at most ``UPLOADS_PER_USER`` uploads of one user run at once,
held like a lock around the upload with ``durability.locks.semaphore``; a
further upload waits up to ten seconds for a place. ``UploadSlots`` holds
the places, one instance per user.

Operator pages: ``GET /accounts/{id}`` and ``GET /jobs/{id}`` asked for as
HTML answer the pages of ``operator_pages`` (an account's budget and what
waits; a job's state and why it waits), behind the same token.

The sweep: the runtime gives up on an alarm whose run failed seven times in
a row, and a shard whose alarm is gone has nothing to wake it but a call.
A Cron Trigger (``[triggers]`` in ``wrangler.toml``) calls every shard's
``wake`` every 30 minutes, so that such a shard resumes its work within
that, if nothing else calls it first (docs/design.md, liveness). Holders
need no sweep: every shard with work waiting calls its holder.
"""

import asyncio
import hmac
import json
import logging
import math
import re
import zlib
from urllib.parse import urlsplit

from workers import DurableObject, Response, WorkerEntrypoint, fetch as fetch_url

import operator_pages
from durability import (
    Backoff,
    DurabilityJobs,
    DurabilityOutbox,
    DurabilityScheduler,
    JobConsumer,
    JobRetention,
    NonRetryableError,
    QueueHandoff,
    locks,
)
from durability.locks import PlaceLost, WaitTimeout, semaphore
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue
from durability.transforms import timeout

log = logging.getLogger("entry")
MAX_NAME_LENGTH = 256
MAX_AMOUNT = 1_000_000_000


def _name(value, what):
    """A name or id: 1 to 256 characters, and never ``.`` or ``..``, which no
    URL path can carry (a browser and workerd resolve them as dot segments),
    so that every name accepted can be read back through its route."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be a string of 1 to {MAX_NAME_LENGTH} characters")
    if value in (".", ".."):
        raise ValueError(f"{what} must not be {value!r}: no URL path can carry it")
    return value


def _integer_in(value, low, high):
    """An int (not a bool, which Python counts as one) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _amount(value):
    if not _integer_in(value, 1, MAX_AMOUNT):
        raise ValueError(f"amount must be an integer from 1 to {MAX_AMOUNT}")
    return value


class Counter(DurableObject):
    """Counts increments per tally and reports each cumulative count to its tally."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.outbox = DurabilityOutbox(self.scheduler)
        # Reports wait up to a second so that each tally hears one cumulative
        # count per second however many increments there were.
        self.reports = self.outbox.channel("tally-reports", self._send_reports, delay_ms=1_000)
        ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS counts ("
            " tally TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID"
        )

    async def add(self, tally, amount):
        """Add ``amount`` to this counter's count for ``tally``; return the new count."""
        _name(tally, "tally")
        _amount(amount)

        def change():
            value = self.ctx.storage.sql.exec(
                "INSERT INTO counts (tally, value) VALUES (?, ?) ON CONFLICT (tally) "
                "DO UPDATE SET value = value + excluded.value RETURNING value",
                tally, amount,
            ).one()["value"]
            report = {"tally": tally, "source": self.ctx.id.toString(), "count": value}
            self.reports.enqueue(report, key=tally)  # replaces an unsent older report
            return value

        value = self.ctx.storage.transactionSync(change)
        await self.scheduler.sync()
        return value

    async def count(self, tally):
        row = self.ctx.storage.sql.exec(
            "SELECT value FROM counts WHERE tally = ?", _name(tally, "tally")
        ).toArray()
        return row[0]["value"] if row else 0

    async def _send_reports(self, messages):
        for message in messages:
            report = message.body
            tally = self.env.TALLY.getByName(report["tally"])
            await tally.report(report["source"], report["count"])

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class Tally(DurableObject):
    """Sums the cumulative counts its counters report, each counted once."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS sources ("
            " source TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID"
        )

    async def report(self, source, count):
        """Record that ``source`` has counted ``count`` in all; older reports change nothing."""
        _name(source, "source")
        if not _integer_in(count, 0, 2**53):
            raise ValueError("count must be an integer from 0 to 2**53")
        self.ctx.storage.sql.exec(
            "INSERT INTO sources (source, count) VALUES (?, ?) ON CONFLICT (source) "
            "DO UPDATE SET count = excluded.count WHERE excluded.count > sources.count",
            source, count,
        )
        return {"ok": True}

    async def total(self):
        return self.ctx.storage.sql.exec(
            "SELECT coalesce(sum(count), 0) AS total FROM sources"
        ).one()["total"]


def _json_var(env, name):
    return json.loads(getattr(env, name, "") or "{}")


def _calls_shards(env):
    """ACCOUNT_CALLS_SHARDS: "false" keeps each shard's request held open at its holder."""
    return str(getattr(env, "ACCOUNT_CALLS_SHARDS", "true")).lower() != "false"


class AccountLimit(DurableObject):
    """One instance per account (the account id is its name): the account's
    concurrency budget, shared by every object that queues its work."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        # ACCOUNT_LEASES: the semaphore's leases= options as JSON, or empty for none.
        leases = json.loads(getattr(env, "ACCOUNT_LEASES", "") or "null")
        # Rounds closer than the library's defaults (1 s wait, 2 s period): a
        # freed permit waits for the next round. On the demo's workload
        # (scripts/bench_vs_naive.py, seed 1) the limit is then busy 98% of
        # the time jobs wait instead of 92%, and 2% of admissions leave
        # oldest-first order instead of 17%; with jobs of 100 ms to 2 s
        # (--short) 95% (90% with rounds 50 ms / 250 ms apart). It costs
        # about 5% more rows written (more rounds make smaller grants); a
        # round that grants nothing writes nothing.
        # ACCOUNT_FAIR_SHARE: how workflows share the account's limit, as JSON
        # ({"weights": {workflow: w}, "floors": {workflow: n}, "priorities":
        # {workflow: p}}, each optional), or empty for oldest first across
        # the account. Turned on or off at start; its figures are read every round.
        fair = _json_var(env, "ACCOUNT_FAIR_SHARE") and {
            "weight": lambda workflow: self._fair("weights", workflow, 1),
            "floor": lambda workflow: self._fair("floors", workflow, 0),
            "priority": lambda workflow: self._fair("priorities", workflow, 0)}
        # ACCOUNT_RATE: at most this many of an account's jobs start per
        # period ("60/min", "5/s, burst 10"), next to its concurrency; empty
        # for none. WORKFLOW_RATES: a workflow's own ({"workflow-id":
        # "10/min"}). Turned on or off at start, read every round. Not with
        # ACCOUNT_LEASES.
        rate = self._account_rate if getattr(env, "ACCOUNT_RATE", "") else None
        group_rate = self._workflow_rate if _json_var(env, "WORKFLOW_RATES") else None
        self.semaphore = DurabilitySemaphore(
            self.scheduler, limit=self._account_limit, group_limit=self._workflow_limit, leases=leases,
            round_wait_ms=20, round_period_ms=100, fair_share=fair or None, rate=rate, group_rate=group_rate,
            # A shard's request is answered at once and its demand kept in
            # line; the round that has permits for it calls the shard
            # (JobShard.semaphore_reply). Nothing is held open, so neither
            # object is awake while jobs wait (docs/semaphore.md).
            clients=env.JOB_SHARD if _calls_shards(env) else None,
        )

    def _account_limit(self):
        # Read every round: a change of the vars takes effect without a restart.
        limits = _json_var(self.env, "ACCOUNT_LIMITS")
        return int(limits.get(self.ctx.id.name, self.env.ACCOUNT_CONCURRENCY))

    def _account_rate(self):
        return getattr(self.env, "ACCOUNT_RATE", "") or None

    def _workflow_rate(self, workflow_id):
        return _json_var(self.env, "WORKFLOW_RATES").get(workflow_id)

    def _workflow_limit(self, workflow_id):
        return _json_var(self.env, "WORKFLOW_LIMITS").get(workflow_id)

    def _fair(self, table, workflow_id, default):
        return _json_var(self.env, "ACCOUNT_FAIR_SHARE").get(table, {}).get(workflow_id, default)

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


# Client objects reach an account's holder through this factory. The timeout
# leaves room for the queue's long poll (request_wait_ms, 240 s here) and a round.
limits = DurabilitySemaphore.client(binding="ACCOUNT_LIMIT").with_(timeout, 250_000)

# A job's work and its webhook run in a queue consumer (JOBS_RUN_IN), whose
# invocation lasts 15 minutes at most: the work gets 14 of them.
MAX_WORK_MS = 14 * 60_000
MAX_URL_LENGTH = 2_048
MAX_PAYLOAD_BYTES = 16_384
MAX_PAYLOAD_DEPTH = 64  #: arrays and objects within one another; checked without recursion
_JOB_FIELDS = {"id", "account", "workflow", "work_ms", "fail", "url", "payload"}


def _webhook_url(value):
    """An absolute http(s) URL that fetch can send, in its ASCII form (an
    international host as IDNA gives it), or ValueError: a host, no
    credentials, nothing invisible (spaces, controls such as U+0085, and
    U+00A0 or U+3000 as well), ASCII outside the host, 2,048 characters at most."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_URL_LENGTH:
        raise ValueError(f"url must be a string of 1 to {MAX_URL_LENGTH} characters")
    if any(char == " " or not char.isprintable() for char in value):
        raise ValueError("url must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number from 0 to 65535)
    except ValueError:
        raise ValueError("url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("url must be an absolute http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("url must not carry credentials")
    url = _ascii_host(parts)
    if not url.isascii():
        raise ValueError("url must be ASCII outside its host: percent-encode its path and query")
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"url must be at most {MAX_URL_LENGTH} characters with its host in IDNA form")
    return url


def _ascii_host(parts):
    """The URL with its host in IDNA form (as a browser sends it), else as it was."""
    host, colon, port = parts.netloc.partition(":")  # (no credentials: refused before)
    if host.isascii():
        return parts.geturl()
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError("url's host is not a valid international domain name") from None
    return parts._replace(netloc=ascii_host + colon + port).geturl()


def _header_value(value, what, header):
    """``value`` if an HTTP header can carry it as it is: printable Latin-1
    (what fetch sends as bytes), no space or tab at its ends (they would be
    cut off); else ValueError."""
    if value != value.strip(" \t") or not all(" " <= char <= "~" or "\xa0" <= char <= "\xff" for char in value):
        raise ValueError(f"{what} must be printable Latin-1 with no space at its ends: "
                         f"it goes in the webhook's {header} header")
    return value


def _webhook_payload(value):
    """Any JSON value that nests at most MAX_PAYLOAD_DEPTH deep and whose JSON
    text is at most MAX_PAYLOAD_BYTES, or ValueError."""
    _json_value_within(value, MAX_PAYLOAD_DEPTH)
    size = len(json.dumps(value, allow_nan=False).encode())
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload must be at most {MAX_PAYLOAD_BYTES} bytes of JSON")
    return value


def _json_value_within(value, depth):
    """JSON's values only (string keys, finite numbers), nested at most
    ``depth`` deep: walked with a list, not recursion, so no depth can
    exhaust the stack."""
    pending = [(value, 0)]
    while pending:
        value, level = pending.pop()
        if isinstance(value, (list, dict)):
            if level >= depth:
                raise ValueError(f"payload must nest at most {depth} arrays or objects deep")
            if isinstance(value, dict) and not all(isinstance(key, str) for key in value):
                raise ValueError("payload must be a JSON value: object keys are strings")
            pending.extend((entry, level + 1) for entry in (value.values() if isinstance(value, dict) else value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError("payload must be a JSON value: numbers are finite")
        elif value is not None and not isinstance(value, (bool, int, float, str)):
            raise ValueError("payload must be a JSON value")


def _job(job):
    """A job as submitted: ``{id, account, workflow?, work_ms?, fail?, url?, payload?}``."""
    if not isinstance(job, dict):
        raise ValueError("a job must be an object")
    unknown = set(job) - _JOB_FIELDS
    if unknown:
        raise ValueError(f"unknown job fields: {sorted(unknown)}")
    work_ms = job.get("work_ms", 0)
    if not _integer_in(work_ms, 0, MAX_WORK_MS):
        raise ValueError(f"work_ms must be an integer from 0 to {MAX_WORK_MS}")
    if not isinstance(job.get("fail", False), bool):
        raise ValueError("fail must be true or false")
    if "payload" in job and "url" not in job:
        raise ValueError("payload goes with url: it is what the webhook carries")
    checked = {
        "id": _name(job.get("id"), "id"),
        "account": _name(job.get("account"), "account"),
        "workflow": _name(job.get("workflow", "default"), "workflow"),
        "work_ms": work_ms,
        "fail": job.get("fail", False),
    }
    if "url" in job:  # kept only when given: a job without one stores what it always did
        _header_value(checked["id"], "id", "Idempotency-Key")  # (the only field that goes in a header)
        checked["url"] = _webhook_url(job["url"])
        checked["payload"] = _webhook_payload(job.get("payload"))
    return checked


async def run_job(env, job):
    """The work of one job. This example waits ``work_ms`` (and fails when
    told to), where a real Worker calls the service that does the work, then
    delivers the job's webhook when it has a ``url``."""
    await asyncio.sleep(job["work_ms"] / 1000)
    if job["fail"]:
        raise RuntimeError(f"job {job['id']} failed, as it was asked to")
    result = {"worked_ms": job["work_ms"]}
    if job.get("url"):
        result["webhook"] = await deliver_webhook(job)
    return result


WEBHOOK_TIMEOUT_S = 30
# Answers that may change if asked again: a timeout, too early, too many
# requests, and every 5xx. Any other answer outside 2xx would come again.
_RETRYABLE_STATUSES = {408, 425, 429}


async def deliver_webhook(job):
    """POST the job's webhook once. Returns ``{"status": ...}`` on a 2xx answer;
    raises to fail the attempt (retried), or NonRetryableError to fail the job.

    ``workers.fetch`` is the SDK's wrapper of JavaScript's ``fetch``, to
    which every HTTP client that works in Python Workers comes down (the
    runtime patches async ``httpx`` and ``aiohttp`` onto it). A redirect is
    not followed (``redirect="manual"``): a webhook URL must be final."""
    body = {"id": job["id"], "account": job["account"], "workflow": job["workflow"],
            "payload": job.get("payload")}
    headers = {"content-type": "application/json", "idempotency-key": job["id"]}
    try:
        async with asyncio.timeout(WEBHOOK_TIMEOUT_S):
            response = await fetch_url(job["url"], method="POST", headers=headers,
                                       body=json.dumps(body), redirect="manual")
            answer = await response.text()  # read to the end: an unread body holds its connection
    except TimeoutError:
        raise TimeoutError(f"webhook {job['url']}: no answer within {WEBHOOK_TIMEOUT_S} s") from None
    status = response.status
    if 200 <= status < 300:
        return {"status": status}
    refusal = f"webhook {job['url']} answered {status}: {answer[:200]}"
    if status >= 500 or status in _RETRYABLE_STATUSES:
        raise RuntimeError(refusal)
    raise NonRetryableError(refusal)


#: How long a shard keeps a finished job, and how many at most (past it,
#: those done over an hour ago go). A shard wakes for each job's report and
#: reads every job it keeps once per wake, a row read each ($1 per million
#: jobs per 1,000 kept): the library's 30 days and 100,000 would cost a busy
#: shard up to $100 per million jobs. A day makes the purge wait an hour past
#: a job's time at most (``JobRetention.slack_ms``), not a day: a shard that
#: wakes per job (one every 10 s or fewer) keeps about 2,700 at most.
JOBS_KEPT_MS = 24 * 3_600_000
JOBS_KEPT = 2_000


class _OutcomesInItems:
    """A job's outcome kept in its queue item's row, written by the item's release."""

    def __init__(self, shard):
        self.shard = shard

    def keep(self, job_id, row):
        try:
            return self.shard.permits.release_keeping(job_id, row)
        except (KeyError, ValueError):  # no item admitted under it: the runner keeps its row
            return False

    def get(self, job_id):
        return self.shard.permits.record(job_id)


class JobShard(DurableObject):
    """Queues jobs of many accounts, runs each once its account admits it."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx, max_concurrency=64)
        attempts = _attempts_queue(env, ctx)
        self.jobs = DurabilityJobs(
            self.scheduler,
            handlers={"run": lambda job: run_job(self.env, job)},
            on_lifecycle_event=self._on_job_event,
            retries=Backoff(initial_ms=1_000, max_attempts=3),
            runs_in=attempts,
            # Finished jobs go after a day (or beyond the newest JOBS_KEPT of
            # the shard), one row written each, except while the queue keeps
            # their item (see _queue_keeps).
            retention=JobRetention(max_age_ms=JOBS_KEPT_MS, max_count=JOBS_KEPT),
            keep=self._queue_keeps,
            # A job that ends in its first attempt keeps its outcome in its
            # item's row, released with it: no row of its own (see _admit).
            outcomes=_OutcomesInItems(self),
        )
        # finished() asks the shard's own job runner (rows read, no request),
        # so the example asks 5 s after admit() returned instead of the
        # library's 60 s: a lost release then idles its permit seconds, not a
        # minute. With the demo's faults (600 jobs, 29 releases lost) the limit
        # was busy 96% of the time jobs waited at 10 s instead of 85% at 60 s,
        # for the same rows written per job; on the benchmark's faults (5% of
        # releases lost) 98.3% to 98.6% at 5 s where 10 s gave 97.6% to 97.9%,
        # for the same cost (uv run scripts/bench_vs_naive.py --faults
        # --system grants, seeds 1-3).
        self.permits = DurabilitySemaphoreQueue(
            self.scheduler,
            server=limits.bind(env),
            admit=self._admit,
            finished=self._finished,
            finished_check_ms=5_000,
            # The job runner keeps every job id, so the queue need not keep
            # done items to know them: a released item's row goes at once
            # (docs/queue.md), but for the item of a job that ended in its
            # first attempt, which keeps the job's outcome (release_keeping)
            # as long as the runner would keep a row of its own.
            keep_done_ms=0,
            keep_records_ms=JOBS_KEPT_MS,
            keep_done_max=JOBS_KEPT,
            # The holder may hold a shard's request up to 4 minutes instead of
            # the library's 50 s: a shard waiting for a busy account asks again
            # a fifth as often, and its alarm, kept running by the wait, is
            # set anew less often. On the demo's workload that was 3.27 requests
            # per job instead of 4.43, and $8.67 per million jobs instead of
            # $9.20, before shards served behind the line left it (2.70 and
            # $8.60 now: uv run scripts/bench_vs_naive.py --system grants).
            request_wait_ms=240_000,
            # Releases of drawn permits reach the holder within 1 s, as a
            # grant's do, instead of the library's 10 s. When the holder is not
            # contended at the moment a short job ends, its permit otherwise
            # idles up to 10 s while a burst builds elsewhere: with jobs of
            # 100 ms to 2 s and strict leases the limit was busy 89.3% of the
            # time jobs waited on seed 3 (90.7% on seed 1), 91.3% (93.2%) now,
            # for $0.03 to $0.16 more per million jobs; on the demo's workload
            # the figures do not move (uv run scripts/bench_vs_naive.py --short
            # --seed 3 --system "strict leases").
            lease_report_delay_ms=1_000,
            # Its holder may answer at once and call back (semaphore_reply).
            woken=_calls_shards(env),
            # A job handed to the queue's consumer lives on when the shard
            # hibernates, and its report releases its permit: each report asks
            # finished() about its job (job_report), a report that is lost comes
            # again with the message's next delivery (5 s on, doubling), and the
            # sweep runs at every release too. So the sweep runs at the shard's
            # next release, and a new instance hands its admitted items in
            # again at its next reply or sync (its holder calls a client that
            # holds a grant a minute with no word from it, wake_after_ms), and
            # on an alarm of their own only 10 minutes on: a permit they would
            # return is one whose job ended with no report heard and its
            # release lost, or one whose job the instance that admitted it
            # died before sending. At a minute, the sweep's alarm (set as each
            # attempt went out, and firing for nothing once its report had come)
            # cost 0.4 rows and 0.15 requests a job; under the benchmark's faults,
            # seeds 1-6, busy and order moved by less than seed-to-seed spread
            # (docs/design.md; uv run scripts/bench_vs_naive.py --faults
            # --system grants --seed N).
            checks_wait_ms=0 if attempts is None else 600_000,
        )

    async def semaphore_reply(self, key, reply):
        """The account holder's call, once a round has permits for this shard."""
        return await self.permits.hear(key, reply)

    async def job_report(self, report):
        """The queue consumer's call: how an attempt it ran ended (or whether it is still out)."""
        # A new instance knows its admitted jobs once its queue hands them in
        # (their items are their records until their first attempt settles).
        await self.permits.hand_in_admitted()
        answer = await self.jobs.report(report)
        if answer["status"] in ("completed", "failed"):
            # Its end is when its release may be lost: finished() is asked
            # about it now (reads only), not at the sweep a minute on.
            await self.permits.check_finished([report["job"]])
        # Answered once this report's release has reached the holder (when it
        # is short of permits; else it waits for the report delay, on the
        # alarm): a shard cut off before then fails the report, and the
        # consumer's next delivery (seconds on) starts an instance that tells
        # the holder again, where the holder's wake of a silent holder of its
        # permit came a minute or more on.
        await self.permits.told()
        return answer

    async def submit(self, job):
        job = _job(job)
        known = await self.jobs.run.get_result(job["id"])
        if known["status"] != "not_found":  # admitted once already: a repeat is a no-op
            queued = self.permits.status(job["id"])
            return {"id": job["id"], "state": queued["state"] if queued else "released"}
        [item] = await self.permits.enqueue(
            [{"id": job["id"], "key": job["account"], "group": job["workflow"], "body": job}]
        )
        return {"id": item.id, "state": item.state}

    async def status(self, job_id):
        job_id = _name(job_id, "id")
        queued = self.permits.status(job_id)
        result = await self.jobs.run.get_result(job_id)
        if queued is None:
            if result["status"] == "not_found":
                return {"id": job_id, "state": "not_found"}
            queued = {"id": job_id, "state": "released"}  # its item went before the job's row
        if queued["state"] == "admitted" and result["status"] == "not_found":
            # Admitted, its job not yet handed in again to a new instance (its
            # item is its record until the job writes a row): it runs.
            result = {"status": "pending"}
        return {**queued, "job": result}

    async def _admit(self, items):
        # Idempotent: a job id already known to the runner is not run again.
        # The admitted item is the job's record (the queue hands it in again
        # from a new instance), so the runner writes no row for the job
        # until an attempt settles, and none at all for a job that ends in
        # its first: its outcome goes into its item's row, with the item's
        # release (_OutcomesInItems). Per job, the shard writes its item
        # three times (queued, admitted, released) and deletes it a day on;
        # a row for the job besides cost two writes more (docs/jobs.md).
        for item in items:  # the job keeps how it was admitted
            await self.jobs.run.kept(item.id, {**item.body, "via": item.via}, resumed=item.resumed,
                                     since=item.admitted_at)

    async def _on_job_event(self, event):
        # The fast path only, once per job: a failed attempt that will be
        # retried keeps its permit, and finished() returns any permit whose
        # release is lost. A job whose outcome its item keeps was released
        # with it already (then this is a no-op).
        if event.type == "terminal":
            await self.permits.release(event.id)

    def _queue_keeps(self, ids):
        # The queue calls admit() again until it returns, so a job whose item
        # it still keeps could be admitted once more: only the job's row
        # makes that a no-op. Such a job stays until its item is gone (both
        # are kept a day). Reads only.
        return [job_id for job_id in ids if self.permits.status(job_id) is not None]

    async def _finished(self, ids):
        results = [await self.jobs.run.get_result(job_id) for job_id in ids]
        return [job_id for job_id, result in zip(ids, results) if result["status"] != "pending"]

    async def wake(self):
        """The sweep's call: set the alarm again if the runtime gave up on it
        (it reads the alarm), and an account whose row says it may hold
        permits here, with no job waiting, asks its holder what it holds: a
        request and a row or two the first sweep after its last use, nothing
        on a shard that hibernated since (docs/queue.md)."""
        await self.permits.resume()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


# The module, not the class, is imported: workerd exports every public
# Durable Object class of the main module, a bare base class included.
class UploadSlots(locks.SemaphoreHolder):
    """One instance per user (named ``uploads:<user>``): the places of that user's uploads."""


MAX_UPLOAD_MS = 10 * 60_000


def _uploads(env):
    # Opened per request: opening checks the options and makes no call.
    limit = int(getattr(env, "UPLOADS_PER_USER", "3"))
    return semaphore(env.UPLOAD_SLOTS, "uploads", limit=limit, ttl=30, wait=10)  # seconds


async def run_upload(user, work_ms, permit):
    """The upload itself. This example only waits ``work_ms``, stopping early if
    the place is lost; a real Worker streams the file to storage here."""
    left = work_ms
    while left > 0 and not permit.lost():
        step = min(left, 1_000)
        await asyncio.sleep(step / 1000)
        left -= step


def _attempts_queue(env, ctx):
    """JOBS_RUN_IN: "queue" (the default) runs each attempt in the
    JOB_ATTEMPTS queue's consumer (Default.queue), billed by CPU while it
    awaits its work and its webhook, the shard asleep until the consumer
    reports; "shard" runs it inside the shard, which bills every second
    the attempt takes (docs/jobs.md, which to pick)."""
    where = str(getattr(env, "JOBS_RUN_IN", "queue")).lower()
    if where == "shard":
        return None
    if where != "queue":
        raise ValueError(f'JOBS_RUN_IN must be "queue" or "shard", not {where!r}')
    if getattr(env, "JOB_ATTEMPTS", None) is None:
        raise ValueError('JOBS_RUN_IN is "queue" but the Worker has no JOB_ATTEMPTS queue binding')
    return QueueHandoff(env.JOB_ATTEMPTS, ctx.id.toString(), run_within_ms=MAX_WORK_MS + WEBHOOK_TIMEOUT_S * 1000)


def _job_consumer(env):
    """What Default.queue runs: the attempts shards hand to JOB_ATTEMPTS, and
    the dead letters that end theirs as failed (wrangler.toml's queues)."""
    return JobConsumer({"run": lambda job: run_job(env, job)}, binding="JOB_SHARD",
                       dead_letter_queue="job-attempts-dead")


def _shard_count(env):
    return int(getattr(env, "SHARDS", "16"))


def _shard(env, job_id):
    return env.JOB_SHARD.getByName(f"shard-{zlib.crc32(job_id.encode()) % _shard_count(env)}")


async def _wake(stub):
    try:
        await stub.wake()
    except Exception as error:  # the next sweep calls it again
        log.warning("sweep: a shard did not answer: %r", error)


def _authorized(request, token):
    """A bearer token compared in constant time, so its bytes cannot be guessed one by one."""
    given = request.headers.get("authorization") or ""
    return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def _wants_html(request):
    """A browser's navigation: its Accept header names HTML (an API client's does not)."""
    return "text/html" in (request.headers.get("accept") or "")


MAX_BODY_CHARS = 65_536  # a job's, with the largest payload and url and room for whitespace
_JSON_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


async def _json_object(request):
    """The body as a JSON object, or ValueError. It is read as text and parsed
    here: workerd hands ``fetch`` the JavaScript Request, whose own ``json()``
    fails with a JavaScript error, not a ValueError. Its nesting is measured
    before it is parsed (a parser nests a call per level: 1,200 levels
    would exhaust the stack), and it must fit a job's payload."""
    text = await request.text()
    if len(text) > MAX_BODY_CHARS:
        raise ValueError(f"the body must be at most {MAX_BODY_CHARS} characters")
    if _nesting(text) > MAX_PAYLOAD_DEPTH + 1:  # the payload sits in the job's object
        raise ValueError(f"payload must nest at most {MAX_PAYLOAD_DEPTH} arrays or objects deep")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def _nesting(text):
    """How deep arrays and objects nest in JSON text (outside its strings), counted in one pass."""
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", _JSON_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _refusal(error):
    """The 400 for input refused: what is wrong, the field first (every check names it)."""
    return Response.json({"error": str(error)}, status=400)


class Default(WorkerEntrypoint):
    """Other Workers call these methods over a service binding; HTTP serves the same."""

    async def add(self, counter, tally, amount):
        # Check here too: a bad value gets a clear error before any call is made.
        stub = self.env.COUNTER.getByName(_name(counter, "counter"))
        return await stub.add(_name(tally, "tally"), _amount(amount))

    async def total(self, tally):
        return await self.env.TALLY.getByName(_name(tally, "tally")).total()

    async def account_usage(self, account):
        return await self.env.ACCOUNT_LIMIT.getByName(_name(account, "account")).usage()

    async def submit_job(self, job):
        job = _job(job)
        return await _shard(self.env, job["id"]).submit(job)

    async def job_status(self, job_id):
        return await _shard(self.env, _name(job_id, "id")).status(job_id)

    async def queue(self, batch, env=None, ctx=None):
        """The consumer of the job-attempts queue (and of its dead letters):
        runs each attempt a shard handed over, and reports it to that shard."""
        await _job_consumer(self.env).handle(batch, self.env)

    async def scheduled(self, controller, env=None, ctx=None):
        """The sweep (a Cron Trigger): every shard is called once. A shard
        whose alarm is in place answers with nothing written; one whose alarm
        the runtime gave up on sets it again. One request per shard per sweep."""
        await asyncio.gather(*(_wake(self.env.JOB_SHARD.getByName(f"shard-{n}"))
                               for n in range(_shard_count(self.env))))

    async def upload(self, user, work_ms=0):
        """Run one upload of ``user`` inside one of the user's places."""
        user = _name(user, "user")
        if not _integer_in(work_ms, 0, MAX_UPLOAD_MS):
            raise ValueError(f"work_ms must be an integer from 0 to {MAX_UPLOAD_MS}")
        try:
            async with _uploads(self.env).hold(user) as permit:
                await run_upload(user, work_ms, permit)
        except WaitTimeout:
            return {"status": "busy"}
        except PlaceLost as lost:
            return {"status": "interrupted", "reason": lost.reason}
        return {"status": "uploaded"}

    async def _operator_page(self, request, kind, name):
        """``GET /accounts/{id}`` or ``/jobs/{id}`` asked for as HTML: the
        bearer token, or the browser's sign-in (see operator_pages)."""
        token = getattr(self.env, "API_TOKEN", None)
        if not _authorized(request, token):
            access = operator_pages.browser_access(request, token)
            if access is False:
                return operator_pages.signed_out_page()
            if access is not True:
                return access  # the redirect that signs the browser in
        try:
            if kind == "accounts":
                return operator_pages.account_page(name, await self.account_usage(name))
            status = await self.job_status(name)
            waiting = (await self.account_usage(status["key"]))["waiting"] if status["state"] == "queued" else []
            return operator_pages.job_page(name, status, waiting)
        except ValueError as error:
            return operator_pages.error_page(400, str(error))

    async def fetch(self, request):
        try:
            parts = operator_pages.path_segments(request.url)  # each percent-decoded once
        except ValueError as error:
            return _refusal(error)
        if request.method == "GET" and len(parts) == 2 and parts[0] in ("accounts", "jobs") and _wants_html(request):
            return await self._operator_page(request, parts[0], parts[1])
        if not _authorized(request, getattr(self.env, "API_TOKEN", None)):
            return Response.json({"error": "unauthorized"}, status=401)
        try:
            if request.method == "POST" and len(parts) == 3 and parts[::2] == ["counters", "add"]:
                body = await _json_object(request)
                value = await self.add(parts[1], body.get("tally"), body.get("amount"))
                return Response.json({"count": value})
            if request.method == "GET" and len(parts) == 2 and parts[0] == "tallies":
                return Response.json({"total": await self.total(parts[1])})
            if request.method == "POST" and parts == ["jobs"]:
                return Response.json(await self.submit_job(await _json_object(request)), status=202)
            if request.method == "GET" and len(parts) == 2 and parts[0] == "jobs":
                return Response.json(await self.job_status(parts[1]))
            if request.method == "GET" and len(parts) == 3 and parts[::2] == ["accounts", "usage"]:
                return Response.json(await self.account_usage(parts[1]))
            if request.method == "POST" and len(parts) == 3 and parts[::2] == ["users", "uploads"]:
                body = await _json_object(request)
                result = await self.upload(parts[1], body.get("work_ms", 0))
                status = {"uploaded": 200, "busy": 429}.get(result["status"], 503)
                return Response.json(result, status=status)
        except ValueError as error:
            return _refusal(error)
        return Response.json({"error": "not found"}, status=404)
