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


def test_reboot_clears_the_drivers_recovery_action_and_a_lemon_falls_off_again_each_boot(tmp_path):
    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    node.inject([("gpu.1.recovery_action", "reboot"), ("gpu.3.lost_every_boot", True)])
    for _ in range(2):
        live = node.reboot()
        assert [g["state"] for g in live["gpu"]] == ["ok"] * 3 + ["lost"] + ["ok"] * 4
        assert {g["recovery_action"] for g in live["gpu"]} == {"none"}
    node.reset()
    assert node.load()["gpu"][3]["state"] == "ok"          # mended: the part was replaced


def _cli(config, *args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "from slurm_hooks.cli import main; main()", *args,
                           "--config", str(config)], capture_output=True, text=True, timeout=60)


def test_an_injected_recovery_action_is_a_drain_finding_of_check_json_and_an_old_driver_has_none(tmp_path):
    """The issue's acceptance: sim inject NODE 'gpu.4.recovery_action="reboot"' -> check --json
    has a gpu.recovery_action finding with action drain; on R535 the field is unknown: none."""
    import json

    for profile, expected in ((PROFILE, [("gpu.recovery_action", 4, "drain", "reboot")]),
                              (os.path.join(SIM_PROFILES, "h100-driver-r535.toml"), [])):
        state = tmp_path / os.path.basename(profile)
        config = tmp_path / f"{state.name}.toml"
        config.write_text(f'[paths]\nstate_dir = "{state}"\n[gpu]\nbackend = "sim"\n[sim]\nprofile = "{profile}"\n')
        done = _cli(config, "sim", "inject", "gpu4", 'gpu.4.recovery_action="reboot"')
        assert done.returncode == 0, done.stderr
        done = _cli(config, "check", "--node", "gpu4", "--json")
        report = json.loads(done.stdout)
        assert [(f["check"], f["gpu"], f["action"], f["evidence"]["recovery_action"])
                for f in report["findings"]] == expected, report


def test_a_gpu_reset_clears_that_gpu_alone_and_keeps_the_boot(tmp_path):
    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    live = node.ensure()
    before = node.boot_id()
    node.inject([("gpu.2.state", "lost"), ("gpu.3.state", "lost"), ("gpu.4.remapped_rows.pending", True),
                 ("gpu.4.ecc.volatile_uncorrected", 1), ("gpu.4.ecc.aggregate_uncorrected", 1)],
                ["NVRM: Xid (PCI:0000:38:00): 79, pid=1, name=x, GPU has fallen off the bus."])
    bus_id, uuid = live["gpu"][4]["pci_bus_id"], live["gpu"][4]["uuid"]
    assert node.gpu_reset("2")[0] == 0
    assert node.gpu_reset(bus_id.lower().replace("00000000:", "0000:"))[0] == 0    # sysfs' spelling
    gpus = node.load()["gpu"]
    assert gpus[2]["state"] == "ok" and gpus[3]["state"] == "lost"               # that GPU alone
    assert gpus[4]["remapped_rows"]["pending"] is False and gpus[4]["ecc"]["volatile_uncorrected"] == 0
    assert gpus[4]["ecc"]["aggregate_uncorrected"] == 1
    assert node.gpu_reset(uuid)[0] == 0 and node.gpu_reset("GPU-nothing")[0] != 0
    assert node.boot_id() == before
    with open(node.kernel_log_path) as handle:
        assert "Xid" in handle.read()                                              # not a reboot


def test_a_gpu_reset_is_refused_while_a_process_holds_the_gpu(tmp_path):
    import subprocess

    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    node.ensure()
    node.inject([("gpu.1.state", "lost"), ("gpu.1.processes", [{"pid": 7, "used_memory_mib": 10}])])
    program = os.path.join(node.programs_dir, "nvidia-smi")
    refused = subprocess.run([program, "--gpu-reset", "-i", "1"], capture_output=True, text=True)
    assert refused.returncode != 0 and "being used by some other process" in refused.stderr
    assert node.load()["gpu"][1]["state"] == "lost"
    node.inject([("gpu.1.processes", [])])
    done = subprocess.run([program, "--gpu-reset", "-i", "1"], capture_output=True, text=True)
    assert done.returncode == 0 and "was successfully reset" in done.stdout
    assert node.load()["gpu"][1]["state"] == "ok"
    assert subprocess.run([program, "-q"], capture_output=True).returncode != 0   # only the reset


HOLD_OPEN = ("import sys; from healthcheck.sim import sim_pynvml as nvml; nvml._bind(sys.argv[1]); nvml.nvmlInit(); "
             "print('open', flush=True); sys.stdin.read()")


def test_a_gpu_reset_is_refused_while_a_live_process_has_nvml_open_on_the_node(tmp_path):
    """As the real driver: a process that initialised NVML (the old watcher did) holds every GPU;
    the reset refuses until it exits, whether it shut NVML down or was killed."""
    import subprocess
    import sys

    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    node.ensure()
    node.inject([("gpu.1.state", "lost")])
    program = os.path.join(node.programs_dir, "nvidia-smi")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, node.live_path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        assert node.holders() == [holder.pid]
        refused = subprocess.run([program, "--gpu-reset", "-i", "1"], capture_output=True, text=True)
        assert refused.returncode == 255 and "being used by some other process" in refused.stderr
        assert node.load()["gpu"][1]["state"] == "lost"
    finally:
        holder.kill()                           # exits without nvmlShutdown: a dead pid holds nothing
        holder.wait()
    done = subprocess.run([program, "--gpu-reset", "-i", "1"], capture_output=True, text=True)
    assert done.returncode == 0 and "was successfully reset" in done.stdout
    assert node.load()["gpu"][1]["state"] == "ok" and node.holders() == []


def test_nvml_shut_down_holds_the_gpus_no_longer(tmp_path):
    from healthcheck.sim import sim_pynvml as nvml

    node = SimNode(str(tmp_path), "gpu1", PROFILE)
    node.ensure()
    nvml._bind(node.live_path)
    nvml.nvmlInit()
    try:
        assert node.holders() == [os.getpid()]
        held = os.stat(os.path.join(node.dir, "open", str(os.getpid())))
        assert held.st_mode & 0o777 == 0o640                     # the project's file mode, whatever the umask
    finally:
        nvml.nvmlShutdown()
    assert node.holders() == [] and node.gpu_reset("1")[0] == 0
