"""The simulation campaign: a fixed sample of its seeds, its checks against planted defects,
and the scenarios it found failing, shrunk and kept.

``scripts/campaign.py --seeds 2500`` is the full campaign (see
``docs/testing.md``); here CI runs 50 seeds of every mode.
"""

import json
import subprocess
import sys

import pytest

from campaign.checks import Truth, recovery_bound_ms, recovery_violations
from campaign.run import run
from campaign.scenario import MODES, Change, Job, Outage, Partition, Restart, Scenario, generate, smaller, with_plant
from campaign.shrink import as_pytest_case, shrink
from durability._common.sql import GrowingCounter
from support import ROOT

SAMPLE = 50


def test_a_fixed_sample_of_every_mode_passes_every_check():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "campaign.py"), "--seeds", str(SAMPLE), "--json"],
                          capture_output=True, text=True, timeout=1_800)
    summary = json.loads(done.stdout)
    assert [row["mode"] for row in summary] == list(MODES)
    for row in summary:
        assert row["runs"] == SAMPLE and row["steps_checked"] > SAMPLE * 20, row
        assert row["violations"] == 0, (row, done.stderr[-2_000:])
    assert done.returncode == 0


def test_a_seed_replays_exactly():
    first, again = run(generate(7, "strict")), run(generate(7, "strict"))
    assert (first.steps, first.virtual_ms) == (again.steps, again.virtual_ms)
    assert generate(7, "strict") == generate(7, "strict") != generate(8, "strict")


# -- each check catches a defect planted on purpose, and the shrinker reduces it ---------

@pytest.mark.parametrize("plant, invariants", [
    ("over_grant", {"issue", "limit"}),  # a holder that grants one permit too many
    ("double_report", {"accounting", "limit"}),  # a report applied twice frees its releases twice
    ("lost_release", {"leak"}),  # releases lost, and no finished() sweep to return them
    ("double_admit", {"exactly_once"}),  # admit() runs an item's work again
])
def test_a_planted_defect_is_found_within_the_sample_and_shrunk(plant, invariants):
    found = None
    for seed in range(SAMPLE):
        scenario = with_plant(generate(seed, "grants"), plant)
        if set(run(scenario).violations.counts) & invariants:
            found = scenario
            break
    assert found is not None, f"{plant} not found in {SAMPLE} seeds"

    def fails(candidate):
        return bool(set(run(candidate).violations.counts) & invariants)

    smallest, runs = shrink(found, fails, budget=25)
    assert smallest.size() < found.size() and fails(smallest)
    case = as_pytest_case(smallest, sorted(invariants))
    assert f"def test_campaign_grants_seed_{found.seed}_{plant}():" in case and "Scenario(" in case
    assert eval(smallest.to_literal()) == smallest  # the printed case builds the same scenario


def test_a_holder_that_lets_one_start_too_many_is_found_in_mode_rate():
    found = [seed for seed in range(SAMPLE) if "rate" in run(with_plant(generate(seed, "rate"), "over_rate")).violations.counts]
    assert found, f"over_rate not found in {SAMPLE} seeds"
    assert "rate" not in run(generate(found[0], "rate")).violations.counts  # and the seed passes without it


def test_a_consumer_that_runs_an_attempt_twice_at_once_is_found_in_mode_consumer():
    found = [seed for seed in range(10)
             if "run_in_permit" in run(with_plant(generate(seed, "consumer"), "consumer_overlap")).violations.counts]
    assert found, "consumer_overlap not found in 10 seeds"
    assert not run(generate(found[0], "consumer")).violations  # and the seed passes without it


def test_a_release_that_keeps_no_outcome_is_found_in_mode_consumer():
    # A job's outcome kept in its released item (records): a keeper that never
    # reads it back, where the runner wrote no row, leaves the job unreadable.
    found = [seed for seed in range(10)
             if "outcome" in run(with_plant(generate(seed, "consumer"), "lost_outcome")).violations.counts]
    assert found, "lost_outcome not found in 10 seeds"
    assert generate(found[0], "consumer").records
    assert not run(generate(found[0], "consumer")).violations  # and the seed passes without it


def test_the_shrinker_keeps_what_fails():
    scenario = generate(3, "grants")
    # "Fails" while two particular jobs remain: the shrinker must end with exactly those.
    wanted = set(scenario.jobs[2:4])

    smallest, _ = shrink(scenario, lambda s: wanted <= set(s.jobs))
    assert set(smallest.jobs) == wanted
    assert (smallest.faults, smallest.changes, smallest.partitions, smallest.latency_ms) == ((), (), (), 0.0)


# -- defects the campaign found, fixed; their shrunk scenarios kept -----------------------

def test_campaign_grants_seed_4():
    # An outbox version was reused within one instance: its counter started at
    # the first write, after the row a call in flight still named had been
    # deleted, so that call's late acknowledgement deleted a newer release
    # report. The holder kept a released permit charged for good (a leak).
    scenario = Scenario(
        seed=4, mode='grants', limits=(6, 2), shards=2,
        jobs=(Job(at_ms=19265.2, shard=1, key=0, group='wf1', ms=3000),
              Job(at_ms=19320.8, shard=0, key=1, group='wf0', ms=200),
              Job(at_ms=19521.1, shard=1, key=0, group='wf1', ms=1000, cancel_after_ms=7329.1),
              Job(at_ms=19561.2, shard=1, key=0, group='capped', ms=1000, cancel_after_ms=6656.2),
              Job(at_ms=22256.1, shard=1, key=1, group='wf1', ms=20000)),
        changes=(Change(at_ms=112814.7, kind='limit', key=1, value=3),),
        faults=(('lost_request', 0.041), ('evict', 0.072), ('crash_before_commit', 0.024)),
        partitions=(Partition(shard=1, at_ms=54409.9, ms=34507.5),))
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_a_growing_counter_stays_above_numbers_read_before_its_first_write():
    class Table:
        def __init__(self, versions):
            self.versions = set(versions)

        def one(self, query):
            return {"n": max(self.versions, default=None)}

    table = Table({1, 2})
    counter = GrowingCounter(table, "SELECT max(version) AS n ...")
    table.versions.clear()  # version 2 deleted, while a call in flight still holds it
    assert counter.next() == 3

def test_campaign_strict_seed_163():
    # The holder kept a request of a client over to later rounds (its long
    # poll, up to 50 s) though the reply listed a lease the client had never
    # heard of (its first reply was lost in a crash): the client could not
    # draw from its own lease, and the key's one permit sat idle until the
    # poll ended. A reply with news now goes out at once.
    scenario = Scenario(seed=163, mode='strict', limits=(6, 1), group_limits=(('capped', 2),), jobs=(Job(at_ms=7312.1, shard=1, key=1, group='wf0', ms=200), Job(at_ms=7643.4, shard=0, key=1, group='wf1', ms=200), Job(at_ms=9068.9, shard=2, key=0, group='wf1', ms=200), Job(at_ms=9452.6, shard=1, key=1, group='wf0', ms=3000), Job(at_ms=9484.6, shard=0, key=1, group='capped', ms=200), Job(at_ms=44777.6, shard=0, key=0, group='wf0', ms=1000), Job(at_ms=44839.4, shard=0, key=1, group='wf0', ms=1000), Job(at_ms=45043.7, shard=1, key=1, group='capped', ms=1000), Job(at_ms=45128.0, shard=2, key=1, group='wf0', ms=3000, cancel_after_ms=1553.3, fails=True), Job(at_ms=45489.5, shard=2, key=0, group='capped', ms=8000), Job(at_ms=45804.3, shard=2, key=1, group='wf1', ms=3000), Job(at_ms=57563.0, shard=0, key=0, group='wf1', ms=20000, cancel_after_ms=1246.0), Job(at_ms=57573.2, shard=1, key=0, group='capped', ms=1000, fails=True), Job(at_ms=57578.7, shard=1, key=1, group='wf1', ms=3000), Job(at_ms=57610.0, shard=1, key=1, group='capped', ms=1000), Job(at_ms=57781.2, shard=2, key=0, group='wf0', ms=20000), Job(at_ms=57854.4, shard=0, key=1, group='wf0', ms=1000), Job(at_ms=57968.7, shard=0, key=0, group='capped', ms=20000, fails=True), Job(at_ms=82339.6, shard=1, key=1, group='wf0', ms=200), Job(at_ms=92083.3, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=92128.9, shard=1, key=1, group='capped', ms=1000), Job(at_ms=92134.4, shard=2, key=1, group='wf1', ms=8000, fails=True)), changes=(Change(at_ms=44702.9, kind='group_limit', value='raise'),), faults=(('lost_request', 0.013), ('lost_reply', 0.064), ('duplicate', 0.327), ('evict', 0.011), ('crash_before_commit', 0.062), ('alarm_failure', 0.051), ('duplicate_alarm', 0.038)), latency_ms=80.0, partitions=(Partition(shard=1, at_ms=24915.6, ms=25949.8),))
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_strict_seed_88():
    # A shard that keeps no done item deleted its lease's first draw at its
    # release (heard by the holder), drew a second, and crashed: the new
    # instance, counting only the items left, reported one draw and none
    # released, and the holder, told one of one released, settled the lease
    # with the second running. Draws are numbered now (see lease_book).
    scenario = Scenario(seed=88, mode='strict', group_limits=(('capped', 1),), jobs=(Job(at_ms=27335.8, shard=2, key=0, group='wf1', ms=1000), Job(at_ms=35300.8, shard=1, key=0, group='wf1', ms=8000), Job(at_ms=35516.9, shard=2, key=0, group='wf1', ms=8000)), faults=(('lost_request', 0.021), ('duplicate', 0.045), ('crash_before_commit', 0.044), ('alarm_failure', 0.061)), latency_ms=20.0, permits_per_lease=3, keep_done=False)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_a_lease_the_client_never_heard_of_reaches_it_at_the_next_round():
    from support import holders_runtime

    def request(client, leases=()):
        return {"type": "request", "v": 1, "clientId": client, "wait": 50_000, "leases": True,
                "demand": [{"group": "g", "count": 1, "oldestAt": 0}, {"group": "h", "count": 1, "oldestAt": 1}],
                "grants": [],
                "leaseReports": [{"leaseId": i, "group": "g", "permits": 1, "drawn": 0, "released": 0}
                                 for i in leases]}

    with holders_runtime(seed=1) as runtime:
        runtime.module.CONFIG.update(limit=1, leases={"provisioning": {"mode": "strict"}, "permits_per_lease": 1,
                                                      "ttl_ms": 60_000})
        holder = runtime.env.HOLDER.getByName("holder")

        async def scenario():
            first = await holder.permits(request("a"))  # its reply is "lost": a never hears of the lease
            asked = runtime.now_ms()
            again = await holder.permits(request("a"))  # "h" is blocked: the holder could hold this
            waited = runtime.now_ms() - asked
            other = await holder.permits(request("b"))  # nothing new for b: it waits at the holder
            return first, again, waited, other, runtime.now_ms() - asked - waited

        first, again, waited, other, waited_after = runtime.run(scenario())
    assert [lease["leaseId"] for lease in again["leases"]] == [first["leases"][0]["leaseId"]]
    assert waited < 5_000  # one round, not the 50 s long poll
    assert waited_after > 40_000 and other["leases"] == []  # the long poll, as before


def test_campaign_grants_seed_15():
    # Every alarm run of a shard failed for three minutes, one job queued
    # there: the runtime tried seven times and gave up on the alarm, and the
    # job stayed queued for good, as nothing called the shard again. Now the
    # sweep calls it within a minute and it sets its alarm again.
    scenario = Scenario(seed=15, mode='grants', limits=(2,), group_limits=(('capped', 1),), shards=2,
                        jobs=(Job(at_ms=50126.5, shard=1, key=0, group='wf0', ms=1000),), permits_per_lease=4,
                        keep_done=False, outages=(Outage(kind='shard', index=1, at_ms=27333.5, ms=177027.4),))
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_a_cancel_that_meets_the_copy_a_retried_submit_queued_is_excused_not_a_durability_violation():
    # j1's submit failed with its shard as its item was written: the item ran
    # and went (no done item kept), the submit retried queued a copy under the
    # same id, and the cancel met the copy: cancelled, its id run once.
    outcome = run(generate(8195, "grants"))
    assert not outcome.violations, outcome.violations.first
    assert outcome.excused["durability: a submit retried after its item ran and went, then cancelled"] == 1


def test_campaign_over_seed_1900():
    # A shard's lease report reached its holder as a round granted the shard
    # a permit (its demand outlived the lease that served it). The grant came
    # new in that report's answer only, the lease part that sent it read the
    # leases alone, and the holder's call naming it was lost: the permit
    # stayed charged for good. Every sync's answer now has its grants read.
    scenario = Scenario(seed=1900, mode='over', limits=(2, 5), shards=4, jobs=(Job(at_ms=1332.1, shard=3, key=1, group='wf1', ms=1000), Job(at_ms=1362.0, shard=2, key=0, group='capped', ms=1000), Job(at_ms=1380.5, shard=3, key=0, group='capped', ms=200), Job(at_ms=1417.1, shard=2, key=0, group='capped', ms=20000), Job(at_ms=1455.0, shard=1, key=1, group='wf1', ms=200), Job(at_ms=4394.2, shard=3, key=0, group='capped', ms=20000), Job(at_ms=4474.1, shard=2, key=1, group='wf0', ms=8000), Job(at_ms=4479.8, shard=2, key=0, group='wf1', ms=20000), Job(at_ms=4637.9, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=10202.9, shard=0, key=1, group='capped', ms=3000), Job(at_ms=10565.7, shard=3, key=1, group='capped', ms=20000), Job(at_ms=34157.7, shard=0, key=0, group='capped', ms=8000), Job(at_ms=34286.5, shard=1, key=0, group='wf0', ms=8000), Job(at_ms=40477.3, shard=2, key=1, group='capped', ms=8000), Job(at_ms=40616.3, shard=3, key=1, group='wf0', ms=8000), Job(at_ms=40799.9, shard=3, key=1, group='wf0', ms=1000), Job(at_ms=40869.2, shard=1, key=0, group='wf0', ms=3000), Job(at_ms=40934.5, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=61514.4, shard=2, key=1, group='wf0', ms=1000)), faults=(('lost_request', 0.227), ('lost_reply', 0.07), ('duplicate', 0.036), ('evict', 0.028), ('duplicate_alarm', 0.014)), latency_ms=20.0, lose_releases=0.2, keep_done=False, outages=(Outage(kind='holder', index=1, at_ms=37644.3, ms=173954.1),), restarts=(Restart(key=1, at_ms=2361.9),), calls=True, call_faults=(('lost', 0.072), ('lost_reply', 0.093)))
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first

def test_campaign_grants_seed_20755():
    # A copy of a shard's request reached its holder after the shard had
    # used and released the grant the original's reply brought: the holder
    # granted the copy's demand again, in a reply nobody heard. Its call to
    # the silent shard was on an alarm the runtime gave up on during an
    # outage, and the shard, its work done, had nothing more to ask: the
    # permit stayed counted for good (over seed 20860 and under 21153 too).
    # The sweep now has each key that may hold grants, with nothing waiting,
    # ask its holder what it holds, which lists that grant: given back.
    scenario = Scenario(seed=20755, mode='grants', limits=(5,), group_limits=(('capped', 1),), jobs=(Job(at_ms=6198.0, shard=0, key=0, group='wf1', ms=8000), Job(at_ms=19047.9, shard=1, key=0, group='wf1', ms=8000), Job(at_ms=19479.2, shard=0, key=0, group='wf0', ms=8000), Job(at_ms=60201.7, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=60275.8, shard=0, key=0, group='wf1', ms=1000), Job(at_ms=60290.7, shard=2, key=0, group='wf0', ms=200), Job(at_ms=60336.6, shard=2, key=0, group='capped', ms=20000, fails=True), Job(at_ms=60351.4, shard=1, key=0, group='wf0', ms=20000), Job(at_ms=69489.7, shard=0, key=0, group='wf0', ms=8000, cancel_after_ms=6543.8), Job(at_ms=90625.4, shard=2, key=0, group='capped', ms=20000), Job(at_ms=90765.5, shard=2, key=0, group='capped', ms=20000, cancel_after_ms=7881.5), Job(at_ms=90821.1, shard=1, key=0, group='wf1', ms=8000, cancel_after_ms=968.5), Job(at_ms=90930.0, shard=1, key=0, group='capped', ms=1000), Job(at_ms=90997.9, shard=1, key=0, group='wf0', ms=200)), faults=(('duplicate', 0.243),), latency_ms=20.0, keep_done=False, outages=(Outage(kind='holder', index=0, at_ms=33933.5, ms=183146.2),), calls=True)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_3989():
    # A holder in the middle of a tree lent its only permit to a leaf for
    # work its round took as old as the line elsewhere; a reply of its
    # parent heard after that round named the same head, stuck behind that
    # very permit, and the leaf, told the line from it, owed the permit
    # back. The middle lent it again each round and never passed it up,
    # while older work under another branch waited for good. (Found once a
    # change of alarms moved the schedule; the middle now tells the line
    # its own round read. A later change of a tree's first rounds moved the
    # schedule again: this case passes without that fix now, which
    # test_a_holder_in_the_middle_tells_its_child_the_line_its_own_round_lent_by
    # guards; it stays as a tree that once stranded work.)
    scenario = Scenario(seed=3989, mode='tree', limits=(4, 1), jobs=(Job(at_ms=28358.0, shard=1, key=0, group='wf0', ms=200), Job(at_ms=32173.5, shard=2, key=1, group='capped', ms=1000), Job(at_ms=32304.6, shard=2, key=0, group='wf0', ms=1000), Job(at_ms=61724.2, shard=2, key=1, group='wf0', ms=200), Job(at_ms=61836.5, shard=1, key=1, group='capped', ms=1000), Job(at_ms=65496.3, shard=2, key=1, group='capped', ms=200), Job(at_ms=81484.7, shard=1, key=0, group='wf1', ms=3000, cancel_after_ms=4236.0), Job(at_ms=81510.2, shard=0, key=1, group='wf1', ms=1000), Job(at_ms=85606.4, shard=2, key=1, group='capped', ms=8000, fails=True), Job(at_ms=89432.2, shard=0, key=1, group='capped', ms=200), Job(at_ms=89576.1, shard=2, key=1, group='capped', ms=1000, cancel_after_ms=5281.1), Job(at_ms=89717.5, shard=0, key=0, group='capped', ms=3000, cancel_after_ms=3778.6)), changes=(Change(at_ms=51151.3, kind='limit', value=8), Change(at_ms=139137.6, kind='limit', key=1, value=2)), faults=(('evict', 0.382), ('crash_before_commit', 0.054), ('duplicate_alarm', 0.077)), latency_ms=20.0, partitions=(Partition(shard=2, at_ms=76120.5, ms=27640.6),), lose_releases=0.2, permits_per_lease=4, keep_done=False, outages=(Outage(kind='holder', index=1, at_ms=49107.0, ms=198463.8), Outage(kind='holder', index=0, at_ms=35480.0, ms=195267.5, child=1)), fan_out=3, depth=2, hibernate=True, calls=True, call_faults=(('late', 0.057), ('evict_client', 0.123)))
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_9610():
    # A tree's leaf called a shard with a grant, heard its answer (its next
    # item, in the same group), and restarted with its root. The new leaf,
    # whose rows do not say which grants a client heard of, took that grant
    # as one the shard might not know yet, serving the new item until its
    # claim deadline: its round served nothing and left nothing waiting, and
    # nothing ran a round after the deadline. The shard waited 17 s, until
    # the sweep. The holder now runs a round when such claims lapse.
    scenario = Scenario(seed=9610, mode='tree', limits=(5,), shards=2, jobs=(Job(at_ms=99382.6, shard=1, key=0, group='wf1', ms=20000), Job(at_ms=99486.1, shard=1, key=0, group='wf1', ms=8000)), keep_done=False, restarts=(Restart(key=0, at_ms=100699.7), Restart(key=0, at_ms=100699.7, child=2)), fan_out=3, calls=True)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_323():
    # The root's limit went to 0; the holder in the middle heard it was over
    # its limit and yielded, but told its leaves only whether its own loans
    # were over what it held, and a leaf two levels down kept reusing a loan
    # from before the change: an item started 220 s later. A middle now
    # passes on its parent's word (and says so once cut off from it).
    outcome = run(generate(323, "tree"))
    assert not outcome.violations, outcome.violations.first


def test_new_faults_are_drawn_and_shrink_away():
    drawn = [generate(seed, "grants") for seed in range(200)]
    blackouts = [o for s in drawn for o in s.outages if o.alarms]
    outages = [o for s in drawn for o in s.outages if o.calls]
    restarts = [r for s in drawn for r in s.restarts]
    assert 40 < len(blackouts) < 80 and 20 < len(outages) < 60 and len(restarts) > 40
    assert all(o.ms >= 170_000 for o in blackouts)  # long enough for the runtime to give up on an alarm
    with_outage = next(s for s in drawn if s.outages)
    assert with_outage.faults_end_ms == max(150_000, *(o.at_ms + o.ms for o in with_outage.outages))
    assert eval(with_outage.to_literal()) == with_outage
    assert any(not c.outages for c in smaller(with_outage))
    assert all(o.child == -1 for o in outages + blackouts)  # no tree: the holder itself


def test_a_trees_holder_outages_hit_its_root_and_its_children_and_keep_the_rest_of_each_seed():
    drawn = [generate(seed, "tree") for seed in range(400)]
    targets = {o.target for s in drawn for o in s.outages if o.kind == "holder"}
    assert "Holder:k0" in targets and {"Holder:k0~child-0", "Holder:k0~child-1"} <= targets
    assert all(o.child < s.fan_out for s in drawn for o in s.outages)
    # The children's outages come from a source of their own: the rest of a seed stays.
    assert all(o.child == -1 for o in generate(1650, "tree").outages)
    assert generate(1650, "tree").restarts == (Restart(key=1, at_ms=13682.5),)


def test_some_tree_runs_restart_their_root_with_no_other_fault():
    drawn = [generate(seed, "tree") for seed in range(1, 401)]
    alone = [s for s in drawn if s.restarts_alone]
    assert 15 < len(alone) < 80
    assert all(s.calls and not (s.faults or s.call_faults or s.partitions or s.outages or s.changes) for s in alone)
    assert all(sum(r.child == -1 for r in s.restarts) > 1 for s in alone)
    assert not any(generate(seed, "grants").restarts_alone for seed in range(1, 200))


def test_the_recovery_check_finds_a_root_restart_the_tree_never_recovers_from():
    scenario = Scenario(seed=1, mode="tree", limits=(2,), shards=2, calls=True, fan_out=2,
                        jobs=(Job(at_ms=1_000.0, shard=0, key=0, group="wf0", ms=3_000),
                              Job(at_ms=2_000.0, shard=1, key=0, group="wf0", ms=3_000)),
                        restarts=(Restart(key=0, at_ms=10_000.0), Restart(key=0, at_ms=15_000.0)))
    truth = Truth(scenario, lambda: 0.0)
    accepted = {"j0": 1_000.0, "j1": 2_000.0}
    truth.admitted_at, truth.stopped = {"j0": 1_100.0}, {"j0": 4_100.0}
    found = recovery_violations(scenario, truth, 0.0, accepted, lambda item: False)
    assert len(found) == 2 and "j1 waiting" in found[0] and "nothing admitted since" in found[0]
    truth.admitted_at["j1"] = 10_000.0 + recovery_bound_ms(scenario) - 1  # late, yet within the bound
    assert recovery_violations(scenario, truth, 0.0, accepted, lambda item: False) == []
    assert recovery_violations(scenario, truth, 0.0, accepted, lambda item: item == "j1") == []  # cancelled


def test_campaign_tree_seed_11():
    # shrunk from a failing campaign run: accounting. A reply to a child's
    # request, sent before a loan settled, listed the loan again; the child
    # took it back and handed out a permit its parent had lent elsewhere.
    scenario = Scenario(seed=11, mode='tree', limits=(5,), shards=5, jobs=(Job(at_ms=930.7, shard=3, key=0, group='wf1', ms=8000), Job(at_ms=985.5, shard=2, key=0, group='wf1', ms=20000, fails=True), Job(at_ms=1162.1, shard=3, key=0, group='wf0', ms=8000), Job(at_ms=1238.4, shard=4, key=0, group='wf0', ms=3000), Job(at_ms=2567.6, shard=0, key=0, group='wf0', ms=200), Job(at_ms=2600.6, shard=2, key=0, group='wf0', ms=3000, fails=True), Job(at_ms=2637.0, shard=1, key=0, group='wf1', ms=20000), Job(at_ms=2648.9, shard=2, key=0, group='wf1', ms=1000), Job(at_ms=2695.1, shard=4, key=0, group='wf0', ms=20000), Job(at_ms=39606.4, shard=2, key=0, group='wf0', ms=1000), Job(at_ms=39667.8, shard=3, key=0, group='capped', ms=1000), Job(at_ms=39682.1, shard=3, key=0, group='wf0', ms=1000), Job(at_ms=39743.4, shard=3, key=0, group='wf1', ms=3000), Job(at_ms=39744.7, shard=1, key=0, group='wf0', ms=200, cancel_after_ms=5521.2), Job(at_ms=50268.8, shard=0, key=0, group='wf0', ms=8000), Job(at_ms=50344.3, shard=2, key=0, group='capped', ms=8000), Job(at_ms=50351.1, shard=3, key=0, group='capped', ms=20000), Job(at_ms=50399.5, shard=0, key=0, group='wf0', ms=20000), Job(at_ms=50502.9, shard=2, key=0, group='wf1', ms=1000), Job(at_ms=53339.0, shard=0, key=0, group='capped', ms=8000), Job(at_ms=59849.0, shard=0, key=0, group='capped', ms=200), Job(at_ms=90770.8, shard=4, key=0, group='wf0', ms=200)), changes=(Change(at_ms=14322.1, kind='limit', value=1), Change(at_ms=82555.8, kind='limit', value=7)), faults=(('crash_before_commit', 0.016), ('alarm_failure', 0.023)), latency_ms=2000.0, partitions=(Partition(shard=2, at_ms=69187.3, ms=28330.3),), lose_releases=0.05, restarts=(Restart(key=0, at_ms=2188.9, child=0),), fan_out=2)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_915():
    # shrunk from a failing campaign run: group_limit. A child kept handing out the permits it held in a group whose ceiling
    # callback at the root had started to fail: the root now closes such groups
    # (``closedGroups``), and the children fail closed as it does.
    scenario = Scenario(seed=915, mode='tree', limits=(4,), group_limits=(('capped', 2),), shards=2, jobs=(Job(at_ms=129.7, shard=1, key=0, group='wf1', ms=1000), Job(at_ms=193.7, shard=1, key=0, group='wf0', ms=200), Job(at_ms=415.5, shard=1, key=0, group='wf1', ms=20000), Job(at_ms=493.0, shard=0, key=0, group='wf0', ms=20000), Job(at_ms=494.4, shard=0, key=0, group='capped', ms=1000), Job(at_ms=7290.3, shard=1, key=0, group='wf1', ms=200), Job(at_ms=7317.9, shard=0, key=0, group='wf1', ms=20000), Job(at_ms=7500.0, shard=0, key=0, group='capped', ms=3000, cancel_after_ms=4483.8), Job(at_ms=16786.6, shard=1, key=0, group='wf1', ms=20000), Job(at_ms=16863.0, shard=1, key=0, group='wf1', ms=3000), Job(at_ms=17076.8, shard=0, key=0, group='wf1', ms=1000), Job(at_ms=17789.1, shard=0, key=0, group='wf0', ms=20000), Job(at_ms=17924.2, shard=1, key=0, group='wf1', ms=1000), Job(at_ms=17927.1, shard=1, key=0, group='wf0', ms=1000), Job(at_ms=17977.9, shard=0, key=0, group='wf1', ms=8000, cancel_after_ms=7839.7), Job(at_ms=17983.3, shard=0, key=0, group='capped', ms=200)), changes=(Change(at_ms=12354.3, kind='group_limit', value='raise'),), faults=(('lost_reply', 0.381), ('crash_before_commit', 0.02)), latency_ms=20.0, fan_out=3)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_165():
    # shrunk from a failing campaign run: leak. A live child whose grant reply was lost did not know it held the grant,
    # and its parent's wake-up did not make it ask: a woken child now asks, and
    # hears every grant it holds.
    scenario = Scenario(seed=165, mode='tree', limits=(5, 3), shards=2, jobs=(Job(at_ms=64072.6, shard=0, key=1, group='capped', ms=1000), Job(at_ms=64277.5, shard=1, key=1, group='wf0', ms=1000), Job(at_ms=64389.5, shard=0, key=0, group='capped', ms=200), Job(at_ms=64424.8, shard=1, key=0, group='wf0', ms=20000), Job(at_ms=83481.3, shard=1, key=1, group='wf1', ms=8000), Job(at_ms=83548.4, shard=1, key=1, group='wf0', ms=20000), Job(at_ms=83548.5, shard=0, key=0, group='capped', ms=200), Job(at_ms=83753.9, shard=1, key=1, group='wf1', ms=20000), Job(at_ms=83769.1, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=83782.9, shard=1, key=0, group='wf0', ms=20000, fails=True), Job(at_ms=83813.9, shard=0, key=0, group='capped', ms=20000), Job(at_ms=83831.5, shard=0, key=0, group='capped', ms=1000), Job(at_ms=94250.7, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=94302.7, shard=1, key=1, group='wf1', ms=200), Job(at_ms=94307.3, shard=1, key=1, group='capped', ms=3000), Job(at_ms=94510.7, shard=0, key=0, group='capped', ms=3000, cancel_after_ms=2570.1), Job(at_ms=94624.5, shard=0, key=1, group='wf0', ms=3000, cancel_after_ms=7644.6)), faults=(('lost_request', 0.03), ('lost_reply', 0.312), ('duplicate', 0.028), ('crash_before_commit', 0.052), ('duplicate_alarm', 0.068)), latency_ms=80.0, permits_per_lease=4, fan_out=2)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_982():
    # shrunk from a failing campaign run: leak. A child evicted with a give-back unconfirmed, under a root whose alarm
    # had been dropped in an outage: nothing ever started either again. The
    # child keeps a timer while a give-back is unconfirmed, so its alarm does.
    scenario = Scenario(seed=982, mode='tree', limits=(2,), shards=2, jobs=(Job(at_ms=6406.5, shard=0, key=0, group='wf0', ms=200), Job(at_ms=6470.6, shard=0, key=0, group='wf1', ms=200), Job(at_ms=46711.0, shard=0, key=0, group='wf1', ms=3000), Job(at_ms=46716.7, shard=1, key=0, group='wf0', ms=200)), faults=(('lost_reply', 0.055), ('evict', 0.066), ('alarm_failure', 0.022), ('duplicate_alarm', 0.023)), latency_ms=2000.0, permits_per_lease=4, keep_done=False, outages=(Outage(kind='holder', index=0, at_ms=59303.5, ms=209890.4),), fan_out=2)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_1650():
    # shrunk from a failing campaign run: leak. A child's request failed after its parent lent in it; the
    # child's demand went, and an outage had made the runtime give up on the
    # parent's alarm, so nothing called the child to hear of the loan. A child
    # whose request failed now asks until one succeeds, demand or not.
    scenario = Scenario(seed=1650, mode='tree', limits=(2, 5), shards=4, jobs=(Job(at_ms=4654.0, shard=0, key=1, group='wf0', ms=1000), Job(at_ms=12420.4, shard=1, key=0, group='capped', ms=20000, fails=True), Job(at_ms=12427.3, shard=1, key=1, group='capped', ms=8000), Job(at_ms=12500.8, shard=2, key=0, group='wf0', ms=3000), Job(at_ms=12539.1, shard=0, key=0, group='wf0', ms=1000), Job(at_ms=12772.9, shard=1, key=1, group='wf0', ms=1000), Job(at_ms=13494.5, shard=3, key=1, group='capped', ms=3000, fails=True), Job(at_ms=13496.1, shard=0, key=0, group='wf1', ms=20000), Job(at_ms=13573.0, shard=0, key=1, group='wf1', ms=20000), Job(at_ms=13612.8, shard=1, key=0, group='capped', ms=20000), Job(at_ms=13633.3, shard=0, key=0, group='capped', ms=3000), Job(at_ms=13669.7, shard=0, key=1, group='wf0', ms=1000), Job(at_ms=13817.2, shard=1, key=1, group='capped', ms=1000), Job(at_ms=13976.3, shard=3, key=1, group='wf0', ms=20000, fails=True), Job(at_ms=36947.9, shard=2, key=1, group='wf0', ms=20000, cancel_after_ms=4462.8), Job(at_ms=37005.2, shard=2, key=0, group='wf0', ms=1000), Job(at_ms=37074.1, shard=2, key=0, group='wf1', ms=20000), Job(at_ms=37120.3, shard=0, key=1, group='wf1', ms=200, cancel_after_ms=673.7), Job(at_ms=37299.1, shard=0, key=0, group='capped', ms=20000), Job(at_ms=37311.7, shard=1, key=1, group='capped', ms=3000, fails=True), Job(at_ms=52248.9, shard=1, key=1, group='capped', ms=8000), Job(at_ms=52316.1, shard=0, key=1, group='wf0', ms=1000, cancel_after_ms=2807.5), Job(at_ms=52339.3, shard=1, key=0, group='wf1', ms=3000), Job(at_ms=52380.1, shard=3, key=0, group='wf1', ms=20000), Job(at_ms=52553.4, shard=3, key=0, group='capped', ms=8000), Job(at_ms=52572.1, shard=3, key=0, group='wf1', ms=20000), Job(at_ms=52584.6, shard=3, key=1, group='capped', ms=200), Job(at_ms=67912.3, shard=3, key=0, group='wf1', ms=3000), Job(at_ms=67935.6, shard=1, key=1, group='capped', ms=8000), Job(at_ms=67938.2, shard=2, key=0, group='capped', ms=20000, fails=True), Job(at_ms=67957.6, shard=2, key=1, group='capped', ms=8000), Job(at_ms=68093.8, shard=2, key=1, group='wf0', ms=1000, fails=True), Job(at_ms=68297.7, shard=0, key=0, group='wf0', ms=200), Job(at_ms=74136.3, shard=2, key=1, group='capped', ms=20000), Job(at_ms=74244.6, shard=1, key=1, group='wf1', ms=3000), Job(at_ms=74287.4, shard=3, key=1, group='capped', ms=200)), faults=(('lost_request', 0.21), ('lost_reply', 0.067), ('duplicate', 0.021), ('crash_before_commit', 0.052)), latency_ms=20.0, partitions=(Partition(shard=3, at_ms=47917.3, ms=38289.7),), lose_releases=0.05, permits_per_lease=4, outages=(Outage(kind='holder', index=1, at_ms=47764.1, ms=185981.5),), restarts=(Restart(key=1, at_ms=13682.5),), fan_out=2)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_821():
    # shrunk from a failing campaign run: recovery. The shard waited in its
    # leaf's line for a "capped" item, blocked by that group's limit, when
    # its first wf0 item came: the leaf called it for nothing (it served
    # what it was told of, and that was blocked), and wf0 waited for the
    # shard's own request wait. A new group is now asked for at once.
    scenario = Scenario(seed=821, mode='tree', limits=(5,), group_limits=(('capped', 1),), shards=1, jobs=(Job(at_ms=14017.0, shard=0, key=0, group='capped', ms=20000), Job(at_ms=14302.8, shard=0, key=0, group='capped', ms=1000, fails=True), Job(at_ms=22260.7, shard=0, key=0, group='wf0', ms=8000)), restarts=(Restart(key=0, at_ms=27327.5),), fan_out=3, calls=True)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_147():
    # shrunk from a failing campaign run: recovery. As seed 821's, with the
    # wf0 item on another shard than the running "capped" ones.
    scenario = Scenario(seed=147, mode='tree', limits=(2, 6), group_limits=(('capped', 1),), shards=2, jobs=(Job(at_ms=21896.2, shard=1, key=1, group='capped', ms=20000), Job(at_ms=21925.7, shard=1, key=1, group='capped', ms=20000), Job(at_ms=36260.0, shard=0, key=1, group='capped', ms=200), Job(at_ms=42748.6, shard=0, key=1, group='wf0', ms=20000)), restarts=(Restart(key=1, at_ms=52928.0),), fan_out=2, calls=True)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_773():
    # shrunk from a failing campaign run: recovery. The root and the child
    # serving the shard restarted together, the child between its round
    # and its call: the shard held a grant it never heard of, waiting to be
    # called, until its own request wait ran out. A new instance now calls
    # the clients of grants still claimable.
    scenario = Scenario(seed=773, mode='tree', limits=(5, 3), group_limits=(('capped', 2),), shards=2, jobs=(Job(at_ms=54636.5, shard=1, key=1, group='wf1', ms=8000), Job(at_ms=54720.1, shard=1, key=0, group='wf1', ms=3000), Job(at_ms=67345.0, shard=1, key=0, group='wf0', ms=1000), Job(at_ms=67428.4, shard=1, key=1, group='wf0', ms=8000)), latency_ms=80.0, permits_per_lease=1, restarts=(Restart(key=0, at_ms=69054.8), Restart(key=0, at_ms=69054.8, child=1), Restart(key=0, at_ms=58926.6)), fan_out=2, calls=True)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_campaign_tree_seed_1156():
    # shrunk from a failing campaign run: recovery (31.8 s without an
    # admission, 5 of 6 permits free, after the root's restart at 77 s).
    # Either fix above serves it again: the restarted holder's calls, or
    # the shard asking for a group it had nothing queued in.
    scenario = Scenario(seed=1156, mode='tree', limits=(6,), group_limits=(('capped', 2),), shards=5, jobs=(Job(at_ms=53536.6, shard=1, key=0, group='wf0', ms=200), Job(at_ms=53573.2, shard=4, key=0, group='wf0', ms=200), Job(at_ms=53812.2, shard=0, key=0, group='wf1', ms=1000), Job(at_ms=55808.0, shard=4, key=0, group='wf1', ms=20000), Job(at_ms=55936.7, shard=0, key=0, group='capped', ms=200), Job(at_ms=59624.2, shard=1, key=0, group='capped', ms=1000)), latency_ms=80.0, permits_per_lease=3, restarts=(Restart(key=0, at_ms=60034.0, child=0), Restart(key=0, at_ms=57048.9), Restart(key=0, at_ms=77252.2)), fan_out=3, calls=True)
    outcome = run(scenario)
    assert not outcome.violations, outcome.violations.first


def test_seeds_of_every_mode_replay_in_processes_that_hash_strings_differently():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "campaign.py"), "--seeds", "3", "--replay-check",
                           "--json"], capture_output=True, text=True, timeout=900)
    rows = json.loads(done.stdout)
    assert [row["mode"] for row in rows] == list(MODES)
    assert all(row["runs"] == 3 and row["identical"] == 3 for row in rows), (rows, done.stderr[-2_000:])
    assert done.returncode == 0


def test_a_run_s_trace_digest_follows_what_happened():
    first, again, other = run(generate(5, "tree")), run(generate(5, "tree")), run(generate(6, "tree"))
    assert first.digest == again.digest != other.digest and len(first.digest) == 16
