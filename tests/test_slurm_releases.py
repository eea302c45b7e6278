"""The Slurm backend reads what each release really prints: the captures of the lab's 22.05, 24.11
and 26.05 (tests/fixtures/slurm/releases/VERSION, refreshed by scripts/capture-slurm-fixtures),
parsed the way CliBackend reads that release (JSON from 23.02 on, text on 22.05)."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck.slurm.cli_backend import (JSON_SINCE, job_fields_from_json, node_from_json,
                                           parse_scontrol_job, parse_scontrol_record, parse_squeue_job,
                                           parse_version, select_json_job)

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "releases")
RELEASES = sorted(name for name in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, name)))
# Each release the lab runs has its captures (slurm_hooks/data/lab-releases.toml).
EXPECTED = ("22.05", "24.11", "26.05")


def read(release: str, name: str) -> str:
    with open(os.path.join(HERE, release, name), encoding="utf-8") as handle:
        return handle.read()


def captured(release: str) -> dict:
    return json.loads(read(release, "capture.json"))


def fields(release: str, case: str) -> dict:
    """A captured job as CliBackend.job() reads it on that release."""
    job_id = str(captured(release)["jobs"][case])
    if parse_version(read(release, "version.txt")) >= JSON_SINCE:
        item = select_json_job(json.loads(read(release, f"scontrol-json-show-job-{case}.json")), job_id)
        assert item is not None, f"job {job_id} not in the {release} capture"
        return job_fields_from_json(item)
    line = next(line for line in read(release, f"scontrol-show-job-{case}.txt").splitlines()
                if line.startswith("JobId="))
    out, _problem = parse_scontrol_job(line)
    out.update(parse_squeue_job(read(release, f"squeue-job-state-{case}.txt"), job_id))
    return out


def test_every_lab_release_has_captures():
    assert set(EXPECTED) <= set(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_the_version_is_the_release(release):
    assert parse_version(read(release, "version.txt")) == tuple(int(part) for part in release.split("."))


@pytest.mark.parametrize("release", RELEASES)
def test_completed_and_failed_jobs_read_their_state_and_exit_code(release):
    done, failed = fields(release, "completed"), fields(release, "failed")
    assert (done["JobState"], done["ExitCode"], done["Reason"]) == ("COMPLETED", "0:0", "None")
    assert (failed["JobState"], failed["ExitCode"], failed["Reason"]) == ("FAILED", "3:0", "NonZeroExitCode")
    assert failed["NodeList"] == "gpu1" and failed["Restarts"] == "0"
    assert failed["StartTime"][:2] == "20" and failed["EndTime"] >= failed["StartTime"]


@pytest.mark.parametrize("release", RELEASES)
def test_a_name_and_comment_that_forge_state_fields_change_nothing(release):
    forged = fields(release, "forged")
    assert forged["JobState"] == "FAILED" and forged["Reason"] == "NonZeroExitCode"
    assert forged["PreemptTime"] == "None"


@pytest.mark.parametrize("release", [r for r in RELEASES if r >= "23.02"])
def test_json_releases_give_the_user_text_whole(release):
    forged = fields(release, "forged")
    assert forged["JobName"].startswith("x JobState=TIMEOUT")
    assert forged["Comment"].startswith("y JobState=PREEMPTED")


@pytest.mark.parametrize("release", RELEASES)
def test_an_array_task_is_found_by_its_array_id(release):
    array = str(captured(release)["jobs"]["array"])
    if parse_version(read(release, "version.txt")) >= JSON_SINCE:
        doc = json.loads(read(release, "scontrol-json-show-job-array-task.json"))
        task = job_fields_from_json(select_json_job(doc, f"{array}_2"))
    else:
        line = next(line for line in read(release, "scontrol-show-job-array-task.txt").splitlines()
                    if line.startswith("JobId="))
        task = parse_scontrol_record(line)
    assert (task["ArrayJobId"], task["ArrayTaskId"]) == (array, "2")
    assert task["JobState"] == "COMPLETED"


@pytest.mark.parametrize("release", RELEASES)
def test_a_drained_node_reads_its_state_reason_and_who(release):
    if parse_version(read(release, "version.txt")) >= JSON_SINCE:
        doc = json.loads(read(release, "scontrol-json-show-node-drained.json"))
        node = node_from_json(next(item for item in doc["nodes"] if item["name"] == "gpu3"))
    else:
        from healthcheck.slurm.cli_backend import CliBackend

        line = read(release, "scontrol-show-node-drained.txt").strip()
        node = CliBackend()._node_from_fields(parse_scontrol_record(line))
    assert node.drained and node.responding
    assert node.reason.startswith("gpu-hooks: v1 capture gpu0")
    assert node.reason_user == "root" and node.reason_epoch is not None


@pytest.mark.parametrize("release", RELEASES)
def test_sacct_json_has_the_jobs(release):
    doc = json.loads(read(release, "sacct-json-failed.json"))
    job_id = captured(release)["jobs"]["failed"]
    assert [job["job_id"] for job in doc["jobs"]] == [int(job_id)]


def test_a_json_job_in_its_epilogs_shows_the_ending_behind_completing():
    """24.11 in the lab: a scancel'd job's epilog saw job_state ["CANCELLED", "COMPLETING"] with
    exit code 0:0, and the text-like "COMPLETING" classed it COMPLETED."""
    from healthcheck.records.classify import SlurmView, slurm_ending
    from healthcheck.slurm.cli_backend import job_fields_from_json

    def ending(states):
        fields = job_fields_from_json({"job_id": 7, "job_state": states, "state_reason": "None",
                                       "exit_code": {"return_code": {"set": True, "number": 0},
                                                     "signal": {"id": {"set": False, "number": 0}}}})
        return fields["JobState"], slurm_ending(SlurmView(job_state=fields["JobState"], reason="None",
                                                          exit_code=fields["ExitCode"])).cls

    assert ending(["CANCELLED", "COMPLETING"]) == ("CANCELLED", "CANCELLED")
    assert ending(["COMPLETED", "COMPLETING"]) == ("COMPLETING", "COMPLETED")
    assert ending(["RUNNING"])[0] == "RUNNING"
