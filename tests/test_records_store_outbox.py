"""Records in the state dir, the delivery queue, and read-merge-write-verify against a fake
accounting that stores what sacctmgr 22.05 stores (lower case, quotes as backticks)."""
import os
import random
import stat
import threading
import time

import pytest

from healthcheck.records import admin_comment as ac
from healthcheck.records import outbox, store

from .conftest import builtin_settings

JS = ac.as_stored_by_sacctmgr("JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTVWqBQBGb7chEwAAAA==")


class FakeAccounting:
    """One job's AdminComment as slurmdbd keeps it. ``latency`` makes every read and write take
    time, so concurrent read-modify-write cycles really interleave."""

    def __init__(self, jobs=None, latency=0.0):
        self.comments = dict(jobs or {})
        self.latency = latency
        self.down = False
        self.writes = 0
        self.lock = threading.Lock()

    def _wait(self):
        if self.latency:
            time.sleep(random.uniform(0, self.latency))

    def get_admin_comment(self, job_id):
        if self.down:
            raise outbox.AccountingError("sacct: slurmdbd: Connection refused")
        self._wait()
        with self.lock:
            return self.comments.get(job_id)

    def get_admin_comments(self, job_ids):
        return {job: self.get_admin_comment(job) for job in job_ids}

    def set_admin_comment(self, job_id, text):
        if self.down:
            raise outbox.AccountingError("sacctmgr: slurmdbd: Connection refused")
        self._wait()
        with self.lock:
            if job_id in self.comments:
                self.comments[job_id] = ac.as_stored_by_sacctmgr(text)
                self.writes += 1


FAST = builtin_settings(outbox.DeliverySettings, attempts=20, verify_delay_s=0.05, jitter_s=0.05, lock_wait_s=5)


def queue(state, job_id, entry, now=None):
    """Write a record whose entry is ``entry`` and queue it: the outbox queues references to records."""
    record = {"job_id": job_id, "node": entry["node"], "class": entry["class"]}
    if "xid" in entry:
        record["cause"] = {"kind": "xid", "gpu": entry["gpu"], "code": entry["xid"]}
    store.write_record(state, record)
    assert store.entry_for(record) == entry
    return outbox.queue_record(state, record, now=now)


def queued_entries(state, job_id):
    """The entries queued for ``job_id``: each queued item refers to its record (the latest run's here)."""
    return [store.entry_for(store.read_record(state, job_id, item["node"])) for item in outbox.pending(state)[job_id]]


def test_record_is_written_atomically_with_a_restrictive_mode(tmp_path):
    state = str(tmp_path)
    path = store.write_record(state, {"job_id": "42", "node": "gpu1", "class": "FAILED"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert store.read_record(state, "42", "gpu1")["class"] == "FAILED"
    store.write_record(state, {"job_id": "42", "node": "*", "class": "FAILED"})
    assert [r["node"] for r in store.read_records(state, "42")] == ["*", "gpu1"]
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")]


def test_record_paths_refuse_what_is_not_a_job_id_or_node(tmp_path):
    for job in ("../etc", "12/3", "", "1;rm"):
        with pytest.raises(ValueError):
            store.record_path(str(tmp_path), job, "gpu1")
    with pytest.raises(ValueError):
        store.record_path(str(tmp_path), "12", "../gpu1")


def test_baseline_round_trip_and_recent_endings(tmp_path):
    state = str(tmp_path)
    store.write_baseline(state, "7", "gpu2", {"started_at": 100.0, "gpus": [{"index": 3}]})
    assert store.read_baseline(state, "7", "gpu2")["gpus"] == [{"index": 3}]
    for job in range(1, 70):
        store.note_ending(state, "gpu2", str(job), 1000.0 + job)
    recent = store.recent_endings(state, "gpu2", since=1060.0)
    assert [j["job_id"] for j in recent] == [str(j) for j in range(60, 70)]
    assert len(store.recent_endings(state, "gpu2", since=0)) == store.RECENT_KEEP


def test_one_write_keeps_jobstats_blob_and_verifies():
    acct = FakeAccounting({"5": JS})
    result = outbox.write_entries(acct, "5", [{"node": "*", "class": "COMPLETED"}], FAST)
    assert result.delivered and result.writes == 1 and acct.writes == 1
    assert ac.others(acct.comments["5"]) == JS
    assert [e["class"] for e in ac.parse(acct.comments["5"])] == ["COMPLETED"]


def test_delivering_again_costs_no_write():
    acct = FakeAccounting({"5": ""})
    outbox.write_entries(acct, "5", [{"node": "*", "class": "COMPLETED"}], FAST)
    again = outbox.write_entries(acct, "5", [{"node": "*", "class": "COMPLETED"}], FAST)
    assert again.delivered and again.writes == 0 and acct.writes == 1


def test_concurrent_writers_of_one_job_lose_no_entry():
    """Three node epilogs and EpilogSlurmctld write the same field at the same moment."""
    for trial in range(5):
        acct = FakeAccounting({"9": JS}, latency=0.02)
        writers = [{"node": "*", "class": "FAILED"}] + \
                  [{"node": f"gpu{n}", "class": "GPU_LOST" if n == 1 else "FAILED", "gpu": n} for n in (1, 2, 3)]
        results = []
        start = threading.Barrier(len(writers))

        def write(entry):
            start.wait()
            results.append(outbox.write_entries(acct, "9", [entry], FAST, rng=random.Random()))

        threads = [threading.Thread(target=write, args=(e,)) for e in writers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        final = acct.comments["9"]
        assert all(r.delivered for r in results), trial
        assert sorted(e["node"] for e in ac.parse(final)) == ["*", "gpu1", "gpu2", "gpu3"], (trial, final)
        assert ac.others(final) == JS


def test_without_verification_concurrent_writers_do_lose_entries():
    """The hazard the verify step exists for: plain read-merge-write loses entries."""
    lost = 0
    for _ in range(5):
        acct = FakeAccounting({"9": ""}, latency=0.02)
        start = threading.Barrier(3)

        def write(node):
            start.wait()
            current = acct.get_admin_comment("9")
            acct.set_admin_comment("9", ac.merge(current, [{"node": node, "class": "FAILED"}]))

        threads = [threading.Thread(target=write, args=(f"gpu{n}",)) for n in (1, 2, 3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        lost += 3 - len(ac.parse(acct.comments["9"]))
    assert lost > 0


def test_accounting_down_keeps_entries_queued_until_it_returns(tmp_path):
    state = str(tmp_path)
    acct = FakeAccounting({"11": "", "12": JS})
    acct.down = True
    queue(state, "11", {"node": "*", "class": "COMPLETED"})
    queue(state, "12", {"node": "gpu1", "class": "GPU_LOST", "gpu": 3, "xid": 79})
    report = outbox.deliver_pending(state, acct, FAST)
    assert report.error and report.delivered == [] and len(outbox.pending(state)) == 2
    acct.down = False
    report = outbox.deliver_pending(state, acct, FAST)
    assert sorted(report.delivered) == ["11", "12"] and outbox.pending(state) == {}
    assert ac.parse(acct.comments["12"])[0]["xid"] == 79 and ac.others(acct.comments["12"]) == JS


def test_job_not_yet_in_accounting_stays_queued(tmp_path):
    state = str(tmp_path)
    queue(state, "13", {"node": "*", "class": "COMPLETED"})
    report = outbox.deliver_pending(state, FakeAccounting({}), FAST)
    assert report.waiting == ["13"] and list(outbox.pending(state)) == ["13"]


def test_newer_entry_for_the_same_node_replaces_the_queued_one(tmp_path):
    state = str(tmp_path)
    queue(state, "14", {"node": "gpu1", "class": "FAILED"})
    queue(state, "14", {"node": "gpu1", "class": "GPU_LOST"})
    assert len(outbox.pending(state)["14"]) == 1
    acct = FakeAccounting({"14": ""})
    assert outbox.deliver_pending(state, acct, FAST).delivered == ["14"]
    assert [e["class"] for e in ac.parse(acct.comments["14"])] == ["GPU_LOST"]


def test_late_evidence_amends_only_jobs_inside_the_window(tmp_path):
    from healthcheck.records.late import amend_recent_jobs

    state = str(tmp_path)
    for job, ended in (("1", 990.0), ("2", 1250.0), ("3", 1290.0)):
        store.write_record(state, {"job_id": job, "node": "gpu1", "class": "FAILED", "slurm_class": "FAILED",
                                   "evidence": [], "exit": 1, "ended_at": ended})
        store.note_ending(state, "gpu1", job, ended)
    store.write_record(state, {"job_id": "3", "node": "gpu1", "class": "COMPLETED", "slurm_class": "COMPLETED",
                               "evidence": [], "ended_at": 1290.0})
    lost = {"kind": "finding", "check": "gpu.lost", "status": "fail", "action": "drain", "gpu": 3}
    amended = amend_recent_jobs(state, "gpu1", [lost], now=1300.0, window_s=300)
    assert [r["job_id"] for r in amended] == ["2"]          # 1 is too old; 3 COMPLETED keeps its class
    assert store.read_record(state, "1", "gpu1")["class"] == "FAILED"
    assert store.read_record(state, "2", "gpu1")["class"] == "GPU_LOST"
    assert list(outbox.pending(state)) == ["2"] and store.entry_for(store.read_record(state, "2", "gpu1"))["late"]
    assert amend_recent_jobs(state, "gpu1", [lost], now=1301.0, window_s=300) == []   # once
    assert amend_recent_jobs(state, "gpu1", [], now=1300.0, window_s=300) == []


def test_late_evidence_amends_only_jobs_it_could_have_ended(tmp_path):
    """Seen in the lab: GPU 5 lost a minute after a NODE_FAIL job that held GPU 0 turned that job
    GPU_LOST. Only a fault on the job's own GPUs, or a node-wide one, is why it ended."""
    from healthcheck.records.late import amend_recent_jobs

    state = str(tmp_path)
    rows = (("1", "NODE_FAIL", [0]), ("2", "FAILED", [4, 5, 6, 7]), ("3", "NVLINK", [4, 5]),
            ("4", "FAILED", None), ("5", "FAILED", [1]))
    for job, cls, gpus in rows:
        store.write_record(state, {"job_id": job, "node": "gpu3", "class": cls, "slurm_class": "FAILED",
                                   "evidence": [], "gpus": gpus, "ended_at": 1250.0})
        store.note_ending(state, "gpu3", job, 1250.0)
    lost5 = {"kind": "finding", "check": "gpu.lost", "status": "fail", "action": "drain", "gpu": 5}
    amended = amend_recent_jobs(state, "gpu3", [lost5], now=1300.0, window_s=300)
    # 2 held GPU 5; 4's GPUs are unknown; 3 already had its own hardware cause; 1 and 5 never had GPU 5
    assert sorted(r["job_id"] for r in amended) == ["2", "4"]
    assert store.read_record(state, "1", "gpu3")["class"] == "NODE_FAIL"
    assert store.read_record(state, "3", "gpu3")["class"] == "NVLINK"
    port = {"kind": "finding", "check": "ib.port", "status": "fail", "action": "drain", "port": "mlx5_0:1"}
    amended = amend_recent_jobs(state, "gpu3", [port], now=1300.0, window_s=300)     # node-wide: any job's
    assert sorted(r["job_id"] for r in amended) == ["1", "5"]
    assert store.read_record(state, "1", "gpu3")["class"] == "INFINIBAND"


def test_late_evidence_skips_jobs_that_ended_before_a_run_saw_the_gpu_clean(tmp_path):
    """Job 7 ended on GPU 0 at 1200; the next job's prolog saw GPU 0 clean at 1210 and then GPU 0
    fell off the bus under that job: the fault is not why job 7 ended. Job 8 ended on GPU 1 at 1250
    and nothing looked at GPU 1 since: the fault found at 1300 may be why."""
    from healthcheck.findings import Finding
    from healthcheck.records.late import amend_recent_jobs

    state = str(tmp_path)
    for job, gpu, ended in (("7", 0, 1200.0), ("8", 1, 1250.0)):
        store.write_record(state, {"job_id": job, "node": "gpu1", "class": "FAILED", "slurm_class": "FAILED",
                                   "evidence": [], "gpus": [gpu], "ended_at": ended})
        store.note_ending(state, "gpu1", job, ended)
    warn_on_1 = Finding(check="gpu.temperature", status="warn", action="warn", message="hot", gpu=1)
    store.note_clean_run(state, "gpu1", [warn_on_1], [0, 1], at=1210.0)    # GPU 1 not clean: a finding
    assert store.clean_since(state, "gpu1") == {"gpu0": 1210.0, "node": 1210.0}
    assert [j["job_id"] for j in store.recent_endings(state, "gpu1", since=0)] == ["7", "8"]   # kept
    lost = [{"kind": "finding", "check": "gpu.lost", "status": "fail", "action": "drain", "gpu": g} for g in (0, 1)]
    amended = amend_recent_jobs(state, "gpu1", lost, now=1300.0, window_s=300)
    assert [r["job_id"] for r in amended] == ["8"]
    assert store.read_record(state, "7", "gpu1")["class"] == "FAILED"


def test_a_queue_of_many_jobs_waits_to_verify_once_per_round(tmp_path):
    state = str(tmp_path)
    acct = FakeAccounting({str(job): "" for job in range(20, 30)})
    for job in range(20, 30):
        queue(state, str(job), {"node": "*", "class": "COMPLETED"})
    waits = []
    report = outbox.deliver_pending(state, acct, FAST, sleep=waits.append)
    assert sorted(report.delivered) == [str(job) for job in range(20, 30)]
    assert len(waits) == 1 and report.writes == 10 and outbox.pending(state) == {}


# -- a malformed queue file, fairness, expiry (issue 24) ------------------------------------------

class CountingAccounting(FakeAccounting):
    def __init__(self, jobs=None):
        super().__init__(jobs)
        self.asked = []

    def get_admin_comment(self, job_id):
        self.asked.append(job_id)
        return super().get_admin_comment(job_id)


@pytest.mark.parametrize("bad", [
    {"job_id": "40", "entry": {"node": "*", "class": "COMPLETED"}, "queued_at": "x"},
    {"job_id": "40", "entry": "x", "queued_at": 1.0},
    {"job_id": "40 -j 1,2,3", "entry": {"node": "*", "class": "COMPLETED"}, "queued_at": 1.0},
    {"job_id": "--format=User", "entry": {"node": "*", "class": "COMPLETED"}, "queued_at": 1.0},
    {"job_id": 40, "entry": {"node": "*", "class": "COMPLETED"}, "queued_at": 1.0},
    {"entry": {"node": "*", "class": "COMPLETED"}, "queued_at": 1.0},
])
def test_a_malformed_queue_file_is_set_aside_with_one_line_and_never_stops_the_others(tmp_path, capsys, bad):
    import json

    state = str(tmp_path)
    queue(state, "41", {"node": "*", "class": "COMPLETED"}, now=time.time() - 10)
    path = os.path.join(outbox.outbox_dir(state), "40._job.json")
    with open(path, "w") as handle:
        json.dump(bad, handle)
    queue(state, "42", {"node": "*", "class": "FAILED"})
    acct = CountingAccounting({"41": "", "42": JS})
    report = outbox.deliver_pending(state, acct, FAST)
    assert sorted(report.delivered) == ["41", "42"] and report.set_aside == ["40._job.json"]
    assert set(acct.asked) == {"41", "42"}, acct.asked           # nothing unchecked reaches sacct
    assert not os.path.exists(path) and os.path.exists(path + ".corrupt")
    [line] = [line for line in capsys.readouterr().err.splitlines() if "40._job.json" in line]
    assert "moved to" in line
    assert outbox.pending(state) == {} and outbox.deliver_pending(state, acct, FAST).set_aside == []


def test_undeliverable_entries_back_off_and_never_starve_the_ones_behind_them(tmp_path):
    state = str(tmp_path)
    t0 = 1_800_000_000.0
    for task in range(60):                              # never in accounting: undeliverable
        queue(state, f"{1000 + task}", {"node": "*", "class": "COMPLETED"}, now=t0 + task)
    queue(state, "2000", {"node": "*", "class": "FAILED"}, now=t0 + 100)
    acct = CountingAccounting({"2000": ""})
    settings = builtin_settings(outbox.DeliverySettings, attempts=1, verify_delay_s=0, jitter_s=0, max_jobs_per_run=50)
    first = outbox.deliver_pending(state, acct, settings, sleep=lambda s: None, now=t0 + 200)
    assert first.delivered == [] and len(first.waiting) == 50 and first.waiting[0] == "1000"   # oldest first
    second = outbox.deliver_pending(state, acct, settings, sleep=lambda s: None, now=t0 + 201)
    assert second.delivered == ["2000"] and second.deferred == 50 and len(second.waiting) == 10
    assert "2000" not in outbox.pending(state)
    # Each one is tried again once its back-off has passed (30 s, then twice as long).
    third = outbox.deliver_pending(state, acct, settings, sleep=lambda s: None, now=t0 + 231)
    assert third.waiting[:2] == ["1000", "1001"] and len(third.waiting) == 50 and third.deferred == 0
    fourth = outbox.deliver_pending(state, acct, settings, sleep=lambda s: None, now=t0 + 232)
    assert fourth.waiting[0] == "1050" and len(fourth.waiting) == 10 and fourth.deferred == 50
    fifth = outbox.deliver_pending(state, acct, settings, sleep=lambda s: None, now=t0 + 280)
    assert fifth.waiting == [] and fifth.deferred == 60            # 60 s after the second failure


def test_a_replaced_entry_is_due_at_once_whatever_the_back_off_of_the_one_before(tmp_path):
    state = str(tmp_path)
    t0 = 1_800_000_000.0
    queue(state, "50", {"node": "gpu1", "class": "FAILED"}, now=t0)
    acct = CountingAccounting({})
    assert outbox.deliver_pending(state, acct, FAST, sleep=lambda s: None, now=t0 + 1).waiting == ["50"]
    queue(state, "50", {"node": "gpu1", "class": "GPU_LOST"}, now=t0 + 2)   # late evidence
    acct.comments["50"] = ""
    report = outbox.deliver_pending(state, acct, FAST, sleep=lambda s: None, now=t0 + 3)
    assert report.delivered == ["50"] and ac.parse(acct.comments["50"])[0]["class"] == "GPU_LOST"


def test_entries_queued_longer_than_expire_s_are_dropped_and_reported_records_kept(tmp_path):
    state = str(tmp_path)
    now = time.time()
    store.write_record(state, {"job_id": "60", "node": "*", "class": "COMPLETED"})
    queue(state, "60", {"node": "*", "class": "COMPLETED"}, now=now - 8 * 86400)
    queue(state, "61", {"node": "*", "class": "COMPLETED"}, now=now - 6 * 86400)
    acct = CountingAccounting({"61": ""})
    report = outbox.deliver_pending(state, acct, builtin_settings(outbox.DeliverySettings, verify_delay_s=0, jitter_s=0),
                                    sleep=lambda s: None, now=now)
    assert report.expired == ["60"] and report.delivered == ["61"] and "60" not in acct.asked
    assert outbox.pending(state) == {} and store.read_record(state, "60", "*")["class"] == "COMPLETED"
    from slurm_hooks.delivery import report_lines

    [line] = report_lines(report)
    assert "1 job(s)' entries dropped" in line and "outbox_expire_s" in line and "60" in line


def test_records_that_want_an_entry_but_were_never_queued_are_queued_once(tmp_path):
    state = str(tmp_path)
    now = time.time()
    wanted = {"job_id": "70", "node": "gpu1", "class": "GPU_LOST", "cause": {"gpu": 3}, "ended_at": now,
              "entry_wanted": True}
    store.write_record(state, wanted)                                     # its queueing failed
    store.write_record(state, {"job_id": "71", "node": "gpu1", "class": "COMPLETED", "ended_at": now})
    done = dict(wanted, job_id="72")
    store.write_record(state, done)
    outbox.queue_record(state, done)
    outbox.deliver_pending(state, FakeAccounting({"72": ""}), FAST)        # delivered, queue file gone
    assert outbox.requeue_missing(state, 86400, now=now + 1) == ["70"]
    [item] = outbox.pending(state)["70"]
    assert (item["node"], item["restarts"]) == ("gpu1", 0)
    assert list(outbox.pending(state)) == ["70"]
    assert outbox.requeue_missing(state, 86400, now=now + 2) == []        # marked: not again


def test_a_requeued_jobs_earlier_run_keeps_its_record_queue_file_and_entry(tmp_path):
    from healthcheck.records.classify import job_class

    state = str(tmp_path)
    first = {"job_id": "80", "node": "*", "class": "PREEMPTED", **store.run_of({"SLURM_JOB_RESTART_COUNT": "0"})}
    store.write_record(state, first)
    outbox.queue_record(state, first)
    second = {"job_id": "80", "node": "*", "class": "COMPLETED", **store.run_of({"SLURM_JOB_RESTART_COUNT": "1"})}
    store.write_record(state, second)
    outbox.queue_record(state, second)
    assert store.read_record(state, "80", "*")["class"] == "COMPLETED"
    assert [r["class"] for r in store.earlier_runs(state, "80")] == ["PREEMPTED"]
    assert [r["class"] for r in store.read_records(state, "80")] == ["COMPLETED"]
    assert len(outbox.pending(state)["80"]) == 2                 # the first run's entry not replaced
    acct = FakeAccounting({"80": JS})
    assert outbox.deliver_pending(state, acct, FAST).delivered == ["80"]
    entries = ac.parse(acct.comments["80"])
    assert [(e["class"], e.get("run")) for e in entries] == [("PREEMPTED", None), ("COMPLETED", 1)]
    assert job_class(entries) == "COMPLETED" and ac.others(acct.comments["80"]) == JS


def test_a_run_is_its_sluid_where_the_release_sets_it_else_its_restart_count():
    assert store.run_of({"SLURM_JOB_RESTART_COUNT": "2"}) == {"run": 2, "restarts": 2}
    assert store.run_of({"SLURM_JOB_SLUID": "sABC123", "SLURM_JOB_RESTART_COUNT": "1"}) == \
        {"run": "sABC123", "restarts": 1}
    assert store.run_of({"SLURM_JOB_SLUID": "../x", "SLURM_JOB_RESTART_COUNT": "x"}) == {"run": 0, "restarts": 0}
    assert store.run_of({}, {"Restarts": "3"}) == {"run": 3, "restarts": 3}
    # a record of another run (another start) with the same or a later index: this run comes after it
    earlier = {"restarts": 1, "started_at": 100.0}
    assert store.run_of({"SLURM_JOB_RESTART_COUNT": "1"}, previous=earlier, started_at=200.0)["restarts"] == 2
    assert store.run_of({"SLURM_JOB_RESTART_COUNT": "1"}, previous=earlier, started_at=100.0)["restarts"] == 1
    assert store.run_of({"SLURM_JOB_RESTART_COUNT": "3"}, previous=earlier, started_at=200.0)["restarts"] == 3
    # the epilog of a run being requeued already sees the new count (22.05): it is still run 0
    assert store.run_of({"SLURM_JOB_RESTART_COUNT": "1"}, requeued=True) == {"run": 0, "restarts": 0}


def test_entries_queued_while_a_delivery_runs_go_out_in_that_run(tmp_path):
    """A delivery that finds the lock held gives up after lock_wait_s: the holder delivers what
    was queued meanwhile before it lets go (within deliver_max_jobs)."""
    state = str(tmp_path)
    queue(state, "90", {"node": "*", "class": "COMPLETED"})
    acct = FakeAccounting({"90": "", "91": ""})
    queued = []

    def settle(seconds):
        if not queued:                               # the next job's epilog queues while we wait
            queued.append(queue(state, "91", {"node": "*", "class": "FAILED"}))
    report = outbox.deliver_pending(state, acct, FAST, sleep=settle)
    assert sorted(report.delivered) == ["90", "91"] and outbox.pending(state) == {}


def test_the_queue_holds_a_reference_to_the_record_and_delivers_what_the_record_says_then(tmp_path):
    import json

    state = str(tmp_path)
    path = queue(state, "100", {"node": "gpu1", "class": "FAILED"})
    with open(path) as handle:
        item = json.load(handle)
    assert set(item) == {"job_id", "node", "restarts", "queued_at"} and (item["node"], item["restarts"]) == ("gpu1", 0)
    # The record changes after it was queued: what goes to accounting is the record as it is then.
    store.write_record(state, {"job_id": "100", "node": "gpu1", "class": "GPU_LOST",
                               "cause": {"kind": "xid", "gpu": 3, "code": 79}})
    acct = FakeAccounting({"100": ""})
    assert outbox.deliver_pending(state, acct, FAST).delivered == ["100"]
    assert [(e["class"], e.get("xid")) for e in ac.parse(acct.comments["100"])] == [("GPU_LOST", 79)]


def test_an_item_the_release_before_queued_is_delivered_from_its_record_else_as_its_copy(tmp_path):
    """An upgrade with entries queued: the release before queued a copy of each entry. The record's
    entry goes where the record is there (the same entry, or a newer one); the copy where it is not."""
    import json

    state = str(tmp_path)
    os.makedirs(outbox.outbox_dir(state))
    store.write_record(state, {"job_id": "110", "node": "gpu1", "class": "GPU_LOST", "restarts": 1,
                               "cause": {"kind": "xid", "gpu": 2, "code": 79}})
    old_items = {"110.gpu1.r1.json": {"job_id": "110", "entry": {"node": "gpu1", "class": "GPU_LOST", "gpu": 2,
                                                                 "xid": 79, "run": 1}, "queued_at": 1.0e9},
                 "111._job.json": {"job_id": "111", "entry": {"node": "*", "class": "FAILED", "exit": 2},
                                   "queued_at": 1.0e9}}
    for name, item in old_items.items():
        with open(os.path.join(outbox.outbox_dir(state), name), "w") as handle:
            json.dump(item, handle)
    acct = FakeAccounting({"110": "", "111": JS})
    report = outbox.deliver_pending(state, acct, FAST, now=1.0e9 + 60)
    assert sorted(report.delivered) == ["110", "111"] and report.set_aside == [] and outbox.pending(state) == {}
    assert ac.parse(acct.comments["110"]) == [{"v": 1, "node": "gpu1", "class": "GPU_LOST", "gpu": 2, "xid": 79,
                                               "run": 1}]
    assert ac.parse(acct.comments["111"]) == [{"v": 1, "node": "*", "class": "FAILED", "exit": 2}]
    assert ac.others(acct.comments["111"]) == JS


def test_a_reference_whose_record_is_gone_is_set_aside_with_one_line(tmp_path, capsys):
    import shutil

    state = str(tmp_path)
    queue(state, "120", {"node": "*", "class": "COMPLETED"})
    queue(state, "121", {"node": "*", "class": "FAILED"})
    shutil.rmtree(store.job_dir(state, "120"))                 # [retention] job_records_days removed it
    acct = CountingAccounting({"120": "", "121": ""})
    report = outbox.deliver_pending(state, acct, FAST)
    assert report.delivered == ["121"] and report.set_aside == ["120._job.json"] and set(acct.asked) == {"121"}
    [line] = [line for line in capsys.readouterr().err.splitlines() if "120._job.json" in line]
    assert "is gone" in line and outbox.pending(state) == {}


def test_failed_deliveries_are_counted_for_monitoring_and_the_queue_read_by_its_listing(tmp_path):
    """Each job a delivery could not deliver counts once; the queue's stats come from names and
    mtimes (an unreadable entry is counted, not parsed, and left where it is)."""
    from healthcheck.records.outbox_stats import QueueStats, queue_stats

    state = str(tmp_path)
    assert queue_stats(state) == QueueStats(0, 0.0, 0)
    acct = FakeAccounting({"21": "", "22": ""})
    acct.down = True
    first = queue(state, "21", {"node": "*", "class": "COMPLETED"})
    queue(state, "22", {"node": "*", "class": "COMPLETED"})
    os.utime(first, (1000.0, 1000.0))
    outbox.deliver_pending(state, acct, FAST)
    outbox.deliver_pending(state, acct, FAST)
    stats = queue_stats(state, now=4000.0)
    assert (stats.entries, stats.oldest_age_s, stats.failures) == (2, 3000.0, 4)
    acct.down = False
    outbox.deliver_pending(state, acct, FAST)
    torn = os.path.join(outbox.outbox_dir(state), "23.gpu1.json")
    with open(torn, "w") as handle:
        handle.write("{not json")
    stats = queue_stats(state)
    assert (stats.entries, stats.failures) == (1, 4) and os.path.exists(torn)
