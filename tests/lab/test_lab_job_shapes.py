"""Every job shape on the real cluster (issues 19 and 24): array tasks and heterogeneous
components each get their own AdminComment entry and `slurm-gpu job` view, by the id sacct shows
and by their raw id; a requeued job keeps each run's ending; an admin's own AdminComment text
survives our entries; a 60-task array and the jobs after it all reach AdminComment while a
malformed queue file sits in the outbox. All but the 60-task array run on every release
(`every_release`); that one on the default release."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

import pytest

from healthcheck.records import admin_comment as ac

from ..conftest import builtin_settings
from .conftest import slurm_gpu, wait_for

SETTLE_S = 3.0                   # how long a job's rows must stay unchanged before a test writes to one

pytestmark = pytest.mark.lab


def sacct(lab, job: str, fields: str = "JobID,JobIDRaw,State,AdminComment", *extra: str) -> List[Dict[str, str]]:
    result = lab.run("sacct", "-X", "-n", "-P", "-j", job, "-o", fields, *extra)
    assert result.returncode == 0, result.stderr
    names = fields.split(",")
    return [dict(zip(names, line.split("|", len(names) - 1))) for line in result.stdout.splitlines() if line]


def view(lab, job: str) -> dict:
    result = slurm_gpu("job", job, "--json", env=lab.env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def state_dir(lab) -> str:
    from healthcheck.config import Config

    return Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).state_dir


def submit(lab, *args: str) -> str:
    result = lab.run("sbatch", "--parsable", "-o", "/dev/null", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


@pytest.mark.every_release
def test_each_array_task_has_its_own_entry_and_is_shown_by_either_id(lab, scenario_run):
    tasks = [r for r in scenario_run["by_name"]["array"]]
    assert len(tasks) == 4 and all(r["ok"] for r in tasks), tasks
    raws = set()
    for task in tasks:
        shown, raw = task["job_id"], task["raw_job_id"]
        assert "_" in shown and raw.isdigit(), task
        raws.add(raw)
        [row] = sacct(lab, shown)
        assert row["JobIDRaw"] == raw
        entries = ac.parse(row["AdminComment"])
        assert [(e["node"], e["class"]) for e in entries] == [("*", "COMPLETED")], row
        for asked in (shown, raw):
            seen = view(lab, asked)
            assert (seen["shown_job_id"], seen["raw_job_id"], seen["class"]) == (shown, raw, "COMPLETED"), seen
    assert len(raws) == 4


@pytest.mark.every_release
def test_each_het_component_has_its_own_entry(lab, scenario_run):
    parts = scenario_run["by_name"]["hetjob"]
    assert [r["job_id"].split("+")[1] for r in parts] == ["0", "1"] and all(r["ok"] for r in parts), parts
    for part in parts:
        # `sacct -j <leader's raw id>` lists every component: the row is the one of that raw id
        rows = sacct(lab, part["raw_job_id"], "JobID,JobIDRaw,NodeList,AdminComment")
        [row] = [r for r in rows if r["JobIDRaw"] == part["raw_job_id"]]
        [entry] = ac.parse(row["AdminComment"])
        assert row["JobID"] == part["job_id"] and entry["class"] == "COMPLETED"
        # its own node, on every release: scontrol's NodeList of the component (on 22.05
        # EpilogSlurmctld's SLURM_JOB_NODELIST is the leader's; on 24.11 it is the component's)
        assert entry["nodes"].lower() == row["NodeList"].lower() == part["nodes"].lower(), (entry, row, part)
        assert view(lab, part["job_id"])["raw_job_id"] == part["raw_job_id"]


def _entry_lands_on_one_row_alone(lab, job: str, rows_wanted: int, target: str, node: str) -> None:
    """Deliver an entry to ``target`` (a raw id) of ``job`` as the delivery does, once every row of
    ``job`` has its own entry; every other row keeps what it had."""
    from healthcheck.records import outbox
    from healthcheck.slurm.cli_backend import CliBackend
    from healthcheck.slurm.job_accounting import SlurmAccounting
    from slurm_hooks.lab.commands import slurm_env

    seen: Dict[str, Any] = {"rows": None, "since": 0.0}

    def every_entry() -> Optional[Dict[str, Dict[str, str]]]:
        # Every row with its entry, and no row changed for a few seconds: a delivery still under
        # way (a node epilog's background round, a settled class) would change a row under the test.
        rows = {r["JobIDRaw"]: r for r in sacct(lab, job, "JobID,JobIDRaw,NodeList,AdminComment")}
        if rows != seen["rows"]:
            seen.update(rows=rows, since=time.monotonic())
        settled = time.monotonic() - seen["since"] >= SETTLE_S
        return rows if settled and len(rows) == rows_wanted and all(ac.parse(r["AdminComment"]) for r in rows.values()) else None
    rows = wait_for(f"job {job}'s {rows_wanted} entries, unchanged for {SETTLE_S:g} s", every_entry, timeout=90)
    backend = CliBackend(bin_dir=lab.paths.bin, slurm_conf=lab.paths.slurm_conf, env=slurm_env(lab.paths), timeout_s=30)
    entry = {"node": node, "class": "NODE_FAIL"}
    written = outbox.write_entries(SlurmAccounting(backend), target, [entry], builtin_settings(outbox.DeliverySettings, jitter_s=0))
    assert written.delivered, written
    after = {r["JobIDRaw"]: r for r in sacct(lab, job, "JobID,JobIDRaw,NodeList,AdminComment")}
    assert ac.contains(after[target]["AdminComment"], entry), after
    for raw, row in rows.items():
        if raw != target:
            assert after[raw]["AdminComment"] == row["AdminComment"], (rows, after)


@pytest.mark.every_release
def test_an_entry_delivered_to_a_het_leader_lands_on_the_leaders_row_alone(lab):
    """`sacctmgr modify job where jobid=<leader>` changes every component's row: a component's own
    entry was replaced by the leader's when the leader's delivery came second (seen on 26.05,
    measured on every release). The delivery writes the leader's row by `<leader>+0`."""
    leader = submit(lab, "-w", "gpu2", "--gres=gpu:1", ":", "-w", "gpu3", "--gres=gpu:1", "--wrap", "true")
    _entry_lands_on_one_row_alone(lab, leader, 2, leader, "gpu2")
    [component] = [r for r in sacct(lab, leader, "JobID,JobIDRaw,NodeList,AdminComment") if r["JobIDRaw"] != leader]
    [own] = ac.parse(component["AdminComment"])
    assert own["nodes"].lower() == component["NodeList"].lower() == "gpu3", component


@pytest.mark.every_release
def test_an_entry_delivered_to_the_array_task_that_keeps_the_arrays_id_lands_on_its_row_alone(lab):
    """`sacctmgr modify job where jobid=<array>` (the raw id of the array's last task) changes every
    task's row (measured on 22.05 and 24.11: one task's entry replaced the others'). The delivery
    writes that task's row by `<array>_<task>`."""
    array = submit(lab, "--array=1-3", "-p", "low", "--wrap", "true")
    _entry_lands_on_one_row_alone(lab, array, 3, array, "gpu1")


@pytest.mark.every_release
def test_a_requeued_job_keeps_the_ending_of_each_run(lab, scenario_run):
    from healthcheck.records import store

    main = scenario_run["by_name"]["preempt-requeue"][0]
    runs = store.earlier_runs(state_dir(lab), main["raw_job_id"])
    # the first run ended preempted and requeued, the last one completed: both endings kept
    [first] = [r for r in runs if r["node"] == "*"]
    latest = store.read_record(state_dir(lab), main["raw_job_id"], "*")
    assert latest["class"] == "COMPLETED" and latest["restarts"] > first["restarts"], (first, latest)
    assert first["class"] != "COMPLETED" and first["started_at"] < latest["started_at"], (first, latest)
    entries = ac.parse(sacct(lab, main["job_id"])[0]["AdminComment"])
    assert entries[-1]["class"] == "COMPLETED" and entries[-1]["run"] == latest["restarts"], entries
    assert view(lab, main["job_id"])["class"] == "COMPLETED"


@pytest.mark.every_release
def test_an_admins_own_admin_comment_survives_our_entry(lab):
    note = "Admin: node swap 'scheduled' by ops"
    job = submit(lab, "-w", "gpu2", "--gres=gpu:1", "--wrap", "sleep 5")
    wait_for(f"job {job} running", lambda: "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout)
    result = lab.run("scontrol", "update", f"jobid={job}", f"AdminComment={note}")
    assert result.returncode == 0, result.stderr
    def ours() -> Optional[str]:
        rows = sacct(lab, job)
        return rows[0]["AdminComment"] if rows and ac.parse(rows[0]["AdminComment"]) else None
    comment = wait_for(f"job {job}'s entry", ours, timeout=90)
    assert [e["class"] for e in ac.parse(comment)] == ["COMPLETED"]
    # what accounting stored of the admin's text (22.05's sacctmgr lower-cases on our write) stays whole
    assert ac.others(comment).lower().replace("`", "'") == note.lower(), comment


def test_a_60_task_array_and_the_jobs_after_it_reach_admin_comment_past_a_malformed_queue_file(lab):
    from healthcheck.safeio import fsutil

    outbox = os.path.join(state_dir(lab), "outbox")
    fsutil.ensure_dir(outbox)
    bad = os.path.join(outbox, "999999._job.json")
    with open(bad, "w") as handle:
        json.dump({"job_id": "999999 -j 1", "entry": "x", "queued_at": "x"}, handle)
    array = submit(lab, "--array=1-60", "-p", "low", "--gres=gpu:1", "--wrap", "true")
    after = [submit(lab, "-w", node, "--gres=gpu:1", "--wrap", "exit 3") for node in ("gpu1", "gpu2", "gpu3")]

    def missing() -> List[str]:
        rows = sacct(lab, ",".join([array] + after))
        done = {r["JobID"] for r in rows if ac.parse(r["AdminComment"])}
        wanted = {f"{array}_{task}" for task in range(1, 61)} | set(after)
        return sorted(wanted - done)
    wait_for("every task and the jobs after it in AdminComment", lambda: not missing(), timeout=400, every=3)
    for job in after:
        assert ac.parse(sacct(lab, job)[0]["AdminComment"])[0]["class"] == "FAILED"
    assert not os.path.exists(bad) and os.path.exists(bad + ".corrupt")


@pytest.mark.every_release
def test_an_admins_cancel_note_survives_our_cancelled_entry(lab):
    """25.11 added `scancel --admin-comment`; before it an admin notes with scontrol, then cancels."""
    note = "Cancelled by ops: GPU swap on gpu3"
    job = submit(lab, "-w", "gpu3", "--gres=gpu:1", "--wrap", "sleep 120")
    wait_for(f"job {job} running", lambda: "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout)
    if "--admin-comment" in lab.run("scancel", "--help").stdout:
        cancelled = lab.run("scancel", f"--admin-comment={note}", job)
    else:
        noted = lab.run("scontrol", "update", f"jobid={job}", f"AdminComment={note}")
        assert noted.returncode == 0, noted.stderr
        cancelled = lab.run("scancel", job)
    assert cancelled.returncode == 0, cancelled.stderr

    def both() -> Optional[str]:
        rows = sacct(lab, job)
        text = rows[0]["AdminComment"] if rows else ""
        return text if ac.parse(text) and ac.others(text) else None
    comment = wait_for(f"job {job}'s entry beside the note", both, timeout=90)
    assert [e["class"] for e in ac.parse(comment)] == ["CANCELLED"], comment
    assert ac.others(comment).lower() == note.lower(), comment
