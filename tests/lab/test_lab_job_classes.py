"""Issue 11's acceptance on the real cluster: the prolog keeps a job off a bad GPU, the epilog
and EpilogSlurmctld classify endings into sacct's AdminComment (through sacctmgr, which stores
it lower-cased), jobstats' blob survives, a 3-node job names the node and GPU that failed, and
entries written while slurmdbd is down reach accounting once it is back."""
from __future__ import annotations

import json
import time
from typing import Dict, List, Optional

import pytest

from healthcheck.records import admin_comment as ac
from slurm_hooks.lab import daemons

from .conftest import slurm_gpu, wait_for

pytestmark = pytest.mark.lab

XID79 = "NVRM: Xid (PCI:{pci}): 79, pid=1, name=python3, GPU has fallen off the bus."
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY")


def submit(lab, *args: str) -> str:
    result = lab.run("sbatch", "--parsable", "-o", "/dev/null", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_fields(lab, job: str) -> Dict[str, str]:
    from healthcheck.slurm.cli_backend import parse_scontrol_record

    result = lab.run("scontrol", "show", "job", "-o", job)
    return parse_scontrol_record(result.stdout) if result.returncode == 0 else {}


def wait_running(lab, job: str) -> Dict[str, str]:
    return wait_for(f"job {job} RUNNING", lambda: (lambda f: f if f.get("JobState") == "RUNNING" else None)(
        job_fields(lab, job)))


def wait_ended(lab, job: str) -> str:
    def ended():
        state = job_fields(lab, job).get("JobState", "")
        return state if state in FINAL or state == "PENDING" and "held" in job_fields(lab, job).get("Reason", "") \
            else None
    return wait_for(f"job {job} to end", ended, timeout=90)


def admin_comment(lab, job: str) -> Optional[str]:
    result = lab.run("sacct", "-X", "-n", "-P", "-j", job, "-o", "JobID,AdminComment")
    for line in result.stdout.splitlines():
        job_id, _, comment = line.partition("|")
        if job_id == job:
            return comment
    return None


def wait_entries(lab, job: str, nodes: List[str], timeout: float = 60) -> List[dict]:
    def present():
        entries = ac.parse(admin_comment(lab, job))
        return entries if {e.get("node") for e in entries} >= set(nodes) else None
    return wait_for(f"job {job}'s AdminComment entries for {nodes}", present, timeout=timeout)


def job_view(job: str, lab) -> dict:
    result = slurm_gpu("job", job, "--json", env=lab.env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def kernel_pci(lab, node: str, gpu: int) -> str:
    from healthcheck.config import Config
    from healthcheck.sim.node import SimNode

    config = Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"])
    bus_id = SimNode(config.state_dir, node, config.sim_profile_path(node)).ensure()["gpu"][gpu]["pci_bus_id"]
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"


def inject(lab, node: str, *args: str) -> None:
    result = slurm_gpu("sim", "inject", node, *args, env=lab.env)
    assert result.returncode == 0, result.stderr


def mend(lab, *nodes: str) -> None:
    for node in nodes:
        slurm_gpu("sim", "reset", node, env=lab.env)
        lab.run("scontrol", "update", f"nodename={node}", "state=resume")
    time.sleep(2)       # resumed nodes are idle* until the next ping


def node_reason(lab, node: str) -> str:
    result = lab.run("sinfo", "-h", "-n", node, "-o", "%E")
    return result.stdout.strip()


@pytest.mark.every_release
def test_ordinary_job_gets_one_job_level_entry(lab):
    job = submit(lab, "-w", "gpu1", "--gres=gpu:1", "--wrap", "exit 3")
    wait_ended(lab, job)
    entries = wait_entries(lab, job, ["*"])
    assert [(e["node"], e["class"], e.get("exit")) for e in entries] == [("*", "FAILED", 3)]
    view = job_view(job, lab)
    assert view["class"] == "FAILED" and "accounting" in view["sources"] and set(view["nodes"]) == {"gpu1"}


@pytest.mark.every_release
def test_jobstats_blob_is_kept_next_to_our_entry(lab):
    blob = "JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTVWqBQBGb7chEwAAAA=="
    job = submit(lab, "-w", "gpu1", "--gres=gpu:1", "--wrap", "sleep 4")
    wait_running(lab, job)
    # jobstats writes with sacctmgr too; whatever accounting stored is what must survive
    wait_for("the job in accounting", lambda: admin_comment(lab, job) is not None)
    result = lab.run("sacctmgr", "-i", "modify", "job", "where", f"jobid={job}", "set", f"AdminComment={blob}")
    assert result.returncode == 0, result.stderr
    stored = admin_comment(lab, job)
    assert stored.lower() == blob.lower()
    wait_ended(lab, job)
    entries = wait_entries(lab, job, ["*"])
    assert entries[0]["class"] == "COMPLETED"
    assert ac.others(admin_comment(lab, job)) == stored


def test_three_node_job_with_xid79_on_one_node_is_gpu_lost_naming_node_and_gpu(lab, tmp_path):
    flag = tmp_path / "fail-now"
    job = submit(lab, "-N3", "-w", "gpu[1-3]", "--gres=gpu:2",
                 "--wrap", f"for i in $(seq 120); do [ -e {flag} ] && exit 1; sleep 0.5; done")
    try:
        wait_running(lab, job)
        # the job's first GPU on gpu2 falls off the bus (GRES index = NVML index on the lab nodes)
        gpus = wait_for("gpu2's prolog baseline", lambda: _baseline_gpus(lab, job, "gpu2"))
        gpu = gpus[0]
        inject(lab, "gpu2", f"gpu.{gpu}.state=lost", "--log", XID79.format(pci=kernel_pci(lab, "gpu2", gpu)))
        flag.write_text("")
        wait_ended(lab, job)
        entries = wait_entries(lab, job, ["*", "gpu2"])
        lost = [e for e in entries if e["node"] == "gpu2"][0]
        assert lost["class"] == "GPU_LOST" and lost["gpu"] == gpu and lost.get("xid") == 79
        assert [e["class"] for e in entries if e["node"] == "*"] == ["FAILED"]
        view = job_view(job, lab)
        assert view["class"] == "GPU_LOST"
        assert set(view["nodes"]) == {"gpu1", "gpu2", "gpu3"}
        assert view["nodes"]["gpu2"]["class"] == "GPU_LOST" and view["nodes"]["gpu2"]["evidence"]["gpu"] == gpu
        assert view["nodes"]["gpu1"]["class"] == view["nodes"]["gpu3"]["class"] == "FAILED"
        # drained with our reason naming the GPU (by the epilog, or the health check if it was first)
        reason = node_reason(lab, "gpu2")
        assert reason.startswith("gpu-hooks: v1 ") and f" gpu{gpu}" in reason, reason
    finally:
        mend(lab, "gpu2")


def _baseline_gpus(lab, job: str, node: str):
    from healthcheck.config import Config
    from healthcheck.records import store

    baseline = store.read_baseline(Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).state_dir, job, node)
    return baseline.get("gpus") if baseline else None


@pytest.fixture
def prolog_sees_it_first(lab):
    """The lab's health check runs every 10 s on every node and drains a lost GPU at once; when it
    ran between a test's inject and its job's start, the node was drained before the prolog ran and
    the job stayed pending (seen as reruns). While a test proves the prolog, the health check needs
    a lost GPU (or a GPU that hangs) on many runs before it drains; the hooks read the config at
    every run."""
    with open(lab.paths.hooks_config, encoding="utf-8") as handle:
        original = handle.read()
    with open(lab.paths.hooks_config, "w", encoding="utf-8") as handle:
        handle.write(original + '\n[health.confirm]\n"gpu.lost" = 1000\n"probe.timeout" = 1000\n')
    try:
        yield
    finally:
        with open(lab.paths.hooks_config, "w", encoding="utf-8") as handle:
            handle.write(original)


@pytest.mark.every_release
@pytest.mark.parametrize("requeue", [False, True], ids=["cancelled", "requeued-held"])
def test_prolog_keeps_the_job_off_a_bad_gpu_and_drains_with_our_reason(lab, requeue, prolog_sees_it_first):
    inject(lab, "gpu3", "gpu.5.state=lost")
    try:
        job = submit(lab, "-w", "gpu3", "--gres=gpu:8", "--requeue" if requeue else "--no-requeue",
                     "--wrap", "touch /dev/null")
        state = wait_ended(lab, job)
        fields = job_fields(lab, job)
        if requeue:
            assert state == "PENDING" and "held" in fields.get("Reason", ""), fields
            lab.run("scancel", job)
        else:
            assert state == "CANCELLED", fields
        reason = node_reason(lab, "gpu3")
        assert reason.startswith("gpu-hooks: v1 gpu.lost gpu5"), reason
    finally:
        mend(lab, "gpu3")


def test_prolog_keeps_the_job_off_a_gpu_that_hangs_while_its_siblings_answer(lab, prolog_sees_it_first):
    """Issue 24: GPU 5 does not answer NVML, the other seven do: a broken GPU, by default (no
    drain_on_probe_timeout): the job does not start and the node is drained for gpu5."""
    inject(lab, "gpu3", "gpu.5.state=hang")
    try:
        job = submit(lab, "-w", "gpu3", "--gres=gpu:8", "--no-requeue", "--wrap", "touch /dev/null")
        assert wait_ended(lab, job) == "CANCELLED", job_fields(lab, job)
        reason = node_reason(lab, "gpu3")
        assert reason.startswith("gpu-hooks: v1 probe.timeout gpu5"), reason
    finally:
        mend(lab, "gpu3")


def test_a_fault_on_a_gpu_the_job_was_not_given_does_not_block_it(lab, prolog_sees_it_first):
    inject(lab, "gpu3", "gpu.7.state=lost")
    try:
        job = submit(lab, "-w", "gpu3", "--gres=gpu:1", "--wrap", "true")
        assert wait_ended(lab, job) == "COMPLETED"
        assert not node_reason(lab, "gpu3").startswith("gpu-hooks:")
    finally:
        mend(lab, "gpu3")


def test_entries_written_while_slurmdbd_is_down_reach_accounting_when_it_returns(lab):
    say = lambda line: None  # noqa: E731
    dbd = daemons.by_name(lab.paths, "slurmdbd")
    try:
        assert daemons.stop(lab.paths, [dbd], say) == ["slurmdbd"]
        jobs = [submit(lab, "-w", "gpu1", "--gres=gpu:1", "--wrap", "exit 3"),
                submit(lab, "-w", "gpu2", "--gres=gpu:1", "--wrap", "true")]
        for job in jobs:
            wait_ended(lab, job)
        from healthcheck.config import Config
        from healthcheck.records import outbox

        state_dir = Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).state_dir
        wait_for("entries queued while accounting is down",
                 lambda: set(jobs) <= set(outbox.pending(state_dir)), timeout=30)
    finally:
        result = slurm_gpu("lab", "up", env=lab.env, timeout=300)
        assert result.returncode == 0, result.stderr

    def delivered():
        # any later hook run delivers what is queued: run a job now and then
        if all(ac.parse(admin_comment(lab, job)) for job in jobs):
            return True
        submit(lab, "-w", "gpu3", "--wrap", "true")
        time.sleep(3)
        return False

    wait_for("queued entries in accounting", delivered, timeout=120, every=1)
    assert ac.parse(admin_comment(lab, jobs[0]))[0]["class"] == "FAILED"
    assert ac.parse(admin_comment(lab, jobs[1]))[0]["class"] == "COMPLETED"


def test_gres_index_maps_to_nvml_index_through_minor_numbers(lab, prolog_sees_it_first):
    """gpu3's driver numbered its devices against PCI order: NVML GPU i is /dev/nvidia(7-i).
    The job's GRES index 0 (Slurm's first device file, nvidia0) is then NVML GPU 7."""
    reversed_minors = [f"gpu.{i}.minor_number={7 - i}" for i in range(8)]
    inject(lab, "gpu3", *reversed_minors, "gpu.7.state=lost")
    try:
        job = submit(lab, "-w", "gpu3", "--gres=gpu:1", "--no-requeue", "--wrap", "true")
        assert wait_ended(lab, job) == "CANCELLED"
        assert node_reason(lab, "gpu3").startswith("gpu-hooks: v1 gpu.lost gpu7")
    finally:
        mend(lab, "gpu3")
    inject(lab, "gpu3", *reversed_minors, "gpu.0.state=lost")      # NVML 0 is GRES 7: not the job's
    try:
        job = submit(lab, "-w", "gpu3", "--gres=gpu:1", "--wrap", "true")
        assert wait_ended(lab, job) == "COMPLETED"
        assert _baseline_gpus(lab, job, "gpu3") == [7]
    finally:
        mend(lab, "gpu3")


def test_a_job_whose_name_and_comment_forge_state_fields_is_classified_by_what_happened(lab):
    """Issue 14 part 2: a user's ``--comment "x JobState=PREEMPTED ..."`` or job name printed a second
    JobState pair in ``scontrol show job -o``, and the epilogs classified the job by it."""
    from healthcheck.config import Config
    from healthcheck.records import store

    failed = submit(lab, "-w", "gpu1", "--gres=gpu:1", "-J", "train JobState=NODE_FAIL Reason=NodeDown",
                    "--comment", "x JobState=PREEMPTED Reason=None PreemptTime=2026-11-30T17:46:01",
                    "--wrap", "exit 3")
    completed = submit(lab, "-w", "gpu2", "--gres=gpu:1", "-J",
                       "x UserId=root(0) GroupId=root(0) JobState=TIMEOUT Reason=TimeLimit "
                       "PreemptTime=2026-11-30T17:46:01 Comment=y", "--wrap", "true")

    def states():
        shown = lab.run("squeue", "-h", "-t", "all", "-j", f"{failed},{completed}", "-o", "%i %T").stdout.split()
        found = dict(zip(shown[::2], shown[1::2]))
        return found if len(found) == 2 and all(s in FINAL for s in found.values()) else None
    assert wait_for("both jobs to end", states, timeout=90) == {failed: "FAILED", completed: "COMPLETED"}
    state_dir = Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).state_dir
    for job, node, cls in ((failed, "gpu1", "FAILED"), (completed, "gpu2", "COMPLETED")):
        entries = wait_entries(lab, job, ["*"])
        assert [(e["node"], e["class"]) for e in entries if e["node"] == "*"] == [("*", cls)], entries
        records = wait_for(f"job {job}'s records", lambda: (lambda r: r if {x.get("node") for x in r} >= {"*", node}
                                                            else None)(store.read_records(state_dir, job)))
        for record in records:
            assert record["class"] == cls and "problem" not in record, record
            assert record["slurm"]["JobState"] in ("COMPLETING", cls), record["slurm"]
        assert job_view(job, lab)["class"] == cls
    assert [e.get("exit") for e in ac.parse(admin_comment(lab, failed)) if e["node"] == "*"] == [3]
