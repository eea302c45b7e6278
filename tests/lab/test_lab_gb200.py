"""GB200 NVL72 trays in the lab (issue 33): `slurm-gpu lab up --gb200 2` makes gpu2 and gpu3 compute
trays of one multi-node NVLink domain (4 GPUs each, Gres=gpu:4, the gb200-nvl72-healthy profile:
the same cluster UUID and clique, IMEX ready) beside the H100 node gpu1. Both trays are healthy
to the health check; when one tray's fabric reports limited capacity (fabric info v3), slurmd's
HealthCheckProgram drains that tray with the fabric's check, and the next job for the trays runs
on the other one. The lab then goes back to its three H100 nodes (`lab up --clean`)."""
from __future__ import annotations

import re
import time

import pytest

from healthcheck.hooklib.runlog import read_runs

from .conftest import lab_up_clean as lab_up, slurm_gpu, wait_for

pytestmark = pytest.mark.lab

TRAYS = ("gpu2", "gpu3")
LIMITED = 'gpu.2.fabric.health_summary="limited_capacity"'


def healthy_runs(lab, node: str, since: float) -> int:
    return sum(1 for e in read_runs(lab.paths.state) if e.get("hook") == "healthcheck" and e.get("node") == node
               and e.get("time", 0) > since and e.get("status") == "ok")


def shown(lab, node: str) -> str:
    return lab.run("scontrol", "show", "node", node).stdout


def drained(lab, node: str) -> bool:
    return bool(re.search(r"^\s*State=\S*DRAIN", shown(lab, node), re.MULTILINE))


def test_of_two_gb200_trays_in_one_domain_the_degraded_one_is_drained_and_the_other_takes_the_next_job(lab):
    lab_up("--gb200", str(len(TRAYS)))
    try:
        for node in TRAYS:
            assert re.search(r"\bGres=gpu:4\b", shown(lab, node)), shown(lab, node)
        assert re.search(r"\bGres=gpu:8\b", shown(lab, "gpu1"))
        since = time.time()
        wait_for("two healthy health-check runs on each tray",
                 lambda: all(healthy_runs(lab, node, since) >= 2 for node in TRAYS), timeout=90)
        assert not any(drained(lab, node) for node in TRAYS)

        done = slurm_gpu("sim", "inject", "gpu2", LIMITED, env=lab.env)
        assert done.returncode == 0, done.stderr
        wait_for("gpu2 drained by the health check", lambda: drained(lab, "gpu2"), timeout=90)
        reason = re.search(r"Reason=(.*?)(?: \[|$)", shown(lab, "gpu2"), re.MULTILINE).group(1)
        assert reason.startswith("gpu-hooks: v1 nvlink.fabric_health gpu2"), reason
        assert not drained(lab, "gpu3")

        # The next job for the trays (a tray's GPU, never the H100 node) runs on the other tray.
        submitted = lab.run("sbatch", "--parsable", "-p", "low", "-x", "gpu1", "--gres=gpu:1", "-o", "/dev/null",
                            "--wrap", "true")
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]

        def ended():
            row = lab.run("sacct", "-n", "-P", "-X", "-j", job, "-o", "State,NodeList").stdout.strip()
            return row if row and not row.startswith(("PENDING", "RUNNING", "REQUEUED")) else None

        state, nodelist = wait_for(f"job {job} ended", ended, timeout=120).split("|")
        assert (state, nodelist) == ("COMPLETED", "gpu3")
        # The epilog's journal line may follow the job's end in accounting by a moment.
        wait_for(f"job {job}'s prolog and epilog on gpu3", lambda: {("prolog", "gpu3"), ("epilog", "gpu3")} <= {
            (e.get("hook"), e.get("node")) for e in read_runs(lab.paths.state) if str(e.get("job_id")) == job},
            timeout=60)
    finally:
        lab_up()            # the three H100 nodes the other lab tests name
