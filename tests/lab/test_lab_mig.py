"""A node shared with MIG in the lab (issue 33): `slurm-gpu lab up --mig 1` makes gpu3 the h100-mig
profile's node (GPU 0 cut into four 1g.10gb, GPU 1 into two 3g.40gb, GPU 2 one 7g.80gb, GPUs 3-7
whole), each MIG device a GRES of its type that gres.conf lists by its GPU's device file and its
capability's, as a site without NVML autodetection does. Slurm then gives the Prolog GRES
indices only (docs/slurm-versions.md): the prolog judges every GPU and names the job's MIG
device from gres.conf and the driver's mig-minors. A job on a 3g.40gb device completes and its
record names GPU 1 and the GPU instance; once GPU 1 is lost, the next such job is refused by the
prolog and the node drained with the lost GPU's reason. The lab then goes back to its three H100
nodes."""
from __future__ import annotations

import json
import os
import re

import pytest

from healthcheck.hooklib.runlog import read_runs

from .conftest import lab_up_clean as lab_up, slurm_gpu, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.every_release]

NODE = "gpu3"


def shown(lab, node: str) -> str:
    return lab.run("scontrol", "show", "node", node).stdout


def drained(lab, node: str) -> bool:
    return bool(re.search(r"^\s*State=\S*DRAIN", shown(lab, node), re.MULTILINE))


def submit(lab, gres: str) -> str:
    submitted = lab.run("sbatch", "--parsable", "-w", NODE, f"--gres={gres}", "-o", "/dev/null", "--wrap", "true")
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def prolog_of(lab, job: str):
    return next((e for e in read_runs(lab.paths.state) if e.get("hook") == "prolog" and e.get("node") == NODE
                 and str(e.get("job_id")) == job), None)


def test_a_mig_device_names_its_parent_in_the_record_and_a_lost_parent_refuses_the_next_job(lab):
    lab_up("--mig", "1")
    try:
        assert re.search(r"\bGres=gpu:1g\.10gb:4,gpu:3g\.40gb:2,gpu:7g\.80gb:1,gpu:h100:5\b", shown(lab, NODE)), \
            shown(lab, NODE)
        job = submit(lab, "gpu:3g.40gb:1")

        def ended():
            row = lab.run("sacct", "-n", "-P", "-X", "-j", job, "-o", "State").stdout.strip()
            return row if row and not row.startswith(("PENDING", "RUNNING", "REQUEUED")) else None

        assert wait_for(f"job {job} ended", ended, timeout=120) == "COMPLETED"
        entry = wait_for(f"job {job}'s prolog on {NODE}", lambda: prolog_of(lab, job), timeout=60)
        assert entry["mapping"].endswith("by GRES index from gres.conf)"), entry
        (device,) = entry["job_mig_devices"]
        assert device["gpu"] == 1 and device["gpu_instance"] in (1, 2) and device["uuid"].startswith("MIG-"), entry
        record_path = os.path.join(lab.paths.state, "jobs", job, f"{NODE}.json")
        wait_for(f"job {job}'s record", lambda: os.path.isfile(record_path), timeout=60)
        with open(record_path, encoding="utf-8") as handle:
            record = json.load(handle)
        assert [(m["gpu"], m["gpu_instance"], m["uuid"]) for m in record["mig_devices"]] == \
            [(1, device["gpu_instance"], device["uuid"])]

        done = slurm_gpu("sim", "inject", NODE, "gpu.1.state=lost", env=lab.env)
        assert done.returncode == 0, done.stderr
        refused = submit(lab, "gpu:3g.40gb:1")
        entry = wait_for(f"job {refused}'s prolog on {NODE}", lambda: prolog_of(lab, refused), timeout=120)
        assert entry["result"] == "bad-node", entry
        wait_for(f"{NODE} drained", lambda: drained(lab, NODE), timeout=60)
        reason = re.search(r"Reason=(.*?)(?: \[|$)", shown(lab, NODE), re.MULTILINE).group(1)
        assert reason.startswith(f"gpu-hooks: v1 gpu.lost gpu1"), reason
        state = lab.run("sacct", "-n", "-P", "-X", "-j", refused, "-o", "State").stdout.strip()
        assert not state.startswith("COMPLETED"), state
    finally:
        lab.run("scancel", "-w", NODE)
        lab_up()            # the three H100 nodes the other lab tests name
