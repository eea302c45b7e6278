"""``slurm-gpu-healthcheck`` as a program: --dry-run/--json contract, bad input as one line and
exit 2, fail-open on a broken config, the watchdog, and a lean import path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .checks_support import HARDWARE
from .conftest import SIM_PROFILES
from .test_records_store_outbox import queued_entries

PROFILE = os.path.join(SIM_PROFILES, "h100-healthy.toml")


def write_config(tmp_path, extra: str = "") -> str:
    hw = HARDWARE["H100"]
    path = tmp_path / "config.toml"
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    # A stand-in scontrol that answers `show node` with a line captured from the lab (argument
    # building only; the lab tests prove the program against the real Slurm).
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "scontrol-show-node-idle.txt")
    (bindir / "scontrol").write_text(f"#!/bin/sh\nexec cat {fixture}\n")
    (bindir / "scontrol").chmod(0o755)
    path.write_text(f"""
[paths]
state_dir = "{tmp_path / 'state'}"
[gpu]
backend = "sim"
probe_timeout_s = 10
[sim]
profile = "{PROFILE}"
[[nodes]]
match = "gpu*"
gpus = {hw['gpus']}
gpu_model = "{hw['gpu_model']}"
nvlinks_per_gpu = {hw['nvlinks_per_gpu']}
nvswitch_fabric = true
ib_ports = {json.dumps(hw['ib_ports'])}
ib_rate_gbps = {hw['ib_rate_gbps']}
ib_link_layer = "InfiniBand"
[slurm]
bin_dir = "{bindir}"
[health]
syslog = false
textfile_dir = "{tmp_path / 'metrics'}"
{extra}
""")
    return str(path)


def program(*args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "healthcheck.healthcheck", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def inject(config: str, *assignments: str) -> None:
    done = subprocess.run([sys.executable, "-c", "from slurm_hooks.cli import main; main()", "sim", "inject",
                           "--config", config, "gpu1", *assignments], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_dry_run_json_is_the_contract_and_changes_nothing(tmp_path):
    config = write_config(tmp_path)
    inject(config, "gpu.3.ecc.volatile_uncorrected=2")
    done = program("--config", config, "--node", "gpu1", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["node"] == "gpu1" and doc["decision"] == "drain"
    assert doc["reason"].startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; ")
    assert doc["scontrol"] == ["scontrol", "update", "nodename=gpu1", "state=drain", f"reason={doc['reason']}"]
    assert [f["check"] for f in doc["findings"]] == ["gpu.ecc.uncorrectable"]
    assert not os.path.exists(tmp_path / "state" / "health" / "gpu1.json")


def test_dry_run_prints_the_argv_for_people(tmp_path):
    config = write_config(tmp_path)
    inject(config, "gpu.3.ecc.volatile_uncorrected=2")
    done = program("--config", config, "--node", "gpu1", "--dry-run")
    assert "drain [drain]" in done.stdout and "scontrol: scontrol update nodename=gpu1 state=drain" in done.stdout


def test_a_healthy_json_run(tmp_path):
    done = program("--config", write_config(tmp_path), "--node", "gpu1", "--json")
    doc = json.loads(done.stdout)
    assert (doc["decision"], doc["reason"], doc["scontrol"], doc["findings"]) == ("none", None, None, [])
    assert os.path.exists(tmp_path / "metrics" / "slurm_gpu_health_gpu1.prom")      # [health] textfile_dir


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    done = program("--bogus")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    missing = program("--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_a_broken_default_config_fails_open(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[health]\ndeadline_s = 90\n")
    done = program(env=dict(os.environ, SLURM_GPU_HOOKS_CONFIG=str(bad), SLURMD_NODENAME="gpu1"))
    assert done.returncode == 0 and "config unusable, doing nothing" in done.stderr
    assert "deadline_s" in done.stderr


def test_the_watchdog_stops_a_run_that_hangs_and_drains_nothing(tmp_path):
    config = write_config(tmp_path, "deadline_s = 2")
    # A driver stuck in the kernel: NVML never answers; the probe's own deadline is longer.
    inject(config, "node.nvml=hang")
    done = program("--config", config, "--node", "gpu1", "--json")
    assert done.returncode == 0 and done.stdout == ""
    assert "took longer than 2 s" in done.stderr and "nothing drained" in done.stderr
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if config.encode() in handle.read():
                    left.append(pid)
        except OSError:
            continue
    assert left == [], "a probe child outlived the run"


def test_the_program_imports_no_click_nor_jinja2():
    probe = ("import sys, healthcheck.healthcheck, healthcheck.health.run, healthcheck.health.outputs; "
             "print(sorted(m for m in ('click', 'jinja2', 'slurm_hooks') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_fault_it_finds_amends_the_job_that_just_ended_on_the_gpu(tmp_path):
    """Late evidence from the health check (its post-decision step): GPU 3 lost seconds after a
    job that held it ended FAILED makes that job GPU_LOST; a job on GPU 0 keeps FAILED."""
    import time

    from healthcheck.records import outbox, store

    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    now = time.time()
    for job, gpus in (("41", [3]), ("42", [0])):
        store.write_record(state, {"job_id": job, "node": "gpu1", "class": "FAILED", "slurm_class": "FAILED",
                                   "evidence": [], "exit": 1, "gpus": gpus, "ended_at": now - 20})
        store.note_ending(state, "gpu1", job, now - 20)
    inject(config, "gpu.3.state=lost")
    done = program("--config", config, "--node", "gpu1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["findings"][0]["check"] == "gpu.lost"
    record = store.read_record(state, "41", "gpu1")
    assert record["class"] == "GPU_LOST" and record["amended_from"] == "FAILED"
    assert store.read_record(state, "42", "gpu1")["class"] == "FAILED"
    assert [entry["class"] for entry in queued_entries(state, "41")] == ["GPU_LOST"]
    assert "42" not in outbox.pending(state)
