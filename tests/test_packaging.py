"""``pip install .`` in a clean venv gives the four commands, and the hooks stay lean."""
from __future__ import annotations

import os
import subprocess
import sys
import venv

from .conftest import ROOT

COMMANDS = ("slurm-gpu", "slurm-gpu-prolog", "slurm-gpu-epilog", "slurm-gpu-healthcheck")


def test_pip_install_gives_the_four_commands(tmp_path):
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    python = str(target / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", ROOT],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    for command in COMMANDS:
        assert os.access(target / "bin" / command, os.X_OK), command
    helped = subprocess.run([str(target / "bin" / "slurm-gpu"), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0
    for sub in ("check", "config", "lab", "sim", "xid"):
        assert f"  {sub} " in helped.stdout, helped.stdout
    # Package data travels with the wheel: the config check needs the built-in defaults.
    checked = subprocess.run([str(target / "bin" / "slurm-gpu"), "config", "check",
                              os.path.join(ROOT, "etc", "slurm-gpu-hooks.toml")],
                             capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert checked.returncode == 0, checked.stderr


def test_hooks_never_import_jinja2(tmp_path, sim_config):
    """The prolog runs before every job on every node: its import path stays lean."""
    probe = ("import sys, runpy\n"
             "from slurm_hooks import prolog, epilog\n"
             "from healthcheck import healthcheck\n"
             "rc = [prolog.main([]), epilog.main([]), healthcheck.main([])]\n"
             "assert rc == [0, 0, 0], rc\n"
             "heavy = sorted(m for m in ('jinja2', 'markupsafe') if m in sys.modules)\n"
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
