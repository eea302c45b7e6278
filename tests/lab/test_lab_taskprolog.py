"""TaskProlog on the real Slurm: a job's tasks get the NCCL variables derived from their node's
simulated fabric (the HCA beside each of the job's GPUs), a port set down before a step is left
out of that step's NCCL_IB_HCA, and a user's own NCCL_IB_HCA survives.

The batch script is a task too: its TaskProlog's exports are in the environment every srun in it
passes on, so each step's task starts with the batch task's values (ours, not the user's)."""
from __future__ import annotations

import os
import time
import uuid

import pytest

from healthcheck.taskenv.nccl_env import MARK

from .conftest import slurm_gpu

pytestmark = pytest.mark.lab

NODE = "gpu3"
WAIT_S = 90


def read_env(path: str) -> dict:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)


def wait_for(path: str, what: str, seconds: float = WAIT_S) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not appear within {seconds:g} s ({path})", pytrace=False)
        time.sleep(0.3)


def test_tasks_get_the_nccl_environment_of_their_node(lab):
    out = os.path.join(lab.paths.jobs, f"taskprolog-{uuid.uuid4().hex[:8]}")
    os.makedirs(out)
    marker = os.path.join(out, "port-is-down")
    # Step 1 sees the healthy node; the test then sets a port down; steps 2 and 3 see that.
    # Each step's output is complete once renamed into place.
    script = os.path.join(out, "job.sh")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/bash\n"
                     f"/usr/bin/env > {out}/batch.env\n"
                     f"srun -n1 /usr/bin/env > {out}/step1.tmp && mv {out}/step1.tmp {out}/step1.env\n"
                     f"for i in $(seq 1 {WAIT_S * 5}); do [ -e {marker} ] && break; sleep 0.2; done\n"
                     f"srun -n1 /usr/bin/env > {out}/step2.tmp && mv {out}/step2.tmp {out}/step2.env\n"
                     f"NCCL_IB_HCA==mlx5_7:1 srun -n1 /usr/bin/env > {out}/step3.env\n"
                     f"touch {out}/done\n")
    reset = slurm_gpu("sim", "reset", NODE, env=lab.env)     # the node's tree as this checkout renders it
    assert reset.returncode == 0, reset.stderr
    try:
        submitted = lab.run("sbatch", "--parsable", "-w", NODE, "--gres=gpu:2", "-t", "3", "-o", f"{out}/job.out",
                            "-e", f"{out}/job.err", script)
        assert submitted.returncode == 0, submitted.stderr
        wait_for(f"{out}/step1.env", "the first step's environment")
        first = read_env(f"{out}/step1.env")
        gpus = [int(g) for g in first["SLURM_STEP_GPUS"].split(",")]
        assert len(gpus) == 2
        # h100-healthy pairs GPU i with mlx5_i under one PCIe switch (DGX-style).
        assert first["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{g}:1" for g in gpus)
        assert first["NCCL_SOCKET_IFNAME"] == "=" + ",".join(f"ib{g}" for g in gpus)
        assert first["NCCL_IB_TIMEOUT"] == "22"          # the site's fixed setting ([nccl] env)
        assert "NCCL_IB_GID_INDEX" not in first          # InfiniBand, not RoCE
        batch = read_env(f"{out}/batch.env")             # what every srun step's task inherits
        assert batch["NCCL_IB_HCA"] == first["NCCL_IB_HCA"] and MARK in batch

        down = gpus[1]
        inject = slurm_gpu("sim", "inject", NODE, f'ib.mlx5_{down}:1.state="1: DOWN"', env=lab.env)
        assert inject.returncode == 0, inject.stderr
        open(marker, "w").close()
        wait_for(f"{out}/done", "the job's end")
        second = read_env(f"{out}/step2.env")
        chosen = second["NCCL_IB_HCA"].lstrip("=").split(",")
        assert f"mlx5_{down}:1" not in chosen and f"mlx5_{gpus[0]}:1" in chosen, second["NCCL_IB_HCA"]
        assert f"ib{down}" not in second["NCCL_SOCKET_IFNAME"] and second[MARK] != batch[MARK]
        assert read_env(f"{out}/step3.env")["NCCL_IB_HCA"] == "=mlx5_7:1"     # the user's own survives
        with open(f"{out}/job.err", encoding="utf-8", errors="replace") as handle:
            assert "taskprolog" not in handle.read()
    finally:
        slurm_gpu("sim", "reset", NODE, env=lab.env)
        lab.run("scontrol", "update", f"nodename={NODE}", "state=resume")
