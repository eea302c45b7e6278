"""Which processes are the lab's (slurm_hooks/lab/daemons.py): what `lab down` stops."""
from __future__ import annotations

import os
import subprocess
import sys

from slurm_hooks.lab import daemons
from slurm_hooks.lab.paths import LabPaths

# A process that renames itself and keeps no environment, as slurmstepd does ("slurmstepd:
# [1082.batch]", no SLURM_CONF): only its working directory is left to say whose it is.
RENAMED = "import sys, time; sys.argv[0] = 'x'; print('up', flush=True); time.sleep(60)"


def started(cwd: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", RENAMED], cwd=cwd, env={}, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"up\n"
    return child


def test_a_process_working_in_the_lab_is_the_labs_and_one_working_elsewhere_is_not(tmp_path):
    lab = LabPaths(str(tmp_path / "lab"))
    inside = tmp_path / "lab" / "var" / "log"
    inside.mkdir(parents=True)
    elsewhere = tmp_path / "lab-other"          # a sibling whose name starts the same
    elsewhere.mkdir()
    ours, theirs = started(str(inside)), started(str(elsewhere))
    try:
        assert daemons.belongs_to_lab(ours.pid, lab)
        assert not daemons.belongs_to_lab(theirs.pid, lab)
        assert not daemons.belongs_to_lab(os.getpid(), lab)
    finally:
        for child in (ours, theirs):
            child.kill()
            child.wait()
