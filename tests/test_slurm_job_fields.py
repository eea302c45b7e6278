"""A job's state fields cannot be forged through the text a user chooses (issue 14 part 2).

``scontrol show job -o`` does not quote values: a job submitted with
``--comment "x JobState=PREEMPTED ..."`` or ``-J "train JobState=NODE_FAIL ..."`` prints a second
JobState pair, and the epilog classified the job by whichever one the parser kept. The fixtures
are real output of the lab (Slurm 22.05.8): ``tests/fixtures/slurm/README.md`` says how each was
made. The lab test (tests/lab/test_lab_job_classes.py) submits such jobs to the real cluster."""
from __future__ import annotations

from pathlib import Path

import pytest

from healthcheck.records.classify import SlurmView, slurm_ending
from healthcheck.slurm import SlurmError
from healthcheck.slurm.cli_backend import (JOB_STATE_KEYS, CliBackend, parse_scontrol_job, parse_scontrol_record,
                                           parse_squeue_job, squeue_job_argv)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def job_line(name: str) -> str:
    return fixture(name).splitlines()[0]


FORGED = "scontrol-show-job-forged-comment.txt"              # exit 3, name and comment forged
FORGED_SQUEUE = "squeue-job-state-forged-comment.txt"
FORGED_NAME = "scontrol-show-job-forged-name.txt"            # sleep 3, the name forges a whole prefix
FORGED_NAME_SQUEUE = "squeue-job-state-forged-name.txt"


class Canned(CliBackend):
    """The real backend over canned command output (what each binary printed, or a failure)."""

    def __init__(self, **outputs):
        super().__init__(bin_dir="/nonexistent")
        self.outputs = outputs
        self.argvs = []

    def run(self, name, args, timeout_s=None):
        self.argvs.append([name, *args])
        out = self.outputs[name]
        if isinstance(out, Exception):
            raise out
        return out


def job_id_of(line: str) -> str:
    return line.split(" ", 1)[0].split("=", 1)[1]


# -- the finding, reproduced on the real record -------------------------------------------------

def test_the_raw_record_is_ambiguous_a_plain_parse_takes_the_users_job_state():
    line = job_line(FORGED)
    assert line.count(" JobState=") == 3                     # the name's, Slurm's, the comment's
    assert parse_scontrol_record(line)["JobState"] == "PREEMPTED"
    assert slurm_ending(SlurmView.from_scontrol(parse_scontrol_record(line))).cls == "PREEMPTED"


def test_the_job_reads_what_really_happened_from_squeue():
    line = job_line(FORGED)
    job = Canned(scontrol=fixture(FORGED), squeue=fixture(FORGED_SQUEUE)).job(job_id_of(line))
    assert (job.get("JobState"), job.get("Reason"), job.get("ExitCode")) == ("FAILED", "NonZeroExitCode", "3:0")
    assert job.get("PreemptTime") == "None" and job.problem == ""
    ending = slurm_ending(SlurmView.from_scontrol(job.fields))
    assert (ending.cls, ending.exit) == ("FAILED", 3)


def test_a_name_that_forges_the_whole_start_of_the_record_changes_nothing():
    line = job_line(FORGED_NAME)
    job = Canned(scontrol=fixture(FORGED_NAME), squeue=fixture(FORGED_NAME_SQUEUE)).job(job_id_of(line))
    assert job.get("JobState") == "COMPLETED" and job.get("Reason") == "None" and job.get("PreemptTime") == "None"
    assert slurm_ending(SlurmView.from_scontrol(job.fields)).cls == "COMPLETED"
    # the same job while it waited: scontrol printed no PreemptTime of its own then
    pending = Canned(scontrol=fixture("scontrol-show-job-forged-name-pending.txt"),
                     squeue=fixture("squeue-job-state-forged-name-pending.txt")).job(job_id_of(line))
    assert "PreemptTime=None" not in fixture("scontrol-show-job-forged-name-pending.txt")
    assert (pending.get("JobState"), pending.get("Reason"), pending.get("PreemptTime")) == ("PENDING", "Priority", "None")
    assert (pending.get("StartTime"), pending.get("EndTime"), pending.get("NodeList")) == ("Unknown", "Unknown", "")


def test_squeue_is_asked_for_that_one_job_and_fields_no_user_chooses():
    argv = squeue_job_argv("42")
    assert argv[:6] == ["--local", "-h", "-t", "all", "-j", "42"]      # no federation lookup
    asked = {field.split(":")[0].lower() for field in argv[-1].split(",")}
    assert {"state", "reason", "exit_code", "preempttime", "restartcnt"} <= asked
    assert not {"name", "comment", "workdir", "command", "stdout", "stderr", "stdin", "admin_comment"} & asked


# -- the fallback: scontrol alone, when squeue cannot answer -----------------------------------

@pytest.mark.parametrize("name", [FORGED, FORGED_NAME])
def test_without_squeue_a_forged_record_gives_no_state_fields_rather_than_the_users(name):
    line = job_line(name)
    fields, problem = parse_scontrol_job(line)
    assert not set(JOB_STATE_KEYS) & set(fields), fields
    assert problem.startswith("scontrol show job: state fields left out")
    job = Canned(scontrol=fixture(name), squeue=SlurmError("squeue: Unable to contact slurm controller")).job(
        job_id_of(line))
    assert "JobState" not in job.fields and "squeue: Unable to contact" in job.problem
    # the epilog then classifies from its environment alone: exit 3 is still FAILED, never PREEMPTED
    ending = slurm_ending(SlurmView.from_scontrol(job.fields, {"SLURM_JOB_EXIT_CODE2": "3:0"}))
    assert ending.cls == "FAILED"


def test_without_squeue_an_ordinary_record_is_trusted():
    lines = fixture("scontrol-show-job-endings.txt").splitlines()
    for line in lines:
        fields, problem = parse_scontrol_job(line)
        assert problem == "" and fields["JobState"] and "NodeList" in fields, line
    job = Canned(scontrol=lines[0] + "\n", squeue=SlurmError("timed out after 15 s")).job(job_id_of(lines[0]))
    assert job.get("JobState") == parse_scontrol_record(lines[0])["JobState"]
    assert job.problem == "squeue: timed out after 15 s"


def _edit(line: str, old: str, new: str) -> str:
    assert old in line
    return line.replace(old, new, 1)


def test_forging_a_key_slurm_left_out_is_caught_too():
    """A requeued job's record, seen from the epilog, has no PreemptTime: a comment that adds one
    adds no duplicate, but it comes after NodeList, where no state key is."""
    line = job_line("scontrol-show-job-endings.txt")
    without = " ".join(part for part in line.split(" ") if not part.startswith("PreemptTime="))
    forged = _edit(without, " StdErr=", " Comment=x PreemptTime=2026-11-30T17:46:01 StdErr=")
    fields, problem = parse_scontrol_job(forged)
    assert "PreemptTime" not in fields and "PreemptTime" in problem
    named = _edit(without, " UserId=", " PreemptTime=2026-11-30T17:46:01 UserId=")
    fields, problem = parse_scontrol_job(named)
    assert "PreemptTime" not in fields and "job name" in problem


# -- squeue's spellings as scontrol's --------------------------------------------------------

def test_squeue_state_fields_equal_scontrols_for_every_ending_of_the_lab():
    """Every job of a scenario run (completed, failed, cancelled, timeout, preempted, requeued,
    node failure, out of memory, held after a prolog failure): squeue, read as scontrol's keys,
    says what scontrol says. (scontrol leaves PreemptTime out for some jobs; squeue says None.)"""
    scontrol = {}
    for line in fixture("scontrol-show-job-endings.txt").splitlines():
        fields, _ = parse_scontrol_job(line)
        scontrol[fields["JobId"]] = fields
    lines = fixture("squeue-job-state-endings.txt").splitlines()
    assert len(lines) == len(scontrol) >= 20
    for line in lines:
        job = line.split("|", 1)[0]
        read = parse_squeue_job(line + "\n", job)
        for key in JOB_STATE_KEYS:
            expected = scontrol[job].get(key, "None" if key == "PreemptTime" else None)
            assert read.get(key) == expected, (job, key, read.get(key), expected)
    endings = {slurm_ending(SlurmView.from_scontrol(parse_squeue_job(line, line.split("|", 1)[0]))).cls
               for line in lines}
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"} <= endings


@pytest.mark.parametrize("raw, shown", [("0", "0:0"), ("768", "3:0"), ("256", "1:0"), ("15", "0:15"),
                                        ("9", "0:9"), ("253", "0:125"), ("N/A", None), ("-1", None)])
def test_the_raw_exit_status_is_split_as_scontrol_splits_it(raw, shown):
    line = f"7|FAILED|0|0|{raw}|2026-11-30T17:45:59|2026-11-30T17:46:00|N/A|gpu1|NonZeroExitCode|"
    assert parse_squeue_job(line, "7").get("ExitCode") == shown


def test_squeue_answers_about_another_job_or_nothing_are_no_fields():
    line = "8|FAILED|0|0|768|2026-11-30T17:45:59|2026-11-30T17:46:00|N/A|gpu1|NonZeroExitCode|"
    assert parse_squeue_job(line, "7") == {} and parse_squeue_job("", "7") == {}
    assert parse_squeue_job("7|FAILED|0", "7") == {}
    assert parse_squeue_job("70|FAILED|0|0|768|N/A|N/A|N/A|gpu1|NonZeroExitCode|", "7") == {}


def test_the_line_of_that_job_is_read_when_squeue_prints_several():
    """A heterogeneous job's leader id lists every component, one line each."""
    text = ("7|RUNNING|0|0|0|2026-11-30T17:45:59|Unknown|N/A|gpu1|None|\n"
            "8|RUNNING|0|0|0|2026-11-30T17:45:59|Unknown|N/A|gpu2|None|\n")
    assert (parse_squeue_job(text, "7")["NodeList"], parse_squeue_job(text, "8")["NodeList"]) == ("gpu1", "gpu2")
    assert parse_squeue_job(text, "7")["Reason"] == "None"


def test_a_reason_with_spaces_or_the_separator_stays_whole():
    line = "7|PENDING|1|1|0|N/A|N/A|N/A||launch failed | requeued held|"
    fields = parse_squeue_job(line, "7")
    assert fields["Reason"] == "launch_failed_|_requeued_held"
    assert (fields["StartTime"], fields["EndTime"], fields["NodeList"]) == ("Unknown", "Unknown", "")
