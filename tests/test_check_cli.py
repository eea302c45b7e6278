"""``slurm-gpu check``: the JSON contract, exit codes 0/1/2/3 and one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .checks_support import ANSWER_TIMEOUT_S, HANG_TIMEOUT_S
from .conftest import ROOT, SIM_PROFILES, run_cli

H100_NODE = """
[[nodes]]
match = "gpu1"
gpus = 8
gpu_model = "H100"
nvlinks_per_gpu = 18
nvswitch_fabric = true
ib_ports = ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1", "mlx5_7:1"]
ib_rate_gbps = 400
ib_link_layer = "InfiniBand"
power_limit_w = 700
"""


def write_config(tmp_path, probe_timeout_s: float, name: str = "config.toml") -> str:
    path = tmp_path / name
    path.write_text(f'[gpu]\nprobe_timeout_s = {probe_timeout_s}\n' + H100_NODE)
    return str(path)


@pytest.fixture
def config_file(tmp_path, isolated_env):
    return write_config(tmp_path, ANSWER_TIMEOUT_S)


@pytest.fixture
def hang_config_file(tmp_path, isolated_env):
    """A short deadline for the runs that hang on purpose."""
    return write_config(tmp_path, HANG_TIMEOUT_S, "hang.toml")


def check(config, profile, *extra):
    return run_cli(["check", "--config", config, "--node", "gpu1", "--sim", os.path.join(SIM_PROFILES, profile),
                    *extra])


@pytest.mark.parametrize("profile,code,status", [
    ("h100-healthy.toml", 0, "ok"),
    ("h100-power-capped.toml", 1, "warn"),
    ("h100-xid79-gpu-lost.toml", 2, "fail"),
    ("h100-gpu-hang.toml", 3, "error"),
])
def test_exit_status_follows_the_worst_finding(config_file, hang_config_file, profile, code, status):
    result = check(hang_config_file if status == "error" else config_file, profile, "--json")
    assert result.exit_code == code, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"v", "node", "status", "findings", "duration_ms"} and doc["v"] == 1
    assert doc["node"] == "gpu1" and doc["status"] == status and isinstance(doc["duration_ms"], int)
    for finding in doc["findings"]:
        assert {"check", "status", "action", "message", "gpu", "pci_bus_id", "hca", "port",
                "evidence"} <= set(finding)
        assert finding["status"] in ("warn", "fail", "error") and finding["action"] in ("none", "warn", "drain")
    assert bool(doc["findings"]) == (code != 0)


def test_finding_subjects_in_json(config_file):
    lost = json.loads(check(config_file, "h100-xid79-gpu-lost.toml", "--json").stdout)["findings"]
    # NVML cannot read a lost GPU's bus id; the kernel's Xid 79 line names it.
    assert [(f["check"], f["gpu"], f["action"]) for f in lost] == [("gpu.lost", 3, "drain"), ("kernel.xid", None, "drain")]
    assert lost[1]["pci_bus_id"] == "0000:5d:00" and lost[1]["evidence"]["code"] == 79
    port = json.loads(check(config_file, "h100-ib-rate-degraded.toml", "--json").stdout)["findings"]
    assert [(f["check"], f["hca"], f["port"], f["gpu"]) for f in port] == [("ib.port", "mlx5_5", 1, None)]
    assert port[0]["evidence"]["rate"] == "200 Gb/sec (4X HDR)"


def test_human_output_is_one_line_per_finding_and_a_summary(config_file):
    result = check(config_file, "h100-fabric-manager-down.toml")
    lines = result.stdout.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 8 + 1
    assert all(line.startswith("FAIL") and "nvlink.fabric" in line and "[drain]" in line for line in lines[:8])
    assert lines[-1].startswith("gpu1: fail (8 failures; tier health,")


def test_prolog_tier_is_selectable(config_file):
    assert check(config_file, "h100-stray-process.toml", "--tier", "prolog").exit_code == 2
    assert check(config_file, "h100-stray-process.toml", "--tier", "health").exit_code == 0


def test_node_without_expectation_only_judges_health_facts(config_file):
    result = run_cli(["check", "--config", config_file, "--node", "other", "--sim",
                      os.path.join(SIM_PROFILES, "h100-gpu-missing.toml"), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["node"] == "other"


@pytest.mark.parametrize("args,needle", [
    (["--sim", "/nonexistent/profile.toml"], "does not exist"),
    (["--tier", "weekly"], "'weekly' is not one of"),
])
def test_bad_input_is_one_line_and_could_not_check(config_file, args, needle):
    result = run_cli(["check", "--config", config_file, "--node", "gpu1", *args])
    assert result.exit_code == 3
    assert needle in result.stderr and "Traceback" not in result.stderr + result.stdout


def test_bad_config_lists_each_problem_on_one_line(tmp_path, isolated_env):
    path = tmp_path / "bad.toml"
    path.write_text('[actions]\n"gpu.cont" = "drain"\n[thresholds]\ntemp = 1\n')
    result = run_cli(["check", "--config", str(path), "--sim", os.path.join(SIM_PROFILES, "h100-healthy.toml")])
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(str(path) + ": ") for line in lines)
    assert 'actions."gpu.cont": unknown check id' in lines[0]


def test_sim_runs_leave_no_state_behind_unless_the_config_names_a_state_dir(tmp_path, isolated_env):
    state = tmp_path / "state"
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\nstate_dir = "{state}"\n' + H100_NODE)
    assert check(str(path), "h100-healthy.toml").exit_code == 0
    assert (state / "sim" / "gpu1" / "profile.toml").exists()
    assert (state / "counters" / "gpu1.json").exists()


def test_a_hanging_gpu_does_not_hold_the_callers_pipe(hang_config_file):
    """Run as a real process with pipes, the way slurmd runs hooks: it ends within the deadline."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from slurm_hooks.cli import main; main()", "check", "--config",
                           hang_config_file, "--node", "gpu1", "--sim", os.path.join(SIM_PROFILES, "h100-nvml-hang.toml")],
                          capture_output=True, text=True, timeout=30, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "SLURM_GPU_HOOKS_CONFIG"})
    assert proc.returncode == 3, proc.stderr
    assert "NVML did not answer within 1 s" in proc.stdout
    assert time.monotonic() - started < 1.0 + 5.0
