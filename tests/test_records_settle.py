"""An ending the epilog's live view cannot tell apart (a scancel'd job whose batch step's end had
not reached slurmctld reads like a job that ran to its end) is settled by accounting's final State
at delivery: the record and the AdminComment entry say what sacct says."""
import os
import time

from healthcheck.records import admin_comment as ac
from healthcheck.records import outbox, settle, store
from healthcheck.records.classify import SlurmView, classify, slurm_ending

from .conftest import builtin_settings
from .test_records_store_outbox import FakeAccounting

START = "2026-12-01T18:00:00"
STARTED = time.mktime(time.strptime(START, "%Y-%m-%dT%H:%M:%S"))
# What the EpilogSlurmctld of a job cancelled 1 s in saw on 22.05 (CI, 2026-12-01).
LIVE = {"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:0", "Restarts": "0"}
ENV = {"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_DERIVED_EC": "0"}


class SettlingAccounting(FakeAccounting):
    """The fake accounting plus sacct's State/ExitCode/Start rows: one list of rows per read."""

    def __init__(self, jobs, states):
        super().__init__(jobs)
        self.states = list(states)
        self.reads = 0

    def final_states(self, job_ids):
        row = self.states[min(self.reads, len(self.states) - 1)]
        self.reads += 1
        return {job: row for job in job_ids}


def _record(tmp_path, view=LIVE, evidence=(), node=store.JOB_LEVEL):
    result = classify(SlurmView.from_scontrol(view, ENV), list(evidence))
    record = {"job_id": "77", "node": node, "class": result.cls, "slurm_class": result.slurm.cls,
              "slurm_why": result.slurm.why, "exit": result.slurm.exit, "signal": result.slurm.signal,
              "cause": result.cause, "evidence": list(evidence), "ended_at": STARTED + 1, "elapsed_s": 1,
              "started_at": STARTED, "entry_wanted": True}
    if not result.slurm.settled:
        record["slurm_settled"] = False
    store.write_record(str(tmp_path), record)
    outbox.queue_record(str(tmp_path), record)
    return record


def _deliver(tmp_path, accounting):
    settings = builtin_settings(outbox.DeliverySettings, verify_delay_s=0, jitter_s=0, attempts=3)
    return outbox.deliver_pending(str(tmp_path), accounting, settings, sleep=lambda s: None)


def test_the_live_view_of_a_completing_job_is_not_settled_and_a_final_one_is():
    assert not slurm_ending(SlurmView.from_scontrol(LIVE, ENV)).settled
    assert slurm_ending(SlurmView.from_sacct({"State": "COMPLETED", "ExitCode": "0:0"})).settled
    # Endings with a signature of their own need no settling.
    assert slurm_ending(SlurmView.from_scontrol(dict(LIVE, ExitCode="0:15"), ENV)).settled
    assert slurm_ending(SlurmView.from_scontrol(dict(LIVE, Reason="TimeLimit"), ENV)).settled


def test_a_cancel_read_as_completed_is_settled_as_cancelled_in_the_entry_and_the_record(tmp_path, capsys):
    _record(tmp_path)
    accounting = SettlingAccounting({"77": "Cancelled by ops"},
                                    [{"JobID": "77", "JobIDRaw": "77", "State": "CANCELLED by 0",
                                      "ExitCode": "0:0", "Start": START}])
    report = _deliver(tmp_path, accounting)
    assert report.delivered == ["77"]
    entries = ac.parse(accounting.comments["77"])
    assert [e["class"] for e in entries] == ["CANCELLED"]
    assert ac.others(accounting.comments["77"]).strip() == "cancelled by ops"
    record = store.read_record(str(tmp_path), "77", store.JOB_LEVEL)
    assert (record["class"], record["slurm_class"], record["settled_from"]) == ("CANCELLED", "CANCELLED", "COMPLETED")
    assert record["slurm_settled"] is True and record["slurm_why"].startswith("accounting: State CANCELLED by 0")
    assert "COMPLETED settled as CANCELLED" in capsys.readouterr().err
    assert list(store.records_needing_queue(str(tmp_path), 0)) == []      # not queued a second time


def test_accounting_that_agrees_changes_only_the_settled_mark(tmp_path):
    _record(tmp_path)
    accounting = SettlingAccounting({"77": ""}, [{"JobID": "77", "JobIDRaw": "77", "State": "COMPLETED",
                                                 "ExitCode": "0:0", "Start": START}])
    _deliver(tmp_path, accounting)
    assert [e["class"] for e in ac.parse(accounting.comments["77"])] == ["COMPLETED"]
    record = store.read_record(str(tmp_path), "77", store.JOB_LEVEL)
    assert record["class"] == "COMPLETED" and record["slurm_settled"] is True and "settled_from" not in record


def test_accounting_a_moment_behind_is_read_again_before_the_entry_goes(tmp_path):
    _record(tmp_path)
    running = {"JobID": "77", "JobIDRaw": "77", "State": "RUNNING", "ExitCode": "0:0", "Start": START}
    accounting = SettlingAccounting({"77": ""}, [running, dict(running, State="FAILED", ExitCode="3:0")])
    _deliver(tmp_path, accounting)
    assert accounting.reads == 2
    assert [(e["class"], e.get("exit")) for e in ac.parse(accounting.comments["77"])] == [("FAILED", 3)]


def test_an_ending_accounting_cannot_settle_goes_as_the_epilog_wrote_it(tmp_path):
    _record(tmp_path)
    running = {"JobID": "77", "JobIDRaw": "77", "State": "RUNNING", "ExitCode": "0:0", "Start": START}
    accounting = SettlingAccounting({"77": ""}, [running])
    report = _deliver(tmp_path, accounting)
    assert report.delivered == ["77"] and accounting.reads == 3
    assert [e["class"] for e in ac.parse(accounting.comments["77"])] == ["COMPLETED"]
    assert store.read_record(str(tmp_path), "77", store.JOB_LEVEL)["slurm_settled"] is False


def test_a_later_run_of_the_job_never_settles_an_earlier_runs_record():
    record = {"class": "COMPLETED", "slurm_class": "COMPLETED", "slurm_settled": False, "started_at": STARTED}
    later = {"State": "CANCELLED by 0", "ExitCode": "0:0", "Start": "2026-12-01T18:05:00"}
    assert settle.settled(record, later) is None
    assert settle.settled(record, dict(later, Start=START))["class"] == "CANCELLED"


def test_a_hardware_cause_survives_settling_where_it_explains_the_new_ending(tmp_path):
    lost = {"kind": "finding", "check": "gpu.lost", "action": "drain", "gpu": 3}
    record = _record(tmp_path, evidence=[lost], node="gpu3")
    assert record["class"] == "COMPLETED"            # hardware never explains a job that ran to its end
    accounting = SettlingAccounting({"77": ""}, [{"JobID": "77", "JobIDRaw": "77", "State": "CANCELLED by 0",
                                                 "ExitCode": "0:0", "Start": START}])
    _deliver(tmp_path, accounting)
    settled = store.read_record(str(tmp_path), "77", "gpu3")
    assert (settled["class"], settled["slurm_class"]) == ("GPU_LOST", "CANCELLED")
    assert [(e["class"], e.get("gpu")) for e in ac.parse(accounting.comments["77"])] == [("GPU_LOST", 3)]


def test_an_item_the_release_before_queued_with_a_copy_of_its_entry_is_settled_and_delivered(tmp_path):
    """An upgrade with entries queued: the release before queued a copy of the entry and a settle
    flag; the delivery takes it as a reference to its record, and settles that."""
    import json

    record = _record(tmp_path)
    [path] = [os.path.join(outbox.outbox_dir(str(tmp_path)), n) for n in os.listdir(outbox.outbox_dir(str(tmp_path)))
              if not n.startswith(".")]
    with open(path, "w") as handle:
        json.dump({"job_id": "77", "entry": store.entry_for(record), "queued_at": STARTED + 2, "settle": True}, handle)
    accounting = SettlingAccounting({"77": ""}, [{"JobID": "77", "JobIDRaw": "77", "State": "CANCELLED by 0",
                                                  "ExitCode": "0:0", "Start": START}])
    assert _deliver(tmp_path, accounting).delivered == ["77"]
    assert [e["class"] for e in ac.parse(accounting.comments["77"])] == ["CANCELLED"]
    assert store.read_record(str(tmp_path), "77", store.JOB_LEVEL)["settled_from"] == "COMPLETED"
    assert outbox.pending(str(tmp_path)) == {}
