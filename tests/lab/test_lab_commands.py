"""``lab up`` (again), ``status`` and ``env`` against the running lab."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import time

import pytest

from slurm_hooks.lab import daemons as D

from slurm_hooks.lab.commands import slurm_gpu_argv

pytestmark = [pytest.mark.lab, pytest.mark.every_release]


def test_up_again_is_a_quick_no_op(lab, cli):
    began = time.monotonic()
    result = cli("lab", "up")
    assert result.returncode == 0, result.stderr
    assert "everything already ran" in result.stdout
    assert time.monotonic() - began < 15
    for what in ("slurmctld.log", "slurmd-gpu1.log", "slurmdbd.log", "mariadbd.log"):
        assert what in result.stdout  # it says where the logs are


def test_status_lists_every_daemon_running(lab, cli):
    result = cli("lab", "status")
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd gpu1", "slurmd gpu2", "slurmd gpu3"):
        line = [l for l in result.stdout.splitlines() if l.strip().startswith(name + " ")]
        assert line and "running, pid" in line[0], name
        assert D.alive(int(line[0].rsplit(" ", 1)[1]))
    doc = json.loads(cli("lab", "status", "--json").stdout)
    assert all(doc["rss_kib"][name] > 0 for name, pid in doc["daemons"].items() if pid), doc["rss_kib"]


def test_env_points_a_shell_at_the_lab(lab):
    """After eval "$(slurm-gpu lab env)", sinfo, sacct and slurm-gpu sim talk to the lab."""
    tool = " ".join(shlex.quote(part) for part in slurm_gpu_argv())
    script = (f'unset SLURM_CONF SLURM_GPU_HOOKS_CONFIG; eval "$({tool} lab env)"; '
              f"sinfo -h -N -p low -o %N; sacct -X -n -o JobID | head -1; {tool} sim show gpu1 | head -40")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    result = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["gpu1", "gpu2", "gpu3"]
    assert "H100" in result.stdout


def test_config_of_the_lab_passes_config_check(lab, cli):
    result = cli("config", "check", lab.paths.hooks_config)
    assert result.returncode == 0, result.stderr
    assert 'backend = "sim"' in result.stdout


def test_everything_lives_in_the_lab_directory(lab):
    root = lab.paths.root
    mariadbd = D.by_name(lab.paths, "mariadbd").pid(lab.paths)
    assert f"--datadir={root}/mysql/data" in D.proc_cmdline(mariadbd)
    munged = D.by_name(lab.paths, "munged").pid(lab.paths)
    assert f"--socket={root}/munge/munge.socket" in D.proc_cmdline(munged)
    assert stat.S_IMODE(os.stat(lab.paths.slurmdbd_conf).st_mode) == 0o600
    for node in ("gpu1", "gpu2", "gpu3"):
        for index in range(8):
            assert stat.S_ISCHR(os.lstat(os.path.join(lab.paths.fake_gpu_dir(node), f"nvidia{index}")).st_mode)


def test_the_database_server_runs_as_slurmdbd_asks(lab):
    # slurmdbd 26.05 exits on a write conflict when innodb_snapshot_isolation is on (MariaDB 11.8's
    # default): it did in CI, mid-suite. Debian 12's MariaDB 10.11.19 (the 22.05 lab) shows it OFF;
    # an older 10.x may not know it. Either way it is not on.
    from slurm_hooks.lab.commands import run
    from slurm_hooks.lab.install import command

    shown = run([command(lab.paths, "mariadb"), "--no-defaults", f"--socket={lab.paths.mysql_socket}",
                 "-u", "root", "--batch", "--skip-column-names",
                 "-e", "SHOW GLOBAL VARIABLES LIKE 'innodb_snapshot_isolation'"], timeout=30)
    version = run([command(lab.paths, "mariadb"), "--no-defaults", f"--socket={lab.paths.mysql_socket}",
                   "-u", "root", "--batch", "--skip-column-names", "-e", "SELECT VERSION()"], timeout=30)
    if version.stdout.startswith("10."):
        assert shown.stdout.split() in ([], ["innodb_snapshot_isolation", "OFF"]), shown.stdout
    else:
        assert shown.stdout.split() == ["innodb_snapshot_isolation", "OFF"], (version.stdout, shown.stdout)


def test_gpus_are_gres_and_accounted(lab):
    result = lab.run("sinfo", "-h", "-N", "-p", "low", "-o", "%N %G")
    assert result.stdout.split() == ["gpu1", "gpu:8", "gpu2", "gpu:8", "gpu3", "gpu:8"]
    clusters = lab.run("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster")
    assert "lab" in clusters.stdout.split()
