"""`slurm-gpu genconf --slurm` against the lab's real slurmctld: a node whose slurm.conf promises
more GPUs (Gres=gpu:8) than the simulator has (7) is one finding line and exit 1; the lab's own
simulated node agrees with Slurm. Both release paths (22.05's `scontrol show node -o` text, the
`scontrol --json` of 24.11 and 26.05) give the same Gres. Nothing here changes the lab's nodes:
the 7-GPU node is a throwaway simulated one (a config without a state dir)."""
from __future__ import annotations

import pytest

from healthcheck.config import Config
from healthcheck.safeio import tomlio

pytestmark = [pytest.mark.lab, pytest.mark.every_release]

NODE = "gpu1"


def test_genconf_on_the_labs_own_node_agrees_with_slurm(lab, cli):
    done = cli("genconf", "--node", NODE, "--slurm", env=lab.env)
    assert done.returncode == 0, done.stdout + done.stderr
    [entry] = tomlio.loads(done.stdout)["nodes"]
    assert entry["match"] == NODE and entry["gpus"] == 8
    assert done.stderr == ""


def test_genconf_reports_slurm_promising_more_gpus_than_the_simulator_has(lab, cli, tmp_path):
    slurm = Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).section("slurm")
    config = tmp_path / "config.toml"        # the lab's Slurm, no state dir: the simulated node is throwaway
    config.write_text(tomlio.dumps({"slurm": {key: slurm[key] for key in ("bin_dir", "conf", "timeout_s")}}))
    done = cli("genconf", "--config", str(config), "--node", NODE, "--sim", "h100-gpu-missing", "--slurm",
               env=lab.env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert tomlio.loads(done.stdout)["nodes"][0]["gpus"] == 7
    [line] = done.stderr.strip().splitlines()
    assert line.split()[:2] == ["FAIL", "slurm.gres"], line
    assert line.endswith(f"{NODE}: Slurm's Gres=gpu:8 promises 8 GPUs, NVML sees 7"), line
