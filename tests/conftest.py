"""Shared fixtures: paths into the working tree and a simulated node on a temp state dir."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETC = os.path.join(ROOT, "etc")
SIM_PROFILES = os.path.join(ROOT, "healthcheck", "data", "sim")   # the shipped profiles


@pytest.fixture
def sim_config(tmp_path):
    """A config file using the simulator for every node, with the shipped profiles beside it."""
    shutil.copytree(SIM_PROFILES, tmp_path / "sim")
    path = tmp_path / "config.toml"
    path.write_text(
        '[paths]\nstate_dir = "state"\n'
        '[gpu]\nbackend = "sim"\nprobe_timeout_s = 20.0\n'           # no run here hangs on purpose: a slow host is no hang
        '[sim]\nprofile = "sim/h100-healthy.toml"\n'
        'nodes = { gpu2 = "sim/h100-xid79-gpu-lost.toml", pcie1 = "sim/pcie-l40s-healthy.toml" }\n'
        '[[nodes]]\nmatch = "gpu[1-3]"\ngpus = 8\ngpu_model = "H100"\nnvlinks_per_gpu = 18\n'
        '[health]\ntextfile_dir = "metrics"\n'
    )
    return str(path)


@pytest.fixture
def isolated_env(monkeypatch):
    """No config or node name leaks in from the machine running the tests."""
    for name in ("SLURM_GPU_HOOKS_CONFIG", "SLURMD_NODENAME", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def run_cli(args, env=None):
    """``slurm-gpu ARGS`` in-process; returns the click Result (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from slurm_hooks.cli import main

    try:
        runner = CliRunner(mix_stderr=False)     # click 8.1 (the last for Python 3.9)
    except TypeError:
        runner = CliRunner()                     # click >= 8.2 always keeps them apart
    merged = dict(os.environ)
    merged.pop("SLURM_GPU_HOOKS_CONFIG", None)
    merged.update(env or {})
    return runner.invoke(main, list(args), env=merged, catch_exceptions=False)


def tracked_copy(dest) -> str:
    """The checkout's tracked files copied to ``dest``: what a clean clone holds. A build runs
    there, never in the checkout, whose build/ and egg-info the lab's own builds (and the
    package tests') use at the same time while the test command runs its suites side by side."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):
            os.makedirs(os.path.join(str(dest), os.path.dirname(name)), exist_ok=True)
            shutil.copy2(source, os.path.join(str(dest), name))
    return str(dest)


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory):
    """The project's wheel, built once per session with ``python -m build`` (as docs/install.md
    says), from a copy of the tracked files."""
    out = tmp_path_factory.mktemp("wheel")
    source = tracked_copy(tmp_path_factory.mktemp("source"))
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), source],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wheels = glob.glob(os.path.join(str(out), "slurm_gpu_hooks-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def builtin_settings(kind, **changes):
    """The typed config section ``kind`` as the built-in defaults give it, with ``changes``: a
    test names what it changes, ``defaults.toml`` (the one home of a default) gives the rest."""
    from healthcheck.config import Config
    from healthcheck.plain import replace

    return replace(Config.builtin().typed(kind), **changes)
