"""`slurm-gpu lab soak` for three minutes on the lab (issue 34): jobs of every shape end while a
GPU falls off the bus on one node (Xid 79) and is mended, the hooks' state disk is full for 30 s,
a watcher is killed and started again and slurmdbd is restarted, with remediation on. Nothing is lost: every ended job's record reaches
accounting, no healthy node is drained, the fault is drained with its cause, and the watchers'
descriptors do not grow. The schedule is the seed's (tests/test_lab_soak.py checks it holds the
fault, the restart and the kill)."""
from __future__ import annotations

import json
import subprocess

import pytest

from slurm_hooks.lab import soak as S
from slurm_hooks.lab.paths import NODES

from .conftest import slurm_gpu, tail

pytestmark = pytest.mark.lab

SEED = 41             # xid79-gpu-lost on gpu1 at 12 s (mended at 60 s), gpu3's watcher killed, slurmdbd restarted,
#                       the state disk full from 61 s to 91 s
MINUTES = 3
SETTLE_S = 120
MAX_FAULTS = 2
DISK_FULL_S = 30
PLAN = S.Plan(seconds=MINUTES * 60, nodes=NODES, settle_s=SETTLE_S, max_faults=MAX_FAULTS,
              disk_for=(DISK_FULL_S, DISK_FULL_S))
# The soak's three minutes, then its jobs' end (at most S.JOBS_WAIT_S), the last check back
# (settle, and a grace while the node reboots), the final wait for records (S.RECORDS_WAIT_S), and room
# for a slow machine.
TIMEOUT = MINUTES * 60 + S.JOBS_WAIT_S + SETTLE_S + S.CHECK_BACK_GRACE_S + S.RECORDS_WAIT_S + 240


def test_a_three_minute_soak_loses_no_record_drains_no_healthy_node_and_leaks_no_descriptor(lab, tmp_path):
    out = tmp_path / "soak.json"
    try:
        result = slurm_gpu("lab", "soak", "--minutes", str(MINUTES), "--seed", str(SEED), "--faults",
                           str(MAX_FAULTS), "--settle-seconds", str(SETTLE_S), "--disk-full-seconds",
                           str(DISK_FULL_S), "--sample-seconds", "5",
                           "--out", str(out), timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`slurm-gpu lab soak` did not finish within {TIMEOUT} s", pytrace=False)
    if not out.exists():
        pytest.fail(f"`slurm-gpu lab soak` rc {result.returncode} wrote no results:\n{tail(result.stdout)}\n"
                    f"{tail(result.stderr)}", pytrace=False)
    doc = json.loads(out.read_text(encoding="utf-8"))
    print("\n".join(S.format_table(doc)))
    assert doc["seed"] == SEED and doc["jobs_ended"] > 0 and doc["faults_injected"] >= 1
    assert doc["daemon_restarts"] and doc["watcher_kills"] == 1
    assert doc["state_disk_full"] == 1 and doc["state_disk_full_mib"] > 0, doc["errors"]
    assert doc["records_lost"] == 0, doc["records_lost_jobs"]
    assert doc["false_drains"] == 0, doc["false_drain_list"]
    assert doc["faults_drained_with_cause"] == doc["faults_injected"], doc["faults_not_drained_with_cause"]
    for node, summary in doc["watchers"].items():
        assert summary["samples"] > 0, node
        if summary["measured_samples"] >= 6:
            assert summary["fd_growth"] <= 0, (node, summary)
    assert result.returncode == 0, tail(result.stderr)
