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


def _sacct_jobs(lab) -> list:
    done = lab.run("sacct", "-a", "-X", "-n", "-P", "-S", "2020-01-01", "-o", "JobIDRaw")
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.split() if line]


def test_a_clean_lab_up_forgets_what_earlier_runs_left(lab, cli):
    """Issue 24: a test session must not inherit an earlier one's state. Leave what broke 27
    lab tests on a used machine (a malformed outbox file, stale hook state, a drained node, jobs
    in accounting); `lab up --clean` (what conftest runs) starts from none of it. Runs late: it
    restarts the cluster under the tests that read the scenario jobs."""
    import os

    old = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", "gpu1", "--wrap", "true")
    assert old.returncode == 0, old.stderr
    outbox = os.path.join(lab.paths.state, "outbox")
    os.makedirs(outbox, exist_ok=True)
    junk = [os.path.join(outbox, "424242.json"), os.path.join(lab.paths.state, "leftover-from-an-earlier-run")]
    for path in junk:
        with open(path, "w") as handle:
            handle.write('{"job_id": "424242", "queued_at": "x", "entry": "x"}')
    assert lab.run("scontrol", "update", "nodename=gpu2", "state=drain", "reason=left by an earlier run").returncode == 0
    result = cli("lab", "up", "--clean", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "clean start: removed" in result.stdout
    assert not any(os.path.lexists(path) for path in junk)
    assert _sacct_jobs(lab) == []                                       # the accounting database is new
    assert lab.run("sinfo", "-h", "-n", "gpu2", "-o", "%T").stdout.strip() in ("idle", "idle*"), "drain kept"
    new = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", "gpu1", "--wrap", "true")
    assert new.returncode == 0, new.stderr
    assert int(new.stdout.strip().split(";")[0]) <= int(old.stdout.strip().split(";")[0])   # slurmctld's state is new


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
