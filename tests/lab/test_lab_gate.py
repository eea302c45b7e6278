"""Issue 20's acceptance on the real cluster: every change of a node goes through the drain gate.
A node the prolog drained for a lost GPU shows its evidence and a recommendation in
``slurm-gpu drained --json``, is kept drained while it did not reboot (the prolog's drain record
carries its boot) and is resumed by the health check after ``sim reset`` + ``sim reboot``;
``slurm-gpu resume 'gpu[1-3]'`` with an admin's drain on gpu2 resumes ours only."""
from __future__ import annotations

import json
import os
import time

import pytest

from .conftest import slurm_gpu
from .test_lab_healthcheck import backend, runs, wait_for
from .test_lab_job_classes import inject, mend, prolog_sees_it_first, submit, wait_ended  # noqa: F401

# Both pass on 22.05, 24.11 and 26.05 (each run twice green on each, 2026-12-01): every release.
pytestmark = [pytest.mark.lab, pytest.mark.every_release]

ADMIN = "admin: PSU swap, ticket 4711"


def drained_rows(lab):
    listed = slurm_gpu("drained", "--json", env=lab.env)
    assert listed.returncode == 0, listed.stderr
    return {row["node"]: row for row in json.loads(listed.stdout)}


def in_service(slurm, node: str) -> bool:
    # `not sinfo -o %E` never holds: sinfo prints "none" for a node without a reason (the first
    # version of this test waited on it and timed out although gpu3 was IDLE 7 s after the drain).
    info = slurm.node(node)
    return not info.drained and not info.down


def a_run(lab, node: str, since: float, rule: str):
    return [e for e in runs(lab, node, since) if e.get("rule") == rule]


def test_a_prolog_drain_shows_its_evidence_and_the_health_check_resumes_it_after_a_reboot(lab, prolog_sees_it_first):
    slurm = backend(lab)
    state = os.path.join(lab.paths.state, "health", "gpu3.json")
    if os.path.exists(state):
        os.unlink(state)                      # no drain record from an earlier session
    inject(lab, "gpu3", "gpu.5.state=lost")
    try:
        job = submit(lab, "-w", "gpu3", "--gres=gpu:8", "--no-requeue", "--wrap", "touch /dev/null")
        assert wait_ended(lab, job) == "CANCELLED"
        reason = slurm.node("gpu3").reason
        assert reason.startswith("gpu-hooks: v1 gpu.lost gpu5"), reason
        row = drained_rows(lab)["gpu3"]
        assert row["ours"] and row["drained_by"] == "prolog" and row["cause"] == "gpu.lost gpu5", row
        assert row["evidence"] and row["evidence"][0]["check"] == "gpu.lost" and row["evidence"][0]["gpu"] == 5
        assert row["recommended"].startswith("reboot the node"), row

        # The GPU answers again without a reboot: the health check knows the prolog's drain was for
        # a cause resumed only after a reboot, and in which boot it was made, so gpu3 stays drained.
        since = time.time()
        inject(lab, "gpu3", "gpu.5.state=ok")
        wait_for("a health-check run on gpu3 waiting for a reboot", lambda: a_run(lab, "gpu3", since,
                                                                                   "resume-wait-reboot"))
        assert slurm.node("gpu3").drained and slurm.node("gpu3").reason == reason

        since = time.time()
        for step in ("reset", "reboot"):
            done = slurm_gpu("sim", step, "gpu3", env=lab.env)
            assert done.returncode == 0, done.stderr
        resumed = wait_for("the health check resuming gpu3",
                           lambda: [e for e in a_run(lab, "gpu3", since, "resume") if e.get("result") == "resume"])
        assert resumed[0]["committed"] is True, resumed
        wait_for("gpu3 back in service", lambda: in_service(slurm, "gpu3"))
        assert "gpu3" not in drained_rows(lab)
    finally:
        mend(lab, "gpu3")


def test_resume_of_a_hostlist_resumes_ours_and_leaves_an_admins_drain(lab):
    # A cause the lab's health check never resumes by itself ([health.resume] "gpu.remap.failed" =
    # "never"), so the drains stay until `slurm-gpu resume` (the simulated GPUs are healthy).
    slurm = backend(lab)
    ours = "gpu-hooks: v1 gpu.remap.failed gpu3 uncorrectable_rows:2; GPU 3: row remapping failed"
    try:
        for node, reason in (("gpu1", ours), ("gpu2", ADMIN), ("gpu3", ours)):
            lab.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}").check_returncode()
        done = slurm_gpu("resume", "gpu[1-3]", env=lab.env, timeout=180)
        assert done.returncode == 1 and "gpu2" in done.stderr and "not by this tool" in done.stderr, done.stderr
        assert "gpu1: every check passes; resumed" in done.stdout and "gpu3: every check passes; resumed" in done.stdout
        wait_for("gpu1 and gpu3 back in service", lambda: in_service(slurm, "gpu1") and in_service(slurm, "gpu3"))
        gpu2 = slurm.node("gpu2")
        assert gpu2.drained and gpu2.reason == ADMIN, gpu2
    finally:
        for node in ("gpu1", "gpu2", "gpu3"):
            lab.run("scontrol", "update", f"nodename={node}", "state=resume")
        time.sleep(2)       # resumed nodes are idle* until the next ping
