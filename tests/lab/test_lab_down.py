"""``lab down`` leaves no lab process behind. Runs last (see conftest) and leaves the lab down."""
from __future__ import annotations

import pytest

from slurm_hooks.lab import daemons as D
from slurm_hooks.lab import paths as P


pytestmark = [pytest.mark.lab, pytest.mark.every_release]

NAMES = {"slurmctld", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd"}


def lab_processes(lab):
    """Live (not zombie) Slurm, munge or MariaDB processes that belong to this lab."""
    found = []
    for pid in D.all_pids():
        if D.alive(pid) and D.proc_exe_name(pid) in NAMES and D.belongs_to_lab(pid, lab.paths):
            found.append((pid, D.proc_exe_name(pid), " ".join(D.proc_cmdline(pid))))
    return found


def rootfs_mounts(lab):
    """Processes whose mount namespace still binds a release's root filesystem (24.11, 26.05)."""
    found = []
    for pid in D.all_pids():
        try:
            with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as handle:
                if lab.paths.rootfs_dir + "/" in handle.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_lab_down_leaves_nothing_running(lab, scenario_run, cli):
    assert lab_processes(lab), "the lab should be running before `lab down`"
    result = cli("lab", "down", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lab_processes(lab) == []
    assert rootfs_mounts(lab) == []     # the namespaces, and their mounts, went with the processes
    for port in (P.SLURMCTLD_PORT, P.SLURMDBD_PORT, P.MARIADB_PORT, *(P.slurmd_port(n) for n in P.NODES)):
        assert not D.port_open(port), port
    status = cli("lab", "status")
    assert status.returncode == 3, status.stdout
    again = cli("lab", "down")
    assert again.returncode == 0 and "nothing was running" in again.stdout
