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


def test_lab_down_stops_the_daemons_when_slurmctld_is_too_busy_to_answer(tmp_path, monkeypatch):
    """At 256 nodes on 2 cores slurmctld stopped answering squeue; `lab down` then raised at its
    job cancellation and left 2,000 processes running. Cancelling is a courtesy: the daemons
    are stopped whatever squeue says."""
    from slurm_hooks.lab import LabError, cluster, monitoring, watchers

    lab = LabPaths(str(tmp_path / "lab"))
    os.makedirs(lab.log)
    ctld = daemons.Daemon("slurmctld", "slurmctld", str(tmp_path / "ctld.pid"), "", None, None, 1, 1)
    monkeypatch.setattr(daemons.Daemon, "pid", lambda self, lab: 4242)
    monkeypatch.setattr(daemons, "daemons", lambda lab: [ctld])
    monkeypatch.setattr(daemons, "by_name", lambda lab, name: ctld)
    stopped = []
    monkeypatch.setattr(daemons, "stop", lambda lab, table, say: stopped.extend(d.name for d in table) or
                        [d.name for d in table])
    monkeypatch.setattr(daemons, "leftovers", lambda lab: {})
    monkeypatch.setattr(monitoring, "down", lambda lab, say: [])
    monkeypatch.setattr(watchers, "stop_all", lambda lab, say: ["watch gpu1"])
    monkeypatch.setattr(cluster, "remove_cgroups", lambda lab: None)

    def squeue_hangs(argv, **kwargs):
        raise LabError("squeue -h -o %A: no answer within 10 s")
    monkeypatch.setattr(cluster, "run", squeue_hangs)
    said = []
    result = cluster._down(lab, said.append)
    assert "slurmctld" in stopped and "watch gpu1" in result["stopped"]
    assert any("jobs not cancelled" in line and "no answer" in line for line in said)
