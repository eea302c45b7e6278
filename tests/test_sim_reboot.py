"""``slurm-gpu sim reboot``: a new boot id, an empty kernel log, transient faults cleared and
hardware faults kept."""
from __future__ import annotations

import os

from healthcheck.sim.node import SimNode

from .conftest import SIM_PROFILES

PROFILE = os.path.join(SIM_PROFILES, "h100-healthy.toml")


def test_reboot_changes_the_boot_id_and_clears_what_a_reboot_clears(tmp_path):
    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    node.ensure()
    before = node.boot_id()
    assert len(before) == 36
    node.inject([("gpu.2.state", "lost"), ("gpu.3.ecc.volatile_uncorrected", 2), ("gpu.3.ecc.aggregate_uncorrected", 2),
                 ("gpu.4.remapped_rows.pending", True), ("gpu.5.remapped_rows.failure", True),
                 ("ib.mlx5_1:1.state", "1: DOWN")], ["NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus."])
    live = node.reboot()
    assert node.boot_id() != before and len(node.boot_id()) == 36
    gpus = live["gpu"]
    assert gpus[2]["state"] == "ok" and gpus[3]["ecc"]["volatile_uncorrected"] == 0
    assert gpus[3]["ecc"]["aggregate_uncorrected"] == 2                   # lifetime counts survive
    assert gpus[4]["remapped_rows"]["pending"] is False
    assert gpus[5]["remapped_rows"]["failure"] is True                    # hardware stays broken
    assert next(p for p in live["ib"] if p["hca"] == "mlx5_1")["state"] == "1: DOWN"
    with open(node.kernel_log_path) as handle:
        assert handle.read() == ""
    assert node.load() == live


def test_reset_is_a_reboot_into_mended_hardware(tmp_path):
    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    node.ensure()
    before = node.boot_id()
    node.ensure()
    assert node.boot_id() == before
    node.inject([("gpu.5.remapped_rows.failure", True)])
    node.reset()
    assert node.boot_id() != before and node.load()["gpu"][5]["remapped_rows"]["failure"] is False


def test_the_cli_reboots(tmp_path, monkeypatch):
    import subprocess
    import sys

    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpu]\nbackend = "sim"\n[sim]\nprofile = "{PROFILE}"\n')
    done = subprocess.run([sys.executable, "-c", "from slurm_hooks.cli import main; main()", "sim", "reboot",
                           "--config", str(config), "gpu7"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu7: rebooted (boot id ") and SimNode(str(tmp_path), "gpu7").boot_id() in done.stdout
