"""The benchmark's measures, by hand, and the benchmark itself on a small workload."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from bench.measure import (
    Ledger,
    awake_dollars_per_million,
    awake_split,
    busy_share,
    dollars_per_million,
    makespan,
    out_of_order_share,
)
from bench.rates import achieved_per_period, most_in_any_window, start_delays_ms, waiting_ms, windows_over
from bench.workload import arrivals
from support import ROOT


def ledger(*jobs):
    """jobs: (id, account, work_ms, submitted, started, ended)."""
    book = Ledger()
    for job_id, account, work, submitted, _started, _ended in jobs:
        book.submitted(job_id, account, work, submitted)
    for job_id, _, _, _, started, ended in sorted(jobs, key=lambda j: j[4]):
        book.started(job_id, started)
        book.ended(job_id, ended)
    return book


def test_busy_share_counts_idle_permits_only_while_jobs_wait():
    # Limit 1: a runs 0-10; b waits from 0 to 12 (idle 10-12), then runs; nothing waits after 12.
    book = ledger(("a", "x", 10, 0, 0, 10), ("b", "x", 8, 0, 12, 20))
    assert busy_share(book, {"x": 1}) == (pytest.approx(10 / 12), {"x": pytest.approx(10 / 12)})
    # With a limit of 2, one running of two is half busy while b waits.
    assert busy_share(book, {"x": 2})[0] == pytest.approx(0.5 * 10 / 12)


def test_out_of_order_share_counts_starts_ahead_of_an_older_waiting_job():
    book = ledger(("old", "x", 5, 0, 10, 15), ("new", "x", 5, 1, 2, 7), ("other", "y", 5, 0, 20, 25))
    assert out_of_order_share(book) == pytest.approx(1 / 3)


def test_starts_a_moment_apart_count_as_one_decision_when_asked():
    # "new" started 3 ms before "old", which had waited longer: late, unless starts 100 ms apart are together.
    book = ledger(("old", "x", 5, 0, 10_003, 20_000), ("new", "x", 5, 5_000, 10_000, 20_000))
    assert out_of_order_share(book) == pytest.approx(1 / 2)
    assert out_of_order_share(book, slack_ms=2_000) == pytest.approx(1 / 2)
    assert out_of_order_share(book, slack_ms=2_000, together_ms=100) == 0.0
    assert out_of_order_share(book, slack_ms=6_000) == 0.0  # older by less than the slack


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=40),
       st.sampled_from([0, 5]), st.sampled_from([0, 3]))
def test_out_of_order_share_is_the_count_of_every_pair(jobs, slack, together):
    book = ledger(*((f"j{i}", "x", 1, sub, sub + wait, sub + wait + 1) for i, (sub, wait) in enumerate(jobs)))
    late = sum(any(book.submitted_at[i] < book.submitted_at[j] - slack
                   and book.started_at[i] > book.started_at[j] + together for i in book.started_at)
               for j in book.started_at)
    assert out_of_order_share(book, slack, together) == pytest.approx(late / max(len(jobs), 1))


def test_makespan_and_its_lower_bound():
    book = ledger(("a", "x", 10, 0, 0, 10), ("b", "x", 10, 0, 10, 22), ("c", "y", 4, 30, 31, 35))
    # x: 20 ms of work at a limit of 1; y: arrives at 30 and works 4.
    assert makespan(book, {"x": 1, "y": 1}) == (35, 34)


def test_dollars_per_million_jobs():
    assert dollars_per_million({"rows_written": 10, "rows_read": 1_000, "requests": 20}, 1) == pytest.approx(
        10 * 1.0 + 1_000 * 0.001 + 20 * 0.15)


def test_awake_time_splits_into_the_jobs_own_run_and_coordination():
    book = Ledger()
    for job_id, start, end in (("a", 10_000, 20_000), ("b", 15_000, 30_000), ("c", 40_000, 45_000)):
        book.submitted(job_id, "acct", end - start, 0)
        book.started(job_id, start, where="Shard:s1" if job_id != "c" else "Shard:s2")
        book.ended(job_id, end)
    awake = {"Shard:s1": [(5.0, 35.0)], "Shard:s2": [(40.0, 41.0), (44.0, 50.0)], "Holder:h": [(0.0, 60.0)]}
    inside, coordinating = awake_split(awake, book, lambda ms: ms / 1000)
    # s1 ran work 10..30 within its 30 s awake; s2 ran 40..45, awake for 2 s of it; the holder ran none.
    assert inside == pytest.approx(20 + 2)
    assert coordinating == pytest.approx((30 - 20) + (7 - 2) + 60)
    assert awake_dollars_per_million(1_000_000 / 0.128, 1_000_000) == pytest.approx(12.50)  # a GB-s a job


def test_the_same_seed_gives_the_same_arrivals():
    assert arrivals(3, 50, ["a", "b"]) == arrivals(3, 50, ["a", "b"]) != arrivals(4, 50, ["a", "b"])
    assert all(100 <= a.job["work_ms"] <= 2_000 for a in arrivals(3, 50, ["a"], short=True))


def test_the_benchmark_runs_every_system_on_one_workload_within_the_limits(tmp_path):
    plot = tmp_path / "plot.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_vs_naive.py"), "--jobs", "40",
                           "--shards", "4", "--json", "--plot", str(plot)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2_000:]
    rows = json.loads(done.stdout)
    assert [r["system"] for r in rows] == ["grants", "grants, jobs in the shard", "strict leases", "under leases",
                                          "over leases", "grants, requests held", "naive, polling every 5 s",
                                          "naive, polling every 1 s"]
    for row in rows:
        assert row["admitted"] == 40 and row["run_twice_at_once"] == 0 and not any(row["over_limit"].values())
        assert 0 < row["busy_while_waiting"] <= 1 and row["rows_written_per_job"] > 0
        assert row["makespan_s"] >= row["makespan_bound_s"]
        assert row["all_in_dollars_per_million_jobs"] >= row["coordination_dollars_per_million_jobs"] >= (
            row["dollars_per_million_jobs"])
    by_system = {row["system"]: row for row in rows}
    # A job run by the queue's consumer keeps no object awake: its shard sleeps while the
    # consumer awaits its work, and the consumer's requests and the queue's operations are
    # billed instead. Run in its shard, the job keeps the shard awake, as the naive Worker's do.
    for name in ("grants", "strict leases", "under leases", "over leases"):
        assert by_system[name]["awake_in_jobs_s_per_job"] == 0, name
        assert by_system[name]["workers_and_queues_dollars_per_million_jobs"] > 0, name
    for name in ("grants, jobs in the shard", "grants, requests held", "naive, polling every 5 s"):
        assert by_system[name]["awake_in_jobs_s_per_job"] > 0, name
    # While jobs wait, no object of the example is awake, where a request held open keeps both
    # its shard and its holder awake.
    assert all(row["awake_coordinating_s_per_job"] < 0.2 for row in rows[:5])
    held = by_system["grants, requests held"]
    assert held["awake_coordinating_s_per_job"] > 1 and held["coordination_dollars_per_million_jobs"] > (
        held["dollars_per_million_jobs"])
    assert by_system["naive, polling every 5 s"]["awake_coordinating_s_per_job"] == 0
    # Polling more often costs more requests: the baseline behaves as described.
    assert by_system["naive, polling every 1 s"]["requests_per_job"] > by_system["naive, polling every 5 s"][
        "requests_per_job"]
    assert plot.stat().st_size > 10_000


def test_the_tree_benchmark_prints_one_object_per_tree_scale_and_a_plot(tmp_path):
    plot = tmp_path / "rates.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tree.py"), "--scales", "400",
                           "--limit", "100", "--json", "--plot", str(plot)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2_000:]  # the script fails itself if work ran above the limit
    rows = json.loads(done.stdout)
    keys = {"clients", "objects", "peak_requests_per_s_per_object", "busy_while_waiting", "out_of_order_share",
            "rows_written_per_admission", "requests_per_admission", "awake_s_per_admission", "max_awake_share"}
    assert len(rows) == 1 and keys <= set(rows[0]) and keys <= set(rows[0]["single"])
    tree, single = rows[0], rows[0]["single"]
    assert (tree["clients"], tree["objects"], single["objects"]) == (400, 3, 1)
    assert 0.5 < tree["busy_while_waiting"] <= 1 and tree["rows_written_per_admission"] > 0
    # The clients can be called: no holder of the tree is awake while work waits (every beat runs on
    # the alarm); one holder waits in memory for a round due within a second.
    assert tree["max_awake_share"] < 0.1 < single["max_awake_share"] <= 1
    assert plot.stat().st_size > 10_000


def test_the_progress_bar_writes_plain_lines_when_stderr_is_no_terminal():
    import io

    from bench.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    piped, terminal = io.StringIO(), Terminal()
    for stream in (piped, terminal):
        bar = Progress(1_000, stream=stream)
        for done in range(1_001):
            bar.show(done, f"{done}/1000")
        bar.note("seed 3 failed")
        bar.end()
    assert "\r" not in piped.getvalue()
    assert len(piped.getvalue().splitlines()) == 12  # each tenth, the end, and the note
    assert terminal.getvalue().count("\r") == 1_002  # redrawn in place


def test_the_lease_benchmark_measures_latency_and_work_while_the_holder_is_down():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_leases.py"), "--jobs", "30",
                           "--outage-s", "30", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2_000:]  # the script fails itself if work ran above its ceiling
    rows = {r["system"]: r for r in json.loads(done.stdout)}
    assert list(rows) == ["grants", "strict leases", "under leases", "over leases"]
    grants, strict = rows["grants"], rows["strict leases"]
    assert all(r["admitted"] == 30 and r["max_running"] <= r["ceiling"] for r in rows.values())
    # A grant needs the holder, whose round runs as the request comes (the
    # holder answers at once: nothing is held); a drawn lease permit needs neither.
    assert grants["admitted_from_a_lease"] == 0 < strict["admitted_from_a_lease"]
    assert grants["admitted_while_down"] == 0 < grants["submitted_while_down"]
    assert strict["admission_p50_ms"] <= 10 and strict["admitted_while_down"] > 0


def test_the_fairness_benchmark_prints_one_object_per_policy_and_a_plot(tmp_path):
    plot = tmp_path / "shares.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_fairness.py"), "--quick", "--json",
                           "--plot", str(plot)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2_000:]  # the script fails itself if work ran above the limit
    rows = {r["policy"]: r for r in json.loads(done.stdout)}
    assert list(rows) == ["oldest", "weighted", "floors", "priorities"]
    assert all({"share_error_points", "small_p99_over_alone", "busy_while_waiting"} <= set(r) for r in rows.values())
    # Oldest first serves the flood's older backlog; the weighted split keeps each tenant near its share.
    assert rows["weighted"]["share_error_points"] < 5 < rows["oldest"]["share_error_points"]
    assert rows["weighted"]["small_p99_over_alone"] < rows["oldest"]["small_p99_over_alone"]
    # A floor is reached within a job length (20 to 80 s here) of the moment a tenant is short of it.
    assert rows["floors"]["floor_reached_within_s"] < 20 < rows["oldest"]["floor_reached_within_s"]
    assert plot.stat().st_size > 10_000


# -- the start rate's measures, by hand, and its benchmark on a small flood -----------------

def test_the_most_starts_in_a_window_counts_half_open_windows():
    assert most_in_any_window([0, 10, 20, 30], 20) == 2  # [10, 30) holds 10 and 20; 30 is outside
    assert most_in_any_window([0, 10, 19.9, 30], 20) == 3
    assert windows_over([0, 10, 19.9, 30], 20, 2) == 1  # the window ending at 19.9
    assert most_in_any_window([], 20) == 0


def test_the_rate_achieved_counts_starts_while_work_waited():
    # Two jobs wait from 0; one starts at 10, the other at 20: two starts in 20 ms of waiting.
    submitted, started = {"a": 0, "b": 0, "c": 50}, {"a": 10, "b": 20, "c": 50}
    assert achieved_per_period(submitted, started, 20) == pytest.approx(2.0)
    assert waiting_ms(submitted, started) == 20


def test_a_start_is_late_by_how_long_after_the_rate_allowed_it():
    # Limit 1 per 10 ms: b waited from 0 and could start at 10 (a started at 0); it started at 13.
    submitted, started = {"a": 0, "b": 0, "c": 30}, {"a": 0, "b": 13, "c": 30}
    assert start_delays_ms(submitted, started, 1, 10) == [3]  # c came after its time: no delay of the rate's


def test_the_rate_benchmark_keeps_every_window_and_leaks_nothing():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_rate.py"), "--minutes", "0.5",
                           "--rate", "20/min", "--shards", "4", "--json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2_000:]
    rows = {row["run"]: row for row in json.loads(done.stdout)}
    assert rows["rate"]["windows_over"] == rows["both"]["windows_over"] == 0
    assert rows["rate"]["max_in_any_window"] == 20 and rows["both"]["max_running"] <= 2
    assert rows["no rate"]["max_in_any_window"] > 20  # the flood, unthrottled
    assert all(row["leaked_permits"] == 0 and row["all_done"] for row in rows.values())
    assert rows["rate"]["busy_while_waiting"] > 0.9
