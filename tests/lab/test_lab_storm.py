"""The storm (issue 14 part 2) on the real lab: a fault on every node at once while jobs start
and end, with the drain budget at one node. Every hook that drains (the health check every
10 s on each node, the prologs of the jobs that start, the epilogs of the jobs that end) sees
the fault at about the same moment; the budget lets exactly one node be drained, by us, and no
node is drained by Slurm for a hook's non-zero exit. Every job is still classified in
accounting and keeps its record files in the state dir.

It rewrites the lab's hooks config (the hooks read it at every run) and puts everything back in
a finally: the faults, our drains, the budget."""
from __future__ import annotations

import time
from typing import Dict, List

import pytest

from healthcheck.config import Config
from healthcheck.records import admin_comment as ac
from healthcheck.records import store
from healthcheck.slurm.cli_backend import CliBackend
from slurm_hooks.lab.commands import slurm_env

from .conftest import slurm_gpu, wait_for

pytestmark = pytest.mark.lab

NODES = ("gpu1", "gpu2", "gpu3")
PREFIX = "gpu-hooks: v1 "
# A double-bit ECC error on every GPU: whichever GPU a job gets, its prolog and epilog see it.
FAULT = [f"gpu.{gpu}.ecc.volatile_uncorrected=2" for gpu in range(8)]
BEFORE, DURING = 9, 12          # jobs running when the fault comes, jobs started into it
BUDGET_LINE = "budget_max_nodes = 3"


def backend(lab) -> CliBackend:
    return CliBackend(bin_dir=lab.paths.bin, slurm_conf=lab.paths.slurm_conf, env=slurm_env(lab.paths), timeout_s=20)


def submit(lab, seconds: float) -> str:
    result = lab.run("sbatch", "--parsable", "-o", "/dev/null", "--no-requeue", "--gres=gpu:1",
                     "-J", "storm", "--wrap", f"sleep {seconds}")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def sacct_rows(lab, jobs: List[str]) -> Dict[str, Dict[str, str]]:
    result = lab.run("sacct", "-X", "-n", "-P", "--delimiter=\x1f", "-j", ",".join(jobs),
                     "-o", "JobID,State,NodeList,AdminComment")
    rows = {}
    for line in result.stdout.splitlines():
        values = line.split("\x1f")
        if len(values) == 4:
            rows[values[0]] = {"State": values[1], "NodeList": values[2], "AdminComment": values[3]}
    return rows


def ended(lab, jobs: List[str]) -> bool:
    shown = lab.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%T")
    return shown.returncode == 0 and not shown.stdout.split()


def restore(lab, original: str) -> None:
    with open(lab.paths.hooks_config, "w", encoding="utf-8") as handle:
        handle.write(original)
    slurm = backend(lab)
    for node in NODES:
        slurm_gpu("sim", "reset", node, env=lab.env)
    for node in NODES:
        info = slurm.node(node)
        if info.drained and (info.reason.startswith(PREFIX) or info.reason in ("Prolog error", "Epilog error")):
            slurm.resume(node)
    time.sleep(2)           # resumed nodes are idle* until the next ping


def test_a_fault_on_every_node_with_a_budget_of_one_drains_one_and_loses_no_job(lab):
    with open(lab.paths.hooks_config, encoding="utf-8") as handle:
        original = handle.read()
    assert BUDGET_LINE in original
    state_dir = Config.load(lab.paths.hooks_config).state_dir
    jobs: List[str] = []
    try:
        with open(lab.paths.hooks_config, "w", encoding="utf-8") as handle:
            handle.write(original.replace(BUDGET_LINE, "budget_max_nodes = 1"))
        slurm = backend(lab)
        jobs += [submit(lab, 8) for _ in range(BEFORE)]
        wait_for("the first jobs running", lambda: len(lab.run("squeue", "-h", "-t", "R", "-j", ",".join(jobs),
                                                               "-o", "%i").stdout.split()) >= BEFORE // 2)
        for node in NODES:                       # as close to "at once" as three commands get
            result = slurm_gpu("sim", "inject", node, *FAULT, env=lab.env)
            assert result.returncode == 0, result.stderr
        for _ in range(DURING):                  # jobs start and end while every hook sees the fault
            jobs.append(submit(lab, 1))
            time.sleep(0.5)
        deadline = time.monotonic() + 240
        while not ended(lab, jobs):
            if time.monotonic() > deadline:     # e.g. every node drained: the queue cannot move
                states = {node: (info.state, info.reason) for node, info in
                          ((node, slurm.node(node)) for node in NODES)}
                pytest.fail(f"storm jobs still queued after 240 s; nodes: {states}", pytrace=False)
            time.sleep(1)
        # the health check's own runs come every 10 s: give the last drains and undos time to settle
        time.sleep(12)
        nodes = {node: slurm.node(node) for node in NODES}
        drained = {name: info.reason for name, info in nodes.items() if info.drained or info.down}
        assert len(drained) == 1, {name: (info.state, info.reason) for name, info in nodes.items()}
        assert next(iter(drained.values())).startswith(PREFIX + "gpu.ecc.uncorrectable"), drained

        def classified():
            rows = sacct_rows(lab, jobs)
            return rows if all(any(e.get("node") == "*" and e.get("class") for e in
                                   ac.parse(rows.get(job, {}).get("AdminComment")))
                               for job in jobs) else None
        rows = wait_for("an AdminComment entry with a class for every storm job", classified, timeout=180, every=2)
        for job in jobs:
            records = store.read_records(state_dir, job)
            nodes_run = backend(lab).expand_hostlist(rows[job]["NodeList"])
            have = {record.get("node") for record in records if record.get("class")}
            assert have >= {"*", *nodes_run}, (job, rows[job], have)
        print(f"storm: {len(jobs)} jobs ({BEFORE} running when the fault came), drained: {drained}, "
              f"states: {sorted({row['State'] for row in rows.values()})}")
    finally:
        if jobs:
            lab.run("scancel", *jobs)
        restore(lab, original)
