"""The wheel holds everything the commands need: installed into a clean venv (not editable, no
source tree), it gives the four commands, the built-in defaults and the shipped simulator
profiles; and the hooks stay lean."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile

import pytest

from healthcheck.config import shipped

from .conftest import ROOT

COMMANDS = ("slurm-gpu", "slurm-gpu-prolog", "slurm-gpu-epilog", "slurm-gpu-healthcheck", "slurm-gpu-watch")


@pytest.fixture(scope="module")
def installed(built_wheel, tmp_path_factory):
    """A fresh venv with only the wheel (and its dependencies) installed: its bin/ directory."""
    target = tmp_path_factory.mktemp("installed") / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    install = subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "-q",
                              "--disable-pip-version-check", built_wheel],
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert install.returncode == 0, install.stderr[-2000:]
    return target / "bin"


def _run(argv, cwd, **kw):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}      # no PYTHONPATH, no source tree
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(cwd), env=env,
                          stdin=subprocess.DEVNULL, **kw)


def test_the_wheel_holds_the_data_the_commands_read(built_wheel):
    names = set(zipfile.ZipFile(built_wheel).namelist())
    for profile in shipped.shipped_names():
        assert f"healthcheck/data/sim/{profile}.toml" in names, profile
    for data in ("healthcheck/data/defaults.toml", "healthcheck/data/sim-defaults.toml",
                 "healthcheck/data/xid-catalog.tsv", "slurm_hooks/data/lab-slurm.conf.tmpl"):
        assert data in names, data
    assert not any(name.startswith(("tests/", "etc/", "docs/")) for name in names)
    for shared in ("slurm-gpu-hooks/prometheus/slurm-gpu-hooks.rules.yml", "slurm-gpu-hooks/grafana/slurm-gpu-hooks.json",
                   "man/man1/slurm-gpu.1"):
        assert f"slurm_gpu_hooks-0.1.0.data/data/share/{shared}" in names, sorted(names)[-5:]


def test_pip_install_gives_the_four_commands(installed, tmp_path):
    for command in COMMANDS:
        assert os.access(installed / command, os.X_OK), command
    helped = _run([str(installed / "slurm-gpu"), "--help"], tmp_path)
    assert helped.returncode == 0
    for sub in ("check", "config", "lab", "sim", "slurm-conf", "xid"):
        assert f"  {sub} " in helped.stdout, helped.stdout
    # Package data travels with the wheel: the config check needs the built-in defaults.
    checked = _run([str(installed / "slurm-gpu"), "config", "check", os.path.join(ROOT, "etc", "slurm-gpu-hooks.toml")],
                   tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_installed_check_runs_a_shipped_profile_by_name(installed, tmp_path):
    done = _run([str(installed / "slurm-gpu"), "check", "--sim", "h100-ecc-dbe", "--node", "gpu1", "--json"], tmp_path)
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "fail"
    assert {"gpu.ecc.uncorrectable", "kernel.xid"} <= {f["check"] for f in report["findings"]}
    assert all(f["gpu"] == 3 for f in report["findings"] if f["check"] == "gpu.ecc.uncorrectable")
    # The profile came from the installed package, not from this checkout.
    listed = _run([str(installed / "slurm-gpu"), "sim", "profiles"], tmp_path)
    assert listed.returncode == 0 and listed.stdout.split()[0] in shipped.shipped_names()
    where = _run([str(installed / "python"), "-c", "from healthcheck.config import shipped; print(shipped.shipped_dir())"],
                 tmp_path)
    assert where.stdout.strip().startswith(str(installed.parent)), where.stdout


def test_the_lab_prepares_from_the_installed_package(installed, tmp_path):
    """`slurm-gpu lab up` needs no checkout: its profiles and templates come from the package.
    (Starting the daemons is the lab tests' job; this renders and copies into a temp lab dir.)"""
    script = ("import os, sys\n"
              "from slurm_hooks.lab import cluster, render\n"
              "from slurm_hooks.lab.paths import LabPaths\n"
              "lab = LabPaths(sys.argv[1])\n"
              "os.makedirs(lab.sim_profiles)\n"
              "cluster.copy_sim_profiles(lab)\n"
              "files = render.all_files(lab, render.RenderOptions.here(), 'pw')\n"
              "print(len(os.listdir(lab.sim_profiles)), len(files), render.RenderOptions.here().bin_dir)\n")
    done = _run([str(installed / "python"), "-c", script, str(tmp_path / "lab")], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    profiles, files, bin_dir = done.stdout.split()
    assert int(profiles) == len(shipped.shipped_names()) and int(files) >= 4
    assert bin_dir == str(installed)


def test_the_installed_package_says_its_lab_runs_the_hosts_release(installed, tmp_path):
    """The default release (a root filesystem) installs the hooks from a wheel built from a checkout;
    an installed package has none, and says in one line what it can run (docs/install.md)."""
    script = ("from slurm_hooks.lab import LabError, rootfs\n"
              "try:\n    rootfs.checkout()\nexcept LabError as exc:\n    print(exc)\n")
    done = _run([str(installed / "python"), "-c", script], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is not one (no setup.cfg)" in done.stdout and "`lab up --slurm 22.05`" in done.stdout, done.stdout


def test_hooks_never_import_jinja2_or_click(tmp_path, sim_config):
    """The prolog runs before every job on every node: its import path stays lean."""
    probe = ("import sys, runpy\n"
             "from slurm_hooks import prolog, epilog\n"
             "from healthcheck import healthcheck\n"
             "rc = [prolog.main([]), epilog.main([]), healthcheck.main([])]\n"
             "assert rc == [0, 0, 0], rc\n"
             "heavy = sorted(m for m in ('jinja2', 'markupsafe', 'click') if m in sys.modules)\n"
             "print('heavy:', heavy)\n")
    env = {"SLURM_GPU_HOOKS_CONFIG": sim_config, "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "1",
           "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "heavy: []" in done.stdout


def test_hooks_with_a_broken_config_exit_zero_and_say_why(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpu]\nbackend = 'cuda'\n")
    for command in ("slurm_hooks.prolog", "slurm_hooks.epilog", "healthcheck.healthcheck"):
        done = subprocess.run([sys.executable, "-m", command], capture_output=True, text=True, timeout=60,
                              env={"SLURM_GPU_HOOKS_CONFIG": str(bad), "PYTHONPATH": ROOT,
                                   "SLURMD_NODENAME": "gpu1"})
        assert done.returncode == 0, (command, done.stderr)
        assert "config unusable" in done.stderr and "Traceback" not in done.stderr
