"""Slurm's own boot-time check (issue 21): after a reboot through Slurm (`scontrol reboot ASAP
nextstate=RESUME`, the lab's RebootProgram), the health check has run on the node before the
next job's prolog starts there. slurmd runs the HealthCheckProgram when it starts, before it
registers (every release; HealthCheckNodeState=ANY, what `slurm-gpu slurm-conf` prints), and the
node takes no job before it has registered. Measured on 26.05 (SLURM_GPU_LAB_RELEASE=26.05); the
measurements behind docs/slurm-versions.md's table ("A health check at boot")."""
from __future__ import annotations

import time

import pytest

from healthcheck.config import Config
from healthcheck.hooklib.runlog import read_runs

from .conftest import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.every_release]

NODE = "gpu3"


def runs(state_dir: str, hook: str, since: float):
    return [r for r in read_runs(state_dir) if r.get("node") == NODE and r.get("hook") == hook
            and float(r.get("time", 0)) >= since]


def node_line(lab) -> str:
    return lab.run("scontrol", "show", "node", "-o", NODE).stdout


def test_after_a_reboot_the_health_check_runs_before_the_next_job_starts_on_the_node(lab):
    state_dir = Config.load(lab.paths.hooks_config).state_dir
    wait_for(f"{NODE} idle", lambda: "State=IDLE " in node_line(lab), timeout=60)
    asked = time.time()
    reboot = lab.run("scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=lab boot check", NODE)
    assert reboot.returncode == 0, reboot.stderr
    submitted = lab.run("sbatch", "--parsable", "-w", NODE, "-o", "/dev/null", "--wrap", "true")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait_for(f"job {job}'s prolog on {NODE}",
             lambda: any(r.get("job_id") == job for r in runs(state_dir, "prolog", asked)), timeout=180)
    [prolog] = [r for r in runs(state_dir, "prolog", asked) if r.get("job_id") == job]
    prolog_started = float(prolog["time"]) - float(prolog.get("duration_ms", 0)) / 1000.0
    before_job = [r for r in runs(state_dir, "healthcheck", asked) if float(r["time"]) < prolog_started]
    assert before_job, (f"no health check on {NODE} between the reboot ({asked:.3f}) and job {job}'s prolog "
                        f"({prolog_started:.3f}): {runs(state_dir, 'healthcheck', asked - 30)}")
    shown = node_line(lab)
    assert "REBOOT" not in shown and "BootTime=" in shown
