"""``slurm-gpu summary`` on the real cluster after the scenarios: its counts per cause match the
jobs the scenarios ran (every incarnation of the requeued one), and its GPU-hours match each
job's allocated GPUs x elapsed time, both read here with sacct itself."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from healthcheck.records import admin_comment
from healthcheck.records.classes import is_hardware
from healthcheck.records.classify import job_class
from slurm_hooks.lab.scenarios import load_table, state_matches

pytestmark = pytest.mark.lab

TABLE = {s.name: s for s in load_table()}


def job_order(job_id):
    """Numeric order of a job id as sacct shows it: 524, an array task 524_7, a het component 20+1."""
    return tuple(int(part) for part in re.split(r"[_+]", job_id))


def scenario_jobs(scenario_run):
    return [r for r in scenario_run["results"] if r["job_id"] and r["produced"]]


def incarnations(lab, job_ids):
    """Every incarnation of the jobs, straight from sacct: (job, State, GPUs, elapsed, AdminComment)."""
    result = lab.run("sacct", "-D", "-X", "-n", "-P", "--delimiter=\x1f", "-j", ",".join(job_ids),
                     "-o", "JobIDRaw,State,AllocTRES,ElapsedRaw,AdminComment")
    assert result.returncode == 0, result.stderr
    rows = []
    for line in result.stdout.splitlines():
        job, state, tres, elapsed, comment = line.split("\x1f")
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        rows.append((job, state, int(gpus.group(1)) if gpus else 0, int(elapsed), comment))
    return rows


def documented_cause(state, comment):
    """The rule docs/summary.md states: a node's hardware entry (the strongest), else a node's
    GPU_OOM over a job-level FAILED, else our job-level entry, else the first word of sacct's State."""
    entries = admin_comment.parse(comment)
    job_level = [e for e in entries if e.get("node") == "*"]
    hardware = [e for e in entries if e.get("node") != "*" and is_hardware(e.get("class", ""))]
    if hardware:
        return job_class(hardware)
    gpu_oom = [e for e in entries if e.get("node") != "*" and e.get("class") == "GPU_OOM"]
    if gpu_oom and (not job_level or job_level[-1]["class"] == "FAILED"):
        return "GPU_OOM"
    if job_level:
        return job_level[-1]["class"]
    return state.split(" ")[0]


@pytest.fixture(scope="module")
def summary_run(lab, scenario_run, cli):
    jobs = scenario_jobs(scenario_run)
    assert jobs, "the scenarios ran no job"
    ids = sorted({r["job_id"] for r in jobs}, key=job_order)
    since = f"@{int(lab.started_at) - 120}"
    result = cli("summary", "--json", "--jobs", "--since", since, "--job", ",".join(ids), env=lab.env, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), incarnations(lab, ids), jobs


def test_counts_per_cause_match_the_scenarios(summary_run):
    report, rows, jobs = summary_run
    expected = Counter(documented_cause(state, comment) for _, state, _, _, comment in rows)
    assert {cause: row["jobs"] for cause, row in report["by_cause"].items()} == dict(expected)
    # every incarnation counts: the requeued scenario's job is there twice
    requeued = [r["job_id"] for r in jobs if r["scenario"] == "preempt-requeue" and r["role"] == "job"]
    assert [row["job"] for row in report["job_rows"]].count(requeued[0]) == 2
    assert report["jobs"] == len(rows) == len(jobs) + 1


def test_each_scenario_job_has_the_cause_its_ending_gives(summary_run):
    report, _, jobs = summary_run
    causes = {}
    for row in report["job_rows"]:
        causes.setdefault(row["job"], []).append(row["cause"])
    for result in jobs:
        scenario = TABLE[result["scenario"]]
        final = causes[result["job_id"]][-1]
        if result["role"] != "job":
            assert final == "COMPLETED"
        elif scenario.expect_class:
            assert final == scenario.expect_class, (result["scenario"], final)
        elif not admin_comment.parse(result["admin_comment"]):
            assert state_matches(final, scenario.expect["state"].split(" ")[0]), (result["scenario"], final)


def test_gpu_hours_are_allocated_gpus_times_elapsed(summary_run):
    report, rows, _ = summary_run
    seconds = Counter()
    for _, state, gpus, elapsed, comment in rows:
        seconds[documented_cause(state, comment)] += gpus * elapsed
    assert sum(seconds.values()) > 0
    for cause, total in seconds.items():
        assert report["by_cause"][cause]["gpu_hours"] == pytest.approx(total / 3600, abs=1e-3), cause
    assert report["gpu_hours"] == pytest.approx(sum(seconds.values()) / 3600, abs=1e-3)


def test_drained_nodes_and_drain_history_come_from_the_cluster(summary_run):
    report, _, _ = summary_run
    assert isinstance(report["drained"], list)
    assert not [note for note in report["notes"] if "not known" in note or "not counted" in note]
    assert {"gpu1", "gpu2", "gpu3"} <= {n["node"] for n in report["by_node"]}
