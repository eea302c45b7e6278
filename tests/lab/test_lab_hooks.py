"""The project's Prolog, Epilog, EpilogSlurmctld and HealthCheckProgram really ran inside
Slurm: their hook-run journal has an entry per node and job."""
from __future__ import annotations

import subprocess
import time
from typing import Dict, List, Set, Tuple

import hostlist
import pytest

from healthcheck.hooklib.runlog import read_runs

pytestmark = [pytest.mark.lab, pytest.mark.every_release]

NODES = ("gpu1", "gpu2", "gpu3")


def journal(lab) -> List[dict]:
    return [e for e in read_runs(lab.paths.state) if e.get("time", 0) >= lab.started_at - 1]


def seen(lab) -> Set[Tuple[str, str, str]]:
    """(hook, node, job_id) of every journal entry since the session began."""
    return {(e.get("hook"), e.get("node"), str(e.get("job_id"))) for e in journal(lab)}


def expected_entries(scenario_run) -> Dict[str, Set[Tuple[str, str, str]]]:
    wanted: Dict[str, Set[Tuple[str, str, str]]] = {}
    for row in scenario_run["results"]:
        if not row["job_id"]:
            continue
        job = row.get("raw_job_id") or row["job_id"]     # the hooks' SLURM_JOB_ID (an array task's raw id)
        nodes = hostlist.expand_hostlist(row["nodes"])
        entries = {("prolog", node, job) for node in nodes} | {("epilog", node, job) for node in nodes}
        entries.add(("epilog_slurmctld", "slurmctld", job))
        wanted[f"{row['scenario']} ({row['role']}) job {job}"] = entries
    return wanted


def test_every_job_has_prolog_epilog_and_epilog_slurmctld_entries(lab, scenario_run):
    wanted = expected_entries(scenario_run)
    assert len(wanted) >= 14
    deadline = time.monotonic() + 20  # the node-fail Epilog runs once its slurmd is back
    while True:
        have = seen(lab)
        missing = {label: sorted(entries - have) for label, entries in wanted.items() if entries - have}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not missing


def test_three_node_job_ran_hooks_on_each_node(lab, scenario_run):
    job = scenario_run["by_name"]["three-nodes"][0]["job_id"]
    have = seen(lab)
    for node in NODES:
        assert ("prolog", node, job) in have and ("epilog", node, job) in have


def test_healthcheck_ran_on_every_node(lab, scenario_run):
    entries = [e for e in journal(lab) if e.get("hook") == "healthcheck"]
    assert {e["node"] for e in entries} >= set(NODES)


def test_healthcheck_wrapper_needs_nothing_but_slurmd_nodename(lab):
    """What slurmd gives HealthCheckProgram: SLURMD_NODENAME, no PATH, no SLURM_CONF."""
    proc = subprocess.Popen(["/usr/bin/env", "-i", "SLURMD_NODENAME=gpu2", lab.paths.hook("healthcheck")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "config unusable" not in err and "config unreadable" not in err
    mine = [e for e in journal(lab) if e.get("hook") == "healthcheck" and e.get("pid") == proc.pid]
    assert mine and mine[0]["node"] == "gpu2"
