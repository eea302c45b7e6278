"""A lab node's boot (slurm_hooks/lab/boots.py): the time namespace that gives a rebooted node's
slurmd its own uptime, and how the RebootProgram finds its node."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from slurm_hooks.lab import boots
from slurm_hooks.lab.paths import LabPaths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPTIME = "import ctypes; b = ctypes.create_string_buffer(128); ctypes.CDLL(None).sysinfo(b); " \
         "print(int.from_bytes(b.raw[:8], 'little'))"


def test_the_offset_makes_the_uptime_the_time_since_the_nodes_boot_and_never_precedes_the_host():
    assert boots.boottime_offset(None) == 0
    assert boots.boottime_offset(boot_epoch=1000.0, now=1010.0, host_uptime=500.0) == -490
    assert boots.boottime_offset(boot_epoch=1000.0, now=1010.0, host_uptime=5.0) == 0      # host rebooted since
    assert boots.boottime_offset(boot_epoch=2000.0, now=1010.0, host_uptime=500.0) == -500   # clock went back


def test_a_slurmd_started_in_its_boot_sees_that_boots_uptime_and_the_host_uptime_is_read_through_it(tmp_path):
    """What slurmd reads (sysinfo's uptime) inside the prefix the lab puts before it."""
    lab = LabPaths(str(tmp_path))
    os.makedirs(lab.run)
    assert boots.slurmd_prefix(lab, "gpu1", "/usr/bin/unshare") == []       # never rebooted: the host's boot
    with open(boots.boot_file(lab, "gpu1"), "w") as handle:
        handle.write(f"{time.time() - 30:.3f}\n")
    prefix = boots.slurmd_prefix(lab, "gpu1", shutil.which("unshare") or "/usr/bin/unshare")
    assert prefix[1] == "--time" and prefix[2].startswith("--boottime=-")
    code = UPTIME + "; from slurm_hooks.lab.boots import _host_uptime; print(int(_host_uptime()))"
    done = subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    inside, host = (int(v) for v in done.stdout.split())
    assert 29 <= inside <= 40
    assert abs(host - boots._host_uptime()) <= 5


def test_the_reboot_program_finds_its_node_from_the_slurmd_above_it(tmp_path):
    """slurmd runs RebootProgram without the node's name (several slurmd share the lab's host)."""
    fake = tmp_path / "slurmd"
    shutil.copy("/bin/sh", fake)
    code = "from slurm_hooks.lab.reboot import calling_node; print(calling_node())"
    script = f"{sys.executable} -c '{code}'; true"
    done = subprocess.run([str(fake), "-c", script, "slurmd", "-N", "gpu7"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.stdout.strip() == "gpu7", done.stderr


def test_a_reboot_whose_simulated_hardware_fails_still_starts_the_nodes_slurmd_again(tmp_path, monkeypatch):
    """The soak of stop 41: a profile the installed simulator refused left two nodes without slurmd."""
    import pytest

    from healthcheck.config import Config
    from slurm_hooks.lab import daemons, reboot

    lab = LabPaths(str(tmp_path))
    os.makedirs(lab.run)
    calls = []
    monkeypatch.setattr(daemons, "by_name", lambda _lab, name: name)
    monkeypatch.setattr(daemons, "stop", lambda _lab, which, say: calls.append(("stop", which)))
    monkeypatch.setattr(daemons, "start", lambda _lab, which, say: calls.append(("start", which)))
    monkeypatch.setattr(reboot.time, "sleep", lambda seconds: None)

    def refused(path):
        raise ValueError(f"{path}: unknown key")
    monkeypatch.setattr(Config, "load", staticmethod(refused))
    with pytest.raises(ValueError):
        reboot.reboot_node(lab, "gpu2", say=lambda message: None)
    assert calls == [("stop", ["slurmd gpu2"]), ("start", "slurmd gpu2")]
    assert os.path.isfile(boots.boot_file(lab, "gpu2"))
