"""A site's scale on the real lab (issue 30), kept small enough for the test command: 32 nodes
(`slurm-gpu lab up --nodes 32`) and an array of 200 one-GPU tasks ending within a minute. Every
task's record reaches accounting, no node is drained, and what the hooks asked slurmctld (sdiag,
zeroed first) stays within docs/scale.md's targets: the healthy prologs and health checks ask
nothing past each node's first health check of its boot, each node epilog and the EpilogSlurmctld
read the job once each (no federation lookup).

bench/scale measures the same with the hooks off beside it, at 64 and 256 nodes."""
from __future__ import annotations

import json

import pytest

from healthcheck.records import admin_comment as ac
from slurm_hooks.lab import scale

from .conftest import slurm_gpu, wait_for

pytestmark = pytest.mark.lab

NODES, TASKS = 32, 200
NODE_READS = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


@pytest.fixture
def wide(lab):
    up = slurm_gpu("lab", "up", "--nodes", str(NODES), env=lab.env, timeout=900)
    assert up.returncode == 0, up.stderr
    try:
        wait_for(f"{NODES} idle nodes", lambda: len(idle_nodes(lab)) >= NODES, timeout=300, every=3)
        yield lab
    finally:
        back = slurm_gpu("lab", "up", env=lab.env, timeout=900)
        assert back.returncode == 0, back.stderr


def idle_nodes(lab) -> set:
    words = lab.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()    # a line per node and partition
    return {node for node, state in zip(words[::2], words[1::2]) if state == "idle"}


def rows(lab, job: str):
    out = lab.run("sacct", "-X", "-n", "-P", "-j", job, "-o", "JobID,State,AdminComment", timeout=120).stdout
    return [line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2]


def test_a_200_task_array_on_32_nodes_records_every_task_and_asks_slurmctld_little(wide):
    lab = wide
    assert lab.run("sdiag", "-r").returncode == 0
    submitted = lab.run("sbatch", "--parsable", f"--array=0-{TASKS - 1}", "--gres=gpu:1", "-t", "5",
                        "-o", "/dev/null", "--wrap", "sleep 2")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()

    # sacct only while waiting: it asks slurmdbd, so sdiag counts what the hooks asked, not the test
    def ended():
        found = rows(lab, job)
        return found if len(found) >= TASKS and all(r[1].split()[0] in FINAL for r in found) else None
    tasks = wait_for(f"{TASKS} tasks of {job} to end", ended, timeout=900, every=5)
    assert {r[1] for r in tasks} == {"COMPLETED"}, sorted({r[1] for r in tasks})

    def recorded():
        found = rows(lab, job)
        missing = [r[0] for r in found if not ac.parse(r[2])]
        return found if not missing else None
    records = wait_for(f"every task's record of {job} in accounting", recorded, timeout=300, every=5)
    assert {e.get("class") for r in records for e in ac.parse(r[2])} == {"COMPLETED"}

    rpcs = scale.parse_sdiag(lab.run("sdiag").stdout)["by_type"]
    shown = json.dumps(rpcs, sort_keys=True)          # a string: pytest shows it whole
    # one job read per node epilog and one by the EpilogSlurmctld (scontrol --local --json show
    # job), no federation lookup: a one-node job costs slurmctld 2 RPCs of ours
    assert rpcs.get("REQUEST_FED_INFO", 0) == 0, shown
    assert rpcs.get("REQUEST_JOB_INFO_SINGLE", 0) <= 2 * TASKS, shown
    # a node read (scontrol show node: REQUEST_NODE_INFO + REQUEST_PARTITION_INFO) only at a
    # node's first health check of its boot (the nodes `lab up --nodes` just started), none per job
    node_reads = sum(rpcs.get(name, 0) for name in NODE_READS)
    assert node_reads <= 2 * NODES, shown
    assert scale.hook_rpcs(rpcs) <= 2 * TASKS + 2 * NODES, shown
    assert rpcs.get("REQUEST_UPDATE_NODE", 0) == 0, shown              # no drain, no note
    assert lab.run("sinfo", "-R", "-h").stdout.strip() == ""
