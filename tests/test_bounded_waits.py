"""Bounded waits: a probe child stuck in the driver dies with its parent, and what a killed run
left in the temp dir is cleaned up by the next run. (Lock deadlines: test_fsutil_hardening.py.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from healthcheck.safeio import fsutil

from .conftest import ROOT, run_cli

# A parent that starts a probe child which hangs (like NVML on a lost GPU) and then waits.
PARENT = """
import sys, time
from healthcheck.probes.deadline import ChildProbe
child = ChildProbe(lambda emit: time.sleep(3600), 3600).start()
print(child.pid, flush=True)
time.sleep(3600)
"""


def process_state(pid: int) -> str:
    """'' when the process is gone (a zombie counts as gone: it runs no more code)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return "" if state in ("Z", "X") else state


def wait_gone(pid: int, bound_s: float = 20.0) -> bool:
    """Polls until the process is gone; the bound only stops a failing test from hanging."""
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if not process_state(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_hung_probe_child_dies_with_its_parent(signum):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT))
    child = int(parent.stdout.readline())
    try:
        assert process_state(child), "the probe child runs while its parent does"
        parent.send_signal(signum)
        parent.wait(30)
        assert wait_gone(child), f"probe child {child} outlived its parent ({process_state(child)})"
    finally:
        for pid in (child, parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.stdout.close()


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_temp_dirs_of_killed_runs_are_removed_by_the_next_run(tmp_path):
    stale = tmp_path / f"slurm-gpu-check-{dead_pid()}-abc123"
    (stale / "sim" / "gpu1").mkdir(parents=True)
    (stale / "sim" / "gpu1" / "profile.toml").write_text("x")
    live = tmp_path / f"slurm-gpu-check-{os.getpid()}-def456"
    live.mkdir()
    other = tmp_path / "slurm-gpu-checkout"
    other.mkdir()
    with fsutil.run_temp_dir("slurm-gpu-check-", str(tmp_path)) as path:
        assert os.path.isdir(path) and os.path.basename(path).startswith(f"slurm-gpu-check-{os.getpid()}-")
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o700)
    assert not stale.exists() and live.exists() and other.exists() and not os.path.exists(path)


def test_check_sim_cleans_up_after_a_killed_earlier_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)          # re-read TMPDIR
    stale = tmp_path / f"slurm-gpu-check-{dead_pid()}-zzz"
    stale.mkdir()
    result = run_cli(["check", "--sim", "h100-healthy", "--node", "gpu1"])
    assert result.exit_code == 0, result.stderr
    assert not stale.exists()
    assert [name for name in os.listdir(tmp_path) if name.startswith("slurm-gpu-check-")] == []
