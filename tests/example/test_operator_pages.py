"""The example Worker's operator pages: HTML, sign-in, escaping; and in real Chromium against the local server.

The browser test writes its screenshots to build/artifacts/ (account-page.png,
job-page.png), which CI keeps. Without Chromium it skips, except under CI
(CI=true), where a missing Chromium fails.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from hypothesis import given, settings, strategies as st

from durability.testing import Runtime
from support import ROOT, example_runtime, example_worker_dir, http, serving

TOKEN = "t0ken"
ARTIFACTS = ROOT / "build" / "artifacts"
HTML = {"Accept": "text/html,application/xhtml+xml"}


class Figures(HTMLParser):
    """The values a page marks with ``data-figure`` and ``data-field``, by the row they are in."""

    def __init__(self, page):
        super().__init__()
        self.figures, self.rows, self._row, self._into = {}, {}, None, None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        kinds = [kind for kind in ("group", "waiting", "share") if f"data-{kind}" in attrs]
        if tag == "tr" and kinds:
            kind = kinds[0]
            self._row = self.rows.setdefault((kind, attrs.get(f"data-{kind}")), {})
        if "data-figure" in attrs:
            self._into = (self.figures, attrs["data-figure"])
        elif "data-field" in attrs:
            self._into = (self._row if self._row is not None else self.figures, attrs["data-field"])
            self._into[0][self._into[1]] = ""

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        if tag in ("td", "dd"):
            self._into = None

    def handle_data(self, data):
        if self._into is not None:
            target, name = self._into
            target[name] = (target.get(name, "") + " " + data).strip()


# -- in the embedded runtime: routes, sign-in, escaping ------------------------------

def _fetch(example, path, headers=None):
    async def go():
        response = await example.fetch(f"https://w.test{path}", headers=headers or {})
        return response.status, dict(response.headers.items()), await response.text()
    return example.run(go())


def test_pages_need_the_token_and_sign_a_browser_in_with_a_cookie_that_opens_pages_only(example):
    assert _fetch(example, "/accounts/acme", HTML)[0] == 401
    assert _fetch(example, "/accounts/acme?token=wrong", HTML)[0] == 401
    status, headers, _ = _fetch(example, "/accounts/acme?token=t0ken&x=1", HTML)
    assert status == 303 and headers["location"] == "/accounts/acme?x=1"
    cookie = headers["set-cookie"].split(";", 1)[0]
    assert TOKEN not in cookie and "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    assert "Secure" in headers["set-cookie"]  # the address was https
    status, headers, page = _fetch(example, "/accounts/acme", {**HTML, "Cookie": cookie})
    assert status == 200 and headers["content-type"].startswith("text/html") and "Account" in page
    assert "default-src 'none'" in headers["content-security-policy"]
    assert _fetch(example, "/accounts/acme", {**HTML, "Cookie": cookie + "0"})[0] == 401
    # The cookie reads pages; it is no API token.
    assert _fetch(example, "/accounts/acme/usage", {"Cookie": cookie})[0] == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert _fetch(example, "/accounts/acme", {**HTML, **bearer})[0] == 200
    assert _fetch(example, "/accounts/acme", bearer)[0] == 404  # HTML only: the JSON is at /usage


SIGN_IN = "token=t0ken"


@pytest.mark.parametrize(("path", "location"), [
    ("//accounts/acme", "/accounts/acme"),  # a browser reads "//accounts/..." as the host "accounts"
    ("///jobs/j1", "/jobs/j1"),
    ("/\\accounts/acme", "/accounts/acme"),  # and "/\\" as "//"
    ("/\\/jobs/j1", "/jobs/j1"),
    ("/accounts/%2F%2Fevil.test", "/accounts/%2F%2Fevil.test"),  # an encoded slash stays in its segment
    ("/accounts/%5C%5Cevil.test", "/accounts/%5C%5Cevil.test"),
    ("/jobs/%2f..%2fevil.test", "/jobs/%2F..%2Fevil.test"),
    ("/jobs/../accounts/acme", "/accounts/acme"),  # dot segments resolved as a browser resolves them
    ("//evil.test/../accounts/acme", "/accounts/acme"),
    ("/accounts/x/%2e%2E/acme/.", "/accounts/acme"),
    ("/accounts/job%20one", "/accounts/job%20one"),
])
def test_the_sign_in_redirect_is_a_path_on_this_site(example, path, location):
    status, headers, _ = _fetch(example, f"{path}?{SIGN_IN}", HTML)
    assert status == 303 and headers["location"] == location
    target = urljoin(f"https://w.test{path}", headers["location"])
    assert urlsplit(target).netloc == "w.test"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["", ".", "..", "%2e", "%2E.", "a", "\\", "%2F", "%5c", "%25", "evil.test",
                                 "é", "%C3%A9", " ", "?", "@", ":"]), max_size=8).map("/".join))
def test_every_path_the_pages_give_stays_on_this_site_and_reads_back_the_same(path):
    pages = _pages()
    segments = pages.path_segments(f"https://w.test/{path}")
    location = pages.href(*segments)
    assert location.startswith("/") and not location.startswith(("//", "/\\"))
    assert urlsplit(urljoin("https://w.test/x/", location)).netloc == "w.test"
    assert pages.path_segments(f"https://w.test{location}") == segments  # decoded exactly once


def test_a_page_links_with_the_encoded_form_and_the_link_opens_that_page(example):
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    job = {"id": "job one/1", "account": "acme corp/1", "work_ms": 600_000}
    example.run(example.call_entrypoint("submit_job", job))
    status, _, page = _fetch(example, "/jobs/job%20one%2F1", {**HTML, **bearer})
    assert status == 200 and 'href="/accounts/acme%20corp%2F1"' in page
    status, _, account = _fetch(example, "/accounts/acme%20corp%2F1", {**HTML, **bearer})
    assert status == 200 and "acme corp/1" in account


def _pages():
    """The example Worker's ``operator_pages`` module, as it loads it."""
    if "operator_pages" not in sys.modules:
        example_runtime().close()
    return sys.modules["operator_pages"]


def test_every_value_is_escaped_and_nothing_external_is_loaded(example):
    bearer = {**HTML, "Authorization": f"Bearer {TOKEN}"}
    status, _, page = _fetch(example, "/accounts/<img src=x onerror=alert(1)>", bearer)
    assert status == 200
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<script" not in page and "<link" not in page and "http" not in page.replace('http-equiv', '')
    status, _, page = _fetch(example, '/jobs/"><i>j', bearer)
    assert status == 404 and "<i>" not in page and "&quot;&gt;&lt;i&gt;j" in page


def test_the_account_page_shows_how_workflows_share_the_limit_against_their_weights_and_floors():
    fair = {"weights": {"report": 3}, "floors": {"export": 1}}
    with Runtime.from_wrangler(ROOT / "wrangler.toml", vars={"API_TOKEN": TOKEN, "ACCOUNT_CONCURRENCY": "4",
                                                             "ACCOUNT_FAIR_SHARE": json.dumps(fair)}) as example:
        async def scenario():
            for n in range(6):
                for workflow in ("report", "export"):
                    await example.call_entrypoint("submit_job", {"id": f"{workflow}-{n}", "account": "acme",
                                                                 "workflow": workflow, "work_ms": 600_000})
            await asyncio.sleep(5)

        example.run(scenario())
        status, _, page = _fetch(example, "/accounts/acme", {**HTML, "Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "Sharing the limit" in page
    figures = Figures(page)
    assert figures.figures["policy"].startswith("fair_share")
    report, export = figures.rows[("share", "report")], figures.rows[("share", "export")]
    assert (report["weight"], report["weightShare"], export["floor"]) == ("3", "75.0%", "1")
    assert (report["held"], export["held"]) == ("3", "1")  # 3:1 of 4, each with work waiting
    assert int(report["waiting"]) > 0 and int(export["waiting"]) > 0  # as their queues last told it


def test_the_account_page_shows_the_start_rate_and_that_jobs_wait_for_it():
    with Runtime.from_wrangler(ROOT / "wrangler.toml", vars={
            "API_TOKEN": TOKEN, "ACCOUNT_CONCURRENCY": "10", "ACCOUNT_RATE": "3/min",
            "WORKFLOW_RATES": json.dumps({"report": "2/min"})}) as example:
        async def scenario():
            for n in range(6):
                await example.call_entrypoint("submit_job", {"id": f"job-{n}", "account": "acme",
                                                             "workflow": "report", "work_ms": 600_000})
            await asyncio.sleep(5)

        example.run(scenario())
        status, _, page = _fetch(example, "/accounts/acme", {**HTML, "Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "Start rate" in page
    figures = Figures(page)
    assert " ".join(figures.figures["rate"].split()).startswith("at most 3 starts per 60 s")
    assert (figures.figures["startsInWindow"], figures.figures["room"]) == ("2", "1")  # the workflow's binds
    assert figures.rows[("group", "report")]["rate"] == "2 per 60 s, 2 in the window"
    assert figures.rows[("waiting", "report")]["reason"].startswith("rate")


# -- in Chromium, against the local server ---------------------------------------------

def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium is not installed, and CI must run the browser test (.ci/run installs it)")
        pytest.skip("Chromium is not installed (apt-get install -y chromium): the browser test needs it")
    return found


def _browse(chromium, profile: Path, url, *options):
    """Chromium, headless, one page: its stdout (the DOM with --dump-dom)."""
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", *options, url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _usage_once(url, ready):
    """The account's usage once ``ready(usage)`` holds and it has not changed
    for half a second (real time, bounded: rounds are 100 ms apart)."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    seen = []
    for _ in range(300):
        seen.append(json.loads(http(url + "/accounts/acme/usage", headers=auth)[2]))
        if ready(seen[-1]) and len(seen) >= 10 and all(usage == seen[-1] for usage in seen[-10:]):
            return seen[-1]
        time.sleep(0.05)
    pytest.fail(f"the account did not settle within 15 s: {seen[-1]}")


def _busy_account(url):
    """Two jobs of `report`, then four of `export` (its limit 2), on account
    acme (its limit 4), each running ten minutes: exports wait."""
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def submit(workflow, job_ids):
        for job_id in job_ids:
            job = {"id": job_id, "account": "acme", "workflow": workflow, "work_ms": 600_000}
            assert http(url + "/jobs", "POST", job, auth)[0] == 202

    submit("report", ["r1", "r2"])
    _usage_once(url, lambda usage: usage["outstanding"] == 2)  # the reports hold their permits first
    submit("export", ["e1", "e2", "e3", "e4"])
    return _usage_once(url, lambda usage: usage["outstanding"] == 4 and usage["waiting"])


def test_the_account_and_job_pages_in_chromium_show_what_the_json_route_gives(tmp_path):
    chromium = _chromium()
    config = example_worker_dir(tmp_path, TOKEN, ACCOUNT_LIMITS='{"acme": 4}', WORKFLOW_LIMITS='{"export": 2}')
    with serving(config) as server:
        usage = _busy_account(server.url)
        page = Figures(_browse(chromium, tmp_path / "a", f"{server.url}/accounts/acme?token={TOKEN}", "--dump-dom"))
        job = Figures(_browse(chromium, tmp_path / "b", f"{server.url}/jobs/e3?token={TOKEN}", "--dump-dom"))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for name, path in [("account-page.png", "/accounts/acme"), ("job-page.png", "/jobs/e3")]:
            (ARTIFACTS / name).unlink(missing_ok=True)
            _browse(chromium, tmp_path / name, f"{server.url}{path}?token={TOKEN}",
                    f"--screenshot={ARTIFACTS / name}", "--window-size=1100,760")
        after = json.loads(http(server.url + "/accounts/acme/usage", headers={"Authorization": f"Bearer {TOKEN}"})[2])
    assert after == usage  # the jobs run ten minutes: nothing moved while the browser looked
    for name in ("limit", "ceiling", "outstanding", "leaseFootprint", "retiredFootprint", "grants", "leases"):
        assert page.figures[name] == str(usage[name]), name
    assert page.figures["waiting"] == str(sum(entry["waiting"] for entry in usage["waiting"]))
    for group, row in usage["groups"].items():
        shown = page.rows[("group", group)]
        for field in ("inUse", "reserved", "leaseFootprint", "outstanding"):
            assert shown[field] == str(row[field]), (group, field)
        assert shown["limit"] == ("—" if row["limit"] is None else str(row["limit"]))
    [waiting] = usage["waiting"]
    shown = page.rows[("waiting", "export")]
    assert (shown["waiting"], shown["clients"]) == (str(waiting["waiting"]), str(waiting["clients"]))
    assert shown["reason"].startswith("group_limit")
    assert job.figures["state"] in ("queued", "claiming") and job.figures["group"] == "export"
    assert job.figures["reason"].startswith("group_limit")
    for name in ("account-page.png", "job-page.png"):
        assert (ARTIFACTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
