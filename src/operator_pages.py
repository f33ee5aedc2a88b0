"""The example Worker's pages for operators: an account's budget and a job's state, as HTML.

Lives here: rendering the replies of ``account_usage`` and ``job_status``
as small self-contained pages (inline CSS, no script, no external asset,
every value escaped), and how a browser signs in to them.
Must not know: where the figures come from; ``entry.Default`` fetches them.

A browser cannot send the bearer token on a plain navigation, so an operator
opens a page once with ``?token=<API_TOKEN>``: the Worker checks it in
constant time and redirects to the same address without it, setting a
cookie. The cookie holds a key derived from the token (an HMAC), not the
token, and opens these read-only pages only, never the JSON routes: a
leaked cookie reads figures and changes nothing. The token leaves the
address bar, history and logs at once; the pages refer nobody anywhere.
Every address they give (that redirect, their links) is a path on this
site made by ``href``: one ``/`` and the segments percent-encoded, which
``path_segments`` decodes exactly once.
"""

import hashlib
import hmac
import json
import re
import time
from html import escape
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from workers import Response

REFRESH_S = 5
COOKIE = "durability_operator"
COOKIE_MAX_AGE_S = 12 * 3600
HEADERS = {
    "content-type": "text/html; charset=utf-8",
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    # Inline styles only: nothing is fetched, nothing runs, no site frames the page.
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
}

GROUP_COLUMNS = ["workflow", "in use", "reserved", "lease footprint", "outstanding", "its limit", "its start rate"]
WAITING_COLUMNS = ["workflow", "jobs waiting", "queues", "reason"]
SHARE_COLUMNS = ["key", "holds", "share of the limit", "weight", "its weight's share", "floor", "priority",
                 "jobs waiting"]
POLICIES = {
    "oldest_first": "oldest first: the oldest waiting job anywhere in the account goes first",
    "fair_share": "fair share: floors, then priority classes, then room by weight (oldest first within a key)",
    "oldest_first_fallback": "oldest first for now: a fair-share callback failed (see ACCOUNT_FAIR_SHARE)",
}
REASONS = {
    "limit": "the account's limit is reached",
    "group_limit": "the workflow's own limit is reached",
    "not_permitted": "the holder does not permit this client (can_grant)",
    "limit_resolution_error": "the limit could not be read (see ACCOUNT_LIMITS and WORKFLOW_LIMITS)",
    "rate": "the account's start rate is reached: more start once its window allows (ACCOUNT_RATE)",
}

STYLE = """
body{margin:0;background:#f4f5f7;color:#1d2330;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:60rem;margin:0 auto;padding:1.5rem 1.25rem 2.5rem}
header{display:flex;justify-content:space-between;align-items:baseline;gap:1rem;flex-wrap:wrap}
h1{font-size:1.45rem;margin:0 0 .75rem}h2{font-size:1.05rem;margin:1.75rem 0 .6rem}
h1 code{font-size:1.3rem;background:#e3e7ed;padding:.05rem .4rem;border-radius:5px}
.muted{color:#5f6b7a;font-size:.85rem}code{font:13px ui-monospace,Menlo,Consolas,monospace}
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:.75rem;margin:1rem 0 0}
@media (max-width:40rem){.cards{grid-template-columns:repeat(2,1fr)}}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:.7rem .9rem;margin:0}
.card dt{color:#5f6b7a;font-size:.8rem;text-transform:uppercase;letter-spacing:.04em}
.card dd{margin:.15rem 0 0;font-size:1.6rem;font-weight:600;font-variant-numeric:tabular-nums}
.meter{height:.6rem;background:#e3e7ed;border-radius:4px;overflow:hidden;margin:.9rem 0 .3rem}
.meter span{display:block;height:100%;background:#2f6fde}.meter.full span{background:#d9534f}
table{width:100%;border-collapse:collapse;background:#fff;border:1px solid #dde1e7;border-radius:8px}
th,td{text-align:left;padding:.5rem .75rem;border-bottom:1px solid #eceff3}
th{font-size:.78rem;text-transform:uppercase;letter-spacing:.04em;color:#5f6b7a;font-weight:600}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}tr:last-child td{border-bottom:0}
.empty{background:#fff;border:1px dashed #cfd5dd;border-radius:8px;padding:.8rem 1rem;color:#5f6b7a}
.badge{display:inline-block;padding:.1rem .55rem;border-radius:999px;font-size:.85rem;font-weight:600;
background:#e3e7ed}
.badge.admitted,.badge.completed,.badge.released{background:#dcf3e4;color:#17603a}
.badge.queued,.badge.claiming,.badge.pending{background:#fff1d6;color:#7a4b00}
.badge.failed,.badge.not_found{background:#fbe1e0;color:#8f1f1b}
pre{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:.75rem;overflow:auto}
a{color:#2f6fde}table.fields th{width:15rem}
"""


_SEPARATORS = re.compile(r"[/\\]")  # a browser reads a backslash in an http(s) path as a slash
_DOT, _DOT_DOT = {"", ".", "%2e"}, {"..", ".%2e", "%2e.", "%2e%2e"}  # (lowercased: %2E is a dot too)


def path_segments(url):
    """The path of ``url`` as its segments, each percent-decoded exactly once,
    after the dot segments are resolved as a browser resolves them (a
    ``..`` takes the segment before it away; empty and ``.`` segments go).
    An id holding ``/`` or ``?`` arrives encoded (``%2F``, ``%3F``) and
    comes back whole. ValueError if a segment is not UTF-8 once decoded."""
    segments = []
    for raw in _SEPARATORS.split(urlsplit(url).path):
        if raw.lower() in _DOT:
            continue
        if raw.lower() in _DOT_DOT:
            segments = segments[:-1]
            continue
        try:
            segments.append(unquote(raw, errors="strict"))
        except UnicodeDecodeError:
            raise ValueError("the path must be UTF-8 once percent-decoded") from None
    return segments


def href(*segments):
    """The path of ``segments`` on this site: one ``/``, then each segment
    percent-encoded whole (a ``/`` or ``\\`` in it too), so that no browser
    can read it as another host, and ``path_segments`` reads it back."""
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


def _page(title, body, status=200, refresh=True):
    refresh_tag = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time()))
    note = f"as of {stamp}" + (f" · refreshes every {REFRESH_S} s" if refresh else "")
    html = (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        f"{refresh_tag}<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}<p class=\"muted\" id=\"as-of\">{escape(note)}</p></main></body></html>"
    )
    return Response(html, status=status, headers=HEADERS)


def _figure(label, name, value):
    shown = "—" if value is None else value
    return f'<div class="card"><dt>{escape(label)}</dt><dd data-figure="{escape(name)}">{escape(str(shown))}</dd></div>'


def _cell(name, value, numeric=True):
    shown = "—" if value is None else value
    css = ' class="n"' if numeric else ""
    return f'<td{css} data-field="{escape(name)}">{escape(str(shown))}</td>'


def _table(head, rows, empty, numeric):
    """A table; ``numeric`` names the columns of numbers, set to the right."""
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    header = "".join(f'<th class="n">{escape(h)}</th>' if h in numeric else f"<th>{escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _meter(outstanding, ceiling):
    if not ceiling:
        return ""
    share = min(100, round(100 * outstanding / ceiling))
    full = " full" if outstanding >= ceiling else ""
    return (f'<div class="meter{full}" title="{share}%"><span style="width:{share}%"></span></div>'
            f'<p class="muted">{escape(str(outstanding))} of {escape(str(ceiling))} permits outstanding</p>')


def account_page(account, usage):
    """The account's budget: limit, ceiling, permits out, per group, and what waits and why."""
    figures = [("Limit", "limit", usage["limit"]), ("Ceiling", "ceiling", usage["ceiling"]),
               ("Outstanding", "outstanding", usage["outstanding"]),
               ("Lease footprint", "leaseFootprint", usage["leaseFootprint"]),
               ("Retired footprint", "retiredFootprint", usage["retiredFootprint"]),
               ("Grants", "grants", usage["grants"]), ("Leases", "leases", usage["leases"]),
               ("Jobs waiting", "waiting", sum(entry["waiting"] for entry in usage.get("waiting", [])))]
    groups = [
        f'<tr data-group="{escape(group)}"><td>{escape(group)}</td>'
        + _cell("inUse", row["inUse"]) + _cell("reserved", row["reserved"])
        + _cell("leaseFootprint", row["leaseFootprint"]) + _cell("outstanding", row["outstanding"])
        + _cell("limit", row["limit"]) + _cell("rate", _rate_text(row.get("rate")), numeric=False) + "</tr>"
        for group, row in sorted(usage["groups"].items())
    ]
    waiting = [
        f'<tr data-waiting="{escape(entry["group"])}"><td>{escape(entry["group"])}</td>'
        + _cell("waiting", entry["waiting"]) + _cell("clients", entry["clients"])
        + f'<td data-field="reason"><code>{escape(entry["reason"])}</code> '
        + f'{escape(REASONS.get(entry["reason"], ""))}</td></tr>'
        for entry in usage.get("waiting", [])
    ]
    body = (
        f'<header><h1>Account <code>{escape(account)}</code></h1>'
        '<span class="muted">concurrency budget</span></header>'
        + _meter(usage["outstanding"], usage["ceiling"])
        + f'<dl class="cards">{"".join(_figure(*figure) for figure in figures)}</dl>'
        + "<h2>Workflows holding permits</h2>"
        + _table(GROUP_COLUMNS, groups, "No workflow holds a permit.", GROUP_COLUMNS[1:])
        + "<h2>Waiting, and why</h2>"
        + _table(WAITING_COLUMNS, waiting, "Nothing waits.", WAITING_COLUMNS[1:3])
        + _sharing(usage)
        + _rate(usage.get("rate"))
    )
    return _page(f"Account {account}", body)


def _rate_text(rate):
    """A group's own start rate, in a cell: its limit per period and its window now."""
    if not rate:
        return None
    return f'{rate["limit"]} per {rate["periodMs"] / 1000:g} s, {rate["startsInWindow"]} in the window'


def _rate(rate):
    """The start rate next to the limit: its window now, and when the next job may start."""
    if not rate:
        return ""
    burst = f', burst {rate["burst"]}' if rate["burst"] else ""
    next_at = rate["nextStartAt"]
    figures = [("Starts in the window", "startsInWindow", rate["startsInWindow"]),
               ("May start now", "room", rate["room"]),
               ("Next start at", "nextStartAt", None if next_at is None else _utc(next_at))]
    return (f'<h2>Start rate</h2><p data-field="rate">at most <strong>{rate["limit"]}</strong> starts '
            f'per {rate["periodMs"] / 1000:g} s{escape(burst)}</p>'
            f'<dl class="cards">{"".join(_figure(*figure) for figure in figures)}</dl>')


def _utc(epoch_ms):
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_ms / 1000))


def _percent(part, whole):
    return f"{100 * part / whole:.1f}%" if whole else None


def _sharing(usage):
    """How the limit is shared: the policy, and each key's holding against its weight and floor."""
    policy = usage.get("policy", "oldest_first")
    shares = usage.get("shares", {})
    total_weight = sum(row["weight"] for row in shares.values())
    rows = [
        f'<tr data-share="{escape(key)}"><td>{escape(key)}</td>' + _cell("held", row["held"])
        + _cell("share", _percent(row["held"], usage["limit"])) + _cell("weight", f'{row["weight"]:g}')
        + _cell("weightShare", _percent(row["weight"], total_weight)) + _cell("floor", row["floor"])
        + _cell("priority", row["priority"]) + _cell("waiting", row["waiting"]) + "</tr>"
        for key, row in sorted(shares.items())
    ]
    return (f'<h2>Sharing the limit</h2><p data-field="policy"><code>{escape(policy)}</code> '
            f'{escape(POLICIES.get(policy, ""))}</p>'
            + (_table(SHARE_COLUMNS, rows, "", SHARE_COLUMNS[1:]) if rows else ""))


def job_page(job_id, status, account_waiting=()):
    """A job: its state in the queue, why it waits, and what the job runner
    says of it. ``account_waiting``: the account's ``usage()["waiting"]``,
    for a queued job whose queue has not been told why yet (the holder keeps
    a waiting queue's request until it has news for it)."""
    state = status["state"]
    if state == "not_found":
        body = f'<h1>Job <code>{escape(job_id)}</code></h1><p class="empty">No job has this id.</p>'
        return _page(f"Job {job_id}", body, status=404, refresh=False)
    rows = [("State", "state", f'<span class="badge {escape(state)}">{escape(state)}</span>')]
    if status.get("key"):
        link = href("accounts", status["key"])
        rows.append(("Account", "account", f'<a href="{escape(link)}">{escape(status["key"])}</a>'))
    for label, name in (("Workflow", "group"), ("Admitted by", "via")):
        if status.get(name):
            rows.append((label, name, escape(str(status[name]))))
    blocked = status.get("blocked")
    if not blocked and state == "queued":
        blocked = next((entry for entry in account_waiting if entry["group"] == status.get("group")), None)
    if blocked:
        why = f'<code>{escape(blocked["reason"])}</code> {escape(REASONS.get(blocked["reason"], ""))}'
        rows.append(("Waits because", "reason", why))
        rows.append(("Waiting in its workflow", "waiting", escape(str(blocked["waiting"]))))
    job = status.get("job") or {"status": "not started"}
    runner = "not started" if job["status"] == "not_found" else job["status"]
    rows.append(("Job runner", "job", f'<span class="badge {escape(runner)}">{escape(runner)}</span>'))
    table = "".join(f'<tr><th>{escape(label)}</th><td data-field="{name}">{value}</td></tr>'
                    for label, name, value in rows)
    outcome = {key: value for key, value in job.items() if key != "status"}
    detail = f"<h2>Outcome</h2><pre>{escape(json.dumps(outcome, indent=2))}</pre>" if outcome else ""
    body = f'<h1>Job <code>{escape(job_id)}</code></h1><table class="fields">{table}</table>{detail}'
    return _page(f"Job {job_id}", body, refresh=job["status"] not in ("completed", "failed"))


def error_page(status, message):
    return _page("Error", f"<h1>{escape(str(status))}</h1><p>{escape(message)}</p>", status=status,
                 refresh=False)


def signed_out_page():
    body = ("<h1>Sign in</h1><p>Open this address once with <code>?token=&lt;API_TOKEN&gt;</code> "
            f"added; the browser then keeps a cookie for {COOKIE_MAX_AGE_S // 3600} hours.</p>")
    return _page("Sign in", body, status=401, refresh=False)


def _page_key(token):
    return hmac.new(token.encode(), b"durability operator pages", hashlib.sha256).hexdigest()


def _cookie(request):
    try:
        cookie = SimpleCookie(request.headers.get("cookie") or "")
    except CookieError:
        return ""
    return cookie[COOKIE].value if COOKIE in cookie else ""


def browser_access(request, token):
    """True when the request carries the pages' cookie; a redirect Response
    that sets it when the address carries the right ``?token=``; else False."""
    if not token:
        return False
    parts = urlsplit(request.url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = next((value for name, value in query if name == "token"), None)
    if given is not None:
        if not hmac.compare_digest(given.encode(), token.encode()):
            return False
        rest = urlencode([(name, value) for name, value in query if name != "token"])
        secure = "; Secure" if parts.scheme == "https" else ""
        cookie = (f"{COOKIE}={_page_key(token)}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; "
                  f"SameSite=Strict{secure}")
        # The same page on this site: a path that began "//" or "/\\" would
        # otherwise send the browser to another host, the token with it.
        location = href(*path_segments(request.url)) + (f"?{rest}" if rest else "")
        return Response("", status=303, headers={"location": location, "set-cookie": cookie,
                                                  "cache-control": "no-store", "referrer-policy": "no-referrer"})
    return hmac.compare_digest(_cookie(request).encode(), _page_key(token).encode())
