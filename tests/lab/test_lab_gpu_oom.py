"""Issue 16's GPU_OOM on the real cluster: a job of an ordinary user (``nobody``) that prints a real
PyTorch CUDA out-of-memory traceback and exits 1 is GPU_OOM in sacct's AdminComment and in
``slurm-gpu job``; a job that swaps its own stderr for a link to a root-only file holding the same
traceback stays FAILED, and its node's record says the link was not followed. The lab's hooks
config enables ``[records] gpu_oom_from_job_output``. Host OOM staying OUT_OF_MEMORY is the lab
scenario ``oom`` where memory cgroups exist, and a unit test of the classification everywhere."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from healthcheck.config import Config
from healthcheck.records import store

from .conftest import wait_for
from .test_lab_job_classes import job_fields, job_view, wait_ended, wait_entries

pytestmark = pytest.mark.lab

TRACEBACK = os.path.join(os.path.dirname(__file__), "..", "fixtures", "job-output", "pytorch-cuda-oom.err")
USER = "nobody"


@pytest.fixture
def place():
    """A directory every user can traverse, with ``out/`` owned by the job's user."""
    import pwd

    entry = pwd.getpwnam(USER)
    path = tempfile.mkdtemp(prefix="sgh-lab-oom-", dir="/tmp")
    os.chmod(path, 0o755)
    out = os.path.join(path, "out")
    os.mkdir(out, 0o755)
    os.chown(out, entry.pw_uid, entry.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def script(place: str, name: str, body: str) -> str:
    path = os.path.join(place, name)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o644)
    return path


def submit_as_user(lab, place: str, path: str, stem: str) -> str:
    out = os.path.join(place, "out")
    result = lab.run("runuser", "-u", USER, "--", "sbatch", "--parsable", "-N1", "--gres=gpu:1", "-D", out,
                     "-o", os.path.join(out, f"{stem}-%j.out"), "-e", os.path.join(out, f"{stem}-%j.err"), path)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def node_record(lab, job: str, node: str):
    state_dir = Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).state_dir
    return wait_for(f"job {job}'s record on {node}", lambda: store.read_record(state_dir, job, node))


def test_a_job_that_prints_a_pytorch_cuda_oom_traceback_and_exits_1_is_gpu_oom(lab, place):
    with open(TRACEBACK) as handle:
        traceback = handle.read()
    path = script(place, "train.sh", f"cat >&2 <<'TRACEBACK'\n{traceback}TRACEBACK\nexit 1\n")
    job = submit_as_user(lab, place, path, "train")
    assert wait_ended(lab, job) == "FAILED"
    fields = job_fields(lab, job)
    node = fields["BatchHost"]
    # scontrol shows the expanded path (the epilog reads it from there)
    assert fields["StdErr"] == os.path.join(place, "out", f"train-{job}.err")
    entries = wait_entries(lab, job, ["*", node])
    mine = [e for e in entries if e["node"] == node][0]
    assert (mine["class"], mine.get("oom"), mine.get("exit")) == ("GPU_OOM", "pytorch", 1)
    assert [e["class"] for e in entries if e["node"] == "*"] == ["FAILED"]
    view = job_view(job, lab)
    assert view["class"] == "GPU_OOM" and view["nodes"][node]["class"] == "GPU_OOM"
    record = node_record(lab, job, node)
    assert record["class"] == "GPU_OOM" and record["slurm_class"] == "FAILED"
    assert record["cause"]["line"].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert record["cause"]["stream"] == "stderr"


def test_a_job_whose_stderr_is_a_link_to_a_root_only_file_gets_no_evidence_from_it(lab, place):
    secret = os.path.join(place, "root-only.err")
    shutil.copyfile(TRACEBACK, secret)
    os.chmod(secret, 0o600)
    err = os.path.join(place, "out", "link-$SLURM_JOB_ID.err")
    path = script(place, "link.sh", f'rm -f "{err}"\nln -s "{secret}" "{err}"\nexit 1\n')
    job = submit_as_user(lab, place, path, "link")
    assert wait_ended(lab, job) == "FAILED"
    node = job_fields(lab, job)["BatchHost"]
    linked = os.path.join(place, "out", f"link-{job}.err")
    assert os.path.islink(linked) and os.readlink(linked) == secret
    entries = wait_entries(lab, job, ["*"])
    assert [e["class"] for e in entries] == ["FAILED"]
    assert job_view(job, lab)["class"] == "FAILED"
    record = node_record(lab, job, node)
    assert record["class"] == "FAILED" and record["cause"] is None
    read = {r["stream"]: r for r in record["job_output"]["read"]}
    assert read["stderr"]["error"] == "symbolic link, not followed" and read["stderr"]["read"] == 0
    assert not any(e.get("kind") == "gpu_oom" for e in record["evidence"])
