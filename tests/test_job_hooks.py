"""The prolog and epilog on a simulated node, without Slurm (its commands are absent here, so
every accounting write stays queued and every drain is a loud line). The lab tests prove the
same hooks inside a real Slurm."""
import json
import os
import shutil

import pytest

from healthcheck.records import outbox, store
from slurm_hooks import epilog, prolog

from .conftest import SIM_PROFILES
from .test_records_store_outbox import queued_entries

XID79 = "NVRM: Xid (PCI:{pci}): 79, pid=1, name=python, GPU has fallen off the bus."


def kernel_pci(node, gpu):
    """GPU ``gpu``'s PCI address as the kernel log writes it (0000:5d:00)."""
    from healthcheck.config import Config
    from healthcheck.sim.node import SimNode

    config = Config.load(node["config"])
    bus_id = SimNode(config.state_dir, "gpu1", config.sim_profile_path("gpu1")).ensure()["gpu"][gpu]["pci_bus_id"]
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"


@pytest.fixture
def node(tmp_path, isolated_env):
    shutil.copytree(SIM_PROFILES, tmp_path / "sim")
    config = tmp_path / "config.toml"
    config.write_text(
        '[paths]\nstate_dir = "state"\n[gpu]\nbackend = "sim"\nprobe_timeout_s = 2.0\n'
        '[sim]\nprofile = "sim/h100-healthy.toml"\n'
        '[[nodes]]\nmatch = "gpu[1-3]"\ngpus = 8\ngpu_model = "H100"\nnvlinks_per_gpu = 18\n'
        '[records]\ndelivery = "inline"\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    env = {"SLURM_GPU_HOOKS_CONFIG": str(config), "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "5",
           "SLURM_JOB_GPUS": "2,3", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    for key, value in env.items():
        isolated_env.setenv(key, value)
    return {"config": str(config), "state": str(tmp_path / "state"), "env": isolated_env}


def inject(node, *args):
    from tests.conftest import run_cli

    result = run_cli(["sim", "inject", "--config", node["config"], "gpu1", *args])
    assert result.exit_code == 0, result.stderr


def journal(node):
    path = os.path.join(node["state"], "hook-runs", "gpu1.jsonl")
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_prolog_on_a_healthy_node_records_the_baseline_and_passes(node):
    assert prolog.main([]) == 0
    baseline = store.read_baseline(node["state"], "5", "gpu1")
    assert baseline["gres"] == [2, 3] and baseline["gpus"] == [2, 3]
    assert baseline["kernel_consumer"] == "gpu1.job.5" and baseline["started_at"] > 0
    assert journal(node)[-1]["result"] == "ok"


def test_prolog_stops_the_job_when_its_gpu_is_bad(node, capsys):
    inject(node, "gpu.3.state=lost")
    assert prolog.main([]) == 1
    entry = journal(node)[-1]
    assert entry["result"] == "bad-node" and any("gpu.lost" in f for f in entry["findings"])
    # no scontrol here: the drain is one loud line naming our reason, and the job still stops
    err = capsys.readouterr().err
    assert "gpu1: not drained (slurm-unreachable-fault)" in err and "wanted: gpu-hooks: v1 gpu.lost gpu3" in err


def test_a_fault_on_a_gpu_the_job_was_not_given_does_not_block_it(node):
    inject(node, "gpu.6.state=lost")
    assert prolog.main([]) == 0
    assert journal(node)[-1]["result"] == "ok"


def test_prolog_fails_open_when_the_tool_breaks(node, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("healthcheck.runner.run_checks", broken)
    assert prolog.main([]) == 0
    assert "internal error" in capsys.readouterr().err
    assert journal(node)[-1]["result"] == "tool-error"


def test_prolog_can_be_told_to_fail_closed_when_the_tool_breaks(node, monkeypatch):
    with open(node["config"], "a") as handle:
        handle.write('[prolog]\non_tool_error = "fail"\n')
    monkeypatch.setattr("healthcheck.runner.run_checks", lambda *a, **k: 1 / 0)
    assert prolog.main([]) == 1


def test_prolog_with_an_unreadable_config_does_nothing(node, capsys):
    with open(node["config"], "a") as handle:
        handle.write("[records]\nnode_entries = 3\n")
    assert prolog.main([]) == 0
    assert "config unusable" in capsys.readouterr().err


def test_epilog_classifies_a_gpu_lost_mid_job_and_queues_its_entry(node):
    assert prolog.main([]) == 0
    inject(node, "gpu.3.state=lost", "--log", XID79.format(pci=kernel_pci(node, 3)))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "GPU_LOST" and record["slurm_class"] == "FAILED" and record["exit"] == 1
    assert record["cause"]["gpu"] == 3
    assert any(e["kind"] == "xid" and e["code"] == 79 for e in record["evidence"])
    [entry] = queued_entries(node["state"], "5")
    assert entry["node"] == "gpu1" and entry["class"] == "GPU_LOST" and entry["gpu"] == 3
    assert entry["xid"] == 79 and entry["gpus"] == 2
    assert "queued" in journal(node)[-1]["accounting"]
    # the job's kernel-log cursor is gone with the job
    assert not os.path.exists(os.path.join(node["state"], "kernellog", "gpu1.job.5"))


@pytest.mark.parametrize("enabled,lost_gpu,code", [(True, 3, 1), (False, 3, 0), (True, 6, 0)])
def test_expedited_requeue_exits_1_only_when_asked_and_only_for_the_jobs_own_gpu(node, enabled, lost_gpu, code,
                                                                                  capsys):
    """[records] expedite_on_hardware: Slurm 25.11 requeues a --requeue=expedite job when the
    epilog fails; a fault on a GPU the job was not given (6) is not the job's."""
    if enabled:
        with open(node["config"]) as handle:
            text = handle.read()
        with open(node["config"], "w") as handle:
            handle.write(text.replace("[records]\n", "[records]\nexpedite_on_hardware = true\n"))
    assert prolog.main([]) == 0
    inject(node, f"gpu.{lost_gpu}.state=lost", "--log", XID79.format(pci=kernel_pci(node, lost_gpu)))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    assert epilog.main([]) == code
    assert ("expedited requeue" in capsys.readouterr().err) == bool(code)


def test_the_expedite_rule_is_hardware_on_the_jobs_gpus_only():
    from healthcheck.records.expedite import expedite

    assert expedite(True, "GPU_LOST", {"gpu": 2}, [2, 3])
    assert not expedite(False, "GPU_LOST", {"gpu": 2}, [2, 3])
    assert not expedite(True, "GPU_OOM", {"gpu": 2}, [2, 3])            # the application's
    assert not expedite(True, "INFINIBAND", {"port": "mlx5_0:1"}, [2, 3])
    assert not expedite(True, "GPU_ECC", {"gpu": 5}, [2, 3])
    assert not expedite(True, "GPU_LOST", None, [2, 3]) and not expedite(True, "GPU_LOST", {"gpu": 2}, None)


def test_an_ordinary_ending_writes_a_record_but_no_node_entry(node):
    assert prolog.main([]) == 0
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "0:0")
    assert epilog.main([]) == 0
    assert store.read_record(node["state"], "5", "gpu1")["class"] == "COMPLETED"
    assert outbox.pending(node["state"]) == {}


def test_epilog_slurmctld_writes_the_job_level_entry(node):
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")
    node["env"].delenv("SLURMD_NODENAME")
    node["env"].setenv("SLURM_JOB_NODELIST", "gpu[1-3]")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "3:0")
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "*")
    assert record["class"] == "FAILED" and record["exit"] == 3 and record["nodes"] == "gpu[1-3]"
    [entry] = queued_entries(node["state"], "5")
    assert entry == {"node": "*", "class": "FAILED", "exit": 3, "nodes": "gpu[1-3]"}


def test_late_evidence_amends_the_job_that_just_ended(node):
    assert prolog.main([]) == 0
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    assert epilog.main([]) == 0
    assert store.read_record(node["state"], "5", "gpu1")["class"] == "FAILED"
    # the next job's prolog finds the GPU gone
    inject(node, "gpu.3.state=lost")
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "prolog_slurmd")
    node["env"].setenv("SLURM_JOB_ID", "6")
    assert prolog.main([]) == 1
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "GPU_LOST" and record["amended_from"] == "FAILED"
    assert journal(node)[-1]["amended_jobs"] == ["5"]
    [entry] = queued_entries(node["state"], "5")
    assert entry["class"] == "GPU_LOST" and entry["late"] is True


def test_prolog_maps_gres_indices_through_minor_numbers(node, tmp_path):
    import stat as st

    devices = tmp_path / "dev" / "gpu1"
    devices.mkdir(parents=True)
    for number in range(8):
        os.mknod(str(devices / f"nvidia{number}"), 0o600 | st.S_IFCHR, os.makedev(195, number))
    with open(node["config"], "a") as handle:
        handle.write(f'[prolog]\ngpu_devices = "{tmp_path}/dev/{{node}}"\n')
    # NVML GPU i is /dev/nvidia(7-i): the job's GRES index 0 is NVML GPU 7
    inject(node, *[f"gpu.{i}.minor_number={7 - i}" for i in range(8)], "gpu.0.state=lost")
    node["env"].setenv("SLURM_JOB_GPUS", "0")
    assert prolog.main([]) == 0
    entry = journal(node)[-1]
    assert entry["job_gpus"] == [7] and entry["mapping"] == "minor"
    from tests.conftest import run_cli

    assert run_cli(["sim", "reset", "--config", node["config"], "gpu1"]).exit_code == 0
    # NVML cannot read a lost GPU's minor number: the unreadable GPU is the one judged
    inject(node, *[f"gpu.{i}.minor_number={7 - i}" for i in range(8)], "gpu.7.state=lost")
    assert prolog.main([]) == 1
    entry = journal(node)[-1]
    assert entry["job_gpus"] == [7] and entry["mapping"] == "minor, unreadable"
    assert any("gpu.lost" in f for f in entry["findings"])


def test_an_xid_on_another_jobs_gpu_is_not_this_jobs_evidence(node):
    assert prolog.main([]) == 0                       # the job has GPUs 2 and 3
    inject(node, "gpu.5.state=lost", "--log", XID79.format(pci=kernel_pci(node, 5)))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "FAILED" and record["evidence"] == []
    assert outbox.pending(node["state"]) == {}


# -- GPU_OOM from the job's own output (issue 16) -------------------------------------------------------

OOM_TRACEBACK = os.path.join(os.path.dirname(__file__), "fixtures", "job-output", "pytorch-cuda-oom.err")
NOBODY = 65534


@pytest.fixture
def oom_job(node, monkeypatch):
    """A job of ``nobody`` that FAILED (exit 1) on gpu1, its StdErr in a directory every user can
    traverse; scontrol is the fake backend (the lab test proves the real one)."""
    import tempfile

    from healthcheck.slurm.backend import JobInfo
    from .fake_backend import FakeBackend

    place = tempfile.mkdtemp(prefix="sgh-epilog-", dir="/tmp")
    os.chmod(place, 0o755)
    err = os.path.join(place, "job.err")
    shutil.copyfile(OOM_TRACEBACK, err)
    os.chmod(err, 0o644)
    fields = {"JobId": "5", "JobState": "COMPLETING", "Reason": "NonZeroExitCode", "ExitCode": "1:0",
              "BatchHost": "gpu1", "UserId": f"nobody({NOBODY})", "GroupId": f"nogroup({NOBODY})",
              "StdErr": err, "StdOut": os.path.join(place, "job.out")}
    backend = FakeBackend(jobs=[JobInfo("5", fields)])
    monkeypatch.setattr("slurm_hooks.delivery.backend_for", lambda config: backend)
    for key, value in {"SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_EXIT_CODE2": "1:0",
                       "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOBODY)}.items():
        node["env"].setenv(key, value)
    yield {"place": place, "err": err, "fields": fields, "backend": backend}
    shutil.rmtree(place, ignore_errors=True)


def enable_job_output(node):
    with open(node["config"]) as handle:
        text = handle.read()
    with open(node["config"], "w") as handle:
        handle.write(text.replace('[records]\n', '[records]\ngpu_oom_from_job_output = true\n'))


@pytest.mark.skipif(os.geteuid() != 0, reason="the reader drops root's privileges to the job's user")
def test_epilog_reads_a_failed_jobs_output_as_its_user_and_finds_gpu_oom(node, oom_job):
    enable_job_output(node)
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "GPU_OOM" and record["slurm_class"] == "FAILED" and record["exit"] == 1
    assert record["cause"]["kind"] == "gpu_oom" and record["cause"]["signature"] == "pytorch"
    assert record["cause"]["line"].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    read = {r["stream"]: r for r in record["job_output"]["read"]}
    assert "error" not in read["stderr"] and read["stderr"]["read"] == os.path.getsize(OOM_TRACEBACK)
    assert read["stdout"]["error"] == "No such file or directory"
    [entry] = queued_entries(node["state"], "5")
    assert entry["class"] == "GPU_OOM" and entry["oom"] == "pytorch" and entry["exit"] == 1


def test_epilog_reads_no_output_unless_the_admin_enabled_it(node, oom_job):
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "FAILED" and "job_output" not in record


@pytest.mark.skipif(os.geteuid() != 0, reason="the reader drops root's privileges to the job's user")
def test_epilog_does_not_follow_a_link_from_the_jobs_output_to_a_root_only_file(node, oom_job):
    enable_job_output(node)
    secret = os.path.join(oom_job["place"], "root-only")
    shutil.copyfile(OOM_TRACEBACK, secret)
    os.chmod(secret, 0o600)
    os.unlink(oom_job["err"])
    os.symlink(secret, oom_job["err"])
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "FAILED" and record["cause"] is None
    read = {r["stream"]: r for r in record["job_output"]["read"]}
    assert read["stderr"]["error"] == "symbolic link, not followed" and read["stderr"]["read"] == 0


def test_epilog_reads_only_on_the_batch_host_and_only_for_a_failed_job(node, oom_job):
    enable_job_output(node)
    oom_job["backend"]._jobs["5"].fields["BatchHost"] = "gpu2"
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "FAILED" and record["job_output"]["skipped"].startswith("not the batch host")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "0:0")
    oom_job["backend"]._jobs["5"].fields.update(BatchHost="gpu1", Reason="None", ExitCode="0:0")
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "COMPLETED" and "job_output" not in record


def test_a_broken_reader_costs_the_evidence_not_the_record(node, oom_job, monkeypatch, capsys):
    enable_job_output(node)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the reader")

    monkeypatch.setattr("healthcheck.probes.job_output.read_tails_as", broken)
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "FAILED" and record["job_output"]["problem"] == "RuntimeError: a bug in the reader"
    assert "output not read, no GPU OOM evidence: RuntimeError: a bug in the reader" in capsys.readouterr().err


def test_a_job_of_root_is_not_read(node, oom_job):
    enable_job_output(node)
    node["env"].setenv("SLURM_JOB_UID", "0")
    node["env"].setenv("SLURM_JOB_GID", "0")
    assert epilog.main([]) == 0
    record = store.read_record(node["state"], "5", "gpu1")
    assert record["class"] == "FAILED" and record["job_output"] == {"read": [], "skipped": "the job runs as uid 0 gid 0"}


# What a healthy job and a quiet health-check run must not load (docs/performance.md): the
# kernel-log scanner, parser and catalog when the log has no new line, the Actions layer when
# nothing is to be drained, argparse when slurmd passes no argument; and on every path, nothing
# that only costs start-up: dataclasses (with inspect: the data classes are @plain),
# importlib.resources (package data are plain files), the remediation ledger when [remediate] is off.
# pynvml (and the simulator's look-alike): only the NVML probe's child imports it
# (healthcheck.sources.LazyModule), while the hook's own process loads the rest of its code.
# ctypes: only the probes' children (the fabric structures, PR_SET_PDEATHSIG).
_ANY_PATH_NEVER = {"argparse", "click", "jinja2", "dataclasses", "inspect", "importlib.resources",
                   "healthcheck.actions.ledger", "pynvml", "healthcheck.sim.sim_pynvml", "ctypes"}
_HEALTHY_PATH_NEVER = {
    "prolog": {"healthcheck.kernellog.scanner", "healthcheck.kernellog.parser", "healthcheck.xid.catalog",
               "healthcheck.xid.events", "healthcheck.actions.decision", "healthcheck.records.classify",
               # a healthy prolog starts no program (nothing queued to deliver) and removes no tree
               "subprocess", "shutil"}
    | _ANY_PATH_NEVER,
    "epilog": {"healthcheck.kernellog.scanner", "healthcheck.kernellog.parser", "healthcheck.xid.catalog",
               "healthcheck.xid.events", "healthcheck.actions.decision"} | _ANY_PATH_NEVER,
    "healthcheck": {"healthcheck.kernellog.scanner", "healthcheck.kernellog.parser",
                    "healthcheck.xid.catalog"} | _ANY_PATH_NEVER,
}


def test_a_healthy_job_and_a_quiet_health_check_load_only_what_they_use(node):
    import subprocess
    import sys

    modules = {"prolog": "slurm_hooks.prolog", "epilog": "slurm_hooks.epilog",
               "healthcheck": "healthcheck.healthcheck"}
    env = {key: value for key, value in os.environ.items() if key != "SLURM_SCRIPT_CONTEXT"}
    seen = {}
    # The health check runs twice: its first run reads the log (nothing was read before). So does
    # the prolog: its first run boots the simulated node (uuid, and platform, which imports
    # subprocess on Python 3.9), which no real node's prolog does. The job-class rules (package data
    # the prolog never reads) are compiled into the shared cache first, as a node's earlier epilog
    # did: the cache holds 64 entries, and on a machine that ran many configs (CI's, after the lab
    # tests) the least recently written, that one among them, had gone.
    warm = subprocess.run([sys.executable, "-c", "from healthcheck.records.classify import rules; rules()"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert warm.returncode == 0, warm.stderr
    for hook in ("prolog", "prolog", "epilog", "healthcheck", "healthcheck"):
        context = {"prolog": "prolog_slurmd", "epilog": "epilog_slurmd"}.get(hook)
        run_env = dict(env, **({"SLURM_SCRIPT_CONTEXT": context} if context else {}))
        code = (f"import sys, json; from {modules[hook]} import main; rc = main([]); "
                "print(json.dumps([rc, sorted(sys.modules)]))")
        done = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        rc, loaded = json.loads(done.stdout.strip().splitlines()[-1])
        assert rc == 0, done.stderr
        seen[hook] = set(loaded)
    for hook, never in _HEALTHY_PATH_NEVER.items():
        assert seen[hook] & never == set(), hook
    if os.geteuid() == 0:
        # The config (and the job-class rules) come from the compiled cache once the first run
        # (the prolog's) has made it: no TOML parser (healthcheck/compiled.py; root's hooks only).
        assert not {"tomllib", "tomli"} & (seen["epilog"] | seen["healthcheck"])
    assert "healthcheck.kernellog.cursor" in seen["epilog"]      # the job's reader was looked at


# -- a state dir that cannot keep the record: the entry goes to accounting at once ------------------

def _disk_full(node, monkeypatch, jobs_in_accounting=("5",)):
    import errno

    with open(node["config"]) as handle:
        text = handle.read()
    with open(node["config"], "w") as handle:
        handle.write(text.replace("[records]\n", "[records]\nverify_delay_s = 0\nverify_jitter_s = 0\n"))
    from .fake_backend import AccountedBackend

    backend = AccountedBackend()
    backend.accounting_rows = [{"JobID": job, "JobIDRaw": job, "AdminComment": ""} for job in jobs_in_accounting]
    monkeypatch.setattr("slurm_hooks.delivery.backend_for", lambda config: backend)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("healthcheck.records.store.write_record", full)
    return backend


def _entries(backend, job):
    from healthcheck.records import admin_comment as ac

    return ac.parse(next(row["AdminComment"] for row in backend.accounting_rows if row["JobIDRaw"] == job))


def test_epilog_slurmctld_on_a_full_state_dir_writes_the_entry_to_accounting_at_once(node, monkeypatch, capsys):
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")
    node["env"].delenv("SLURMD_NODENAME")
    node["env"].setenv("SLURM_JOB_NODELIST", "gpu[1-3]")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "3:0")
    backend = _disk_full(node, monkeypatch)
    assert epilog.main([]) == 0
    [entry] = _entries(backend, "5")
    assert entry["class"].upper() == "FAILED" and entry["node"] == "*" and entry["exit"] == 3, entry
    assert "record not saved (FAILED)" in capsys.readouterr().err
    assert outbox.pending(node["state"]) == {}


def test_epilog_on_a_full_state_dir_writes_a_gpu_lost_entry_at_once(node, monkeypatch):
    assert prolog.main([]) == 0
    inject(node, "gpu.3.state=lost", "--log", XID79.format(pci=kernel_pci(node, 3)))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    backend = _disk_full(node, monkeypatch)
    assert epilog.main([]) == 0
    [entry] = _entries(backend, "5")
    assert entry["class"].upper() == "GPU_LOST" and entry["xid"] == 79 and entry["gpu"] == 3, entry


def test_an_entry_that_cannot_be_kept_nor_written_is_said_lost(node, monkeypatch, capsys):
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")
    node["env"].delenv("SLURMD_NODENAME")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "3:0")
    backend = _disk_full(node, monkeypatch, jobs_in_accounting=())
    monkeypatch.setattr(epilog, "UNKEPT_TRY_FOR_S", 0.0)        # no time left for a second try
    assert epilog.main([]) == 0
    err = capsys.readouterr().err
    assert "job 5: accounting entry lost: the record could not be kept and writing it at once failed: " \
           "the job is not in accounting yet" in err, err
    assert not backend.writes()


def test_an_unkept_entry_is_tried_again_until_accounting_knows_the_job(node, monkeypatch, capsys):
    # The 2-hour soak: the state disk full as slurmdbd came back, the job's start still on its way
    # to accounting. The first read finds no row; a later one does, and the entry goes there.
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")
    node["env"].delenv("SLURMD_NODENAME")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "3:0")
    backend = _disk_full(node, monkeypatch, jobs_in_accounting=())
    monkeypatch.setattr(epilog, "UNKEPT_RETRY_S", 0.0)
    reads = []
    accounting = backend.accounting

    def arriving(job_ids, fields, every_incarnation=False):
        reads.append(job_ids)
        if len(reads) == 3 and not backend.accounting_rows:
            backend.accounting_rows.append({"JobID": "5", "JobIDRaw": "5", "AdminComment": ""})
        return accounting(job_ids, fields, every_incarnation)

    monkeypatch.setattr(backend, "accounting", arriving)
    assert epilog.main([]) == 0
    [entry] = _entries(backend, "5")
    assert entry["class"].upper() == "FAILED" and entry["node"] == "*", entry
    assert "entry lost" not in capsys.readouterr().err and len(reads) >= 3


def test_an_unkept_record_is_kept_and_queued_once_the_state_dir_has_room_again(node, monkeypatch):
    import errno

    from healthcheck.records import store

    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")
    node["env"].delenv("SLURMD_NODENAME")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "3:0")
    write_record = store.write_record
    backend = _disk_full(node, monkeypatch, jobs_in_accounting=())
    monkeypatch.setattr(epilog, "UNKEPT_RETRY_S", 0.0)
    tries = []

    def full_once(*args, **kwargs):
        tries.append(1)
        if len(tries) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_record(*args, **kwargs)

    monkeypatch.setattr("healthcheck.records.store.write_record", full_once)
    assert epilog.main([]) == 0
    assert len(tries) == 2 and store.read_record(node["state"], "5", store.JOB_LEVEL) is not None
    assert set(outbox.pending(node["state"])) == {"5"}        # queued: accounting does not know the job yet
