"""Slurm's own boot-time check (issue 21): after a reboot through Slurm (`scontrol reboot ASAP
nextstate=RESUME`, the lab's RebootProgram), the health check has run on the node before the
next job's prolog starts there. slurmd runs the HealthCheckProgram when it starts, before it
registers (every release; HealthCheckNodeState=ANY, what `slurm-gpu slurm-conf` prints), and the
node takes no job before it has registered. Measured on 26.05 (SLURM_GPU_LAB_RELEASE=26.05); the
measurements behind docs/slurm-versions.md's table ("A health check at boot").

And the remediation's own reboot (no nextstate: docs/slurm-versions.md, "A drain through
`scontrol reboot ASAP`"): from 24.11 a node whose fault is back after the boot never meets the
job waiting for it; on 22.05 that job's prolog refuses the node if it gets there."""
from __future__ import annotations

import time

import pytest

from healthcheck.config import Config
from healthcheck.hooklib.runlog import read_runs

from .conftest import lab_release, wait_for

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


def release_keeps_the_drain_through_a_reboot() -> bool:
    """Measured (docs/slurm-versions.md, "A drain through `scontrol reboot ASAP`"): 24.11 and 26.05
    keep a drain set before the reboot when no nextstate is asked; 22.05 resumes the node."""
    major, minor = (int(part) for part in lab_release().split(".")[:2])
    return (major, minor) >= (24, 11)


def test_a_fault_back_after_the_remediation_reboot_never_meets_a_job_waiting_for_the_node(lab):
    """A lemon (its GPU falls off the bus after every boot) with [remediate] max_reboots = 1: the
    health check drains it and asks Slurm for the reboot; a job pinned to the node and needing all
    its GPUs is submitted while Slurm reboots it. From 24.11 our drain outlives the reboot, the
    first check of the new boot finds the GPU lost again and the node goes to inspection: the job
    never starts there. On 22.05 Slurm puts the node back in service at registration, and the job,
    if sent there before the boot's first check drains the node again, is refused by its prolog
    (the job's GPUs are checked before it starts): on no release does it run there."""
    from .test_lab_remediate import REBOOTING, Remediating, backend, slurm_gpu

    state_dir = Config.load(lab.paths.hooks_config).state_dir
    slurm = backend(lab)
    job = ""
    with Remediating(lab, max_reboots=1):
        result = slurm_gpu("sim", "inject", NODE, "gpu.5.state=lost", "gpu.5.lost_every_boot=true", env=lab.env)
        assert result.returncode == 0, result.stderr
        try:
            wait_for(f"the remediation's reboot of {NODE}", lambda: slurm.node(NODE).has(*REBOOTING), timeout=90,
                     every=0.2)
            asked = time.time()
            submitted = lab.run("sbatch", "--parsable", "-w", NODE, "--gres=gpu:8", "-o", "/dev/null", "--wrap", "true")
            assert submitted.returncode == 0, submitted.stderr
            job = submitted.stdout.strip().split(";")[0]
            wait_for(f"{NODE} drained for inspection", lambda: (lambda info: info.drained and not info.has(*REBOOTING)
                                                                and " reboots:1; inspect: " in info.reason)(
                slurm.node(NODE)), timeout=240, every=1)
            prologs = [r for r in runs(state_dir, "prolog", asked) if r.get("job_id") == job]
            if release_keeps_the_drain_through_a_reboot():
                assert prologs == [], f"job {job} was sent to {NODE} after the reboot: {prologs}"
            else:
                # 22.05 puts the node in service at registration; the boot's first health check
                # drains it again within a second, and a job the scheduler sent there in between
                # is refused by its prolog (either order seen in the lab)
                assert all(r.get("result") == "bad-node" for r in prologs), prologs
            state = lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
            assert state == "PENDING", f"job {job}: {state!r}"
        finally:
            if job:
                lab.run("scancel", job)
