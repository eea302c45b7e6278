"""The remediation decision table (healthcheck/remediate/plan.py): one test per row, and the
ledger that counts reboots per fault signature across reboots."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from healthcheck.plain import replace

import pytest

from healthcheck.actions import ledger as ledgers
from healthcheck.actions.ledger import signature
from healthcheck.config.settings import RemediatePolicy
from healthcheck.remediate.plan import RULES, Situation, next_step, rebooting, within
from healthcheck.slurm.backend import NodeInfo

ON = RemediatePolicy(enabled=True, max_reboots=2, max_reboots_by_xid={}, window_s=3600, max_rebooting_nodes=1,
                     gpu_reset=False, gpu_reset_command=("nvidia-smi", "--gpu-reset", "-i", "{gpu}"),
                     gpu_reset_timeout_s=20.0, records_wait_s=900.0)
# Idle, drained by us for a cause a reboot clears, nothing spent: the row that reboots.
READY = Situation(ours=True, resume_mode="after_reboot", flags=("IDLE", "DRAIN"), idle=True, gpu_scoped=True)

ROWS = {
    "remediate-off": (READY, replace(ON, enabled=False), "none"),
    "not-ours": (replace(READY, ours=False), ON, "none"),
    "inspecting": (replace(READY, inspecting=True), ON, "inspecting"),
    "not-after-reboot": (replace(READY, resume_mode="auto"), ON, "none"),
    "reboot-pending": (replace(READY, flags=("IDLE", "DRAIN", "REBOOT_REQUESTED")), ON, "wait-reboot"),
    "slurm-owns": (replace(READY, flags=("DOWN", "DRAIN")), ON, "slurm-owns"),
    "wait-idle": (replace(READY, flags=("MIXED", "DRAIN"), idle=False), ON, "wait-idle"),
    "reboots-spent": (replace(READY, reboots=2), ON, "inspect"),
    "reset-first": (READY, replace(ON, gpu_reset=True), "reset-gpu"),
    "records-first": (replace(READY, undelivered=3, drained_for_s=60.0), ON, "wait-records"),
    "reboot-budget": (replace(READY, rebooting_elsewhere=1), ON, "wait-budget"),
    "reboot": (READY, ON, "reboot"),
}


def test_every_rule_has_a_row_here():
    assert [rule for rule, *_ in RULES] == list(ROWS)


@pytest.mark.parametrize("rule", list(ROWS))
def test_each_row_decides(rule):
    situation, policy, kind = ROWS[rule]
    step = next_step(situation, policy)
    assert (step.rule, step.kind) == (rule, kind)


def test_records_are_waited_for_only_within_records_wait_s_and_never_with_zero():
    late = replace(READY, undelivered=3, drained_for_s=901.0)
    assert next_step(late, ON).kind == "reboot"
    assert next_step(replace(READY, undelivered=3, drained_for_s=1.0), replace(ON, records_wait_s=0.0)).kind == "reboot"


def test_never_resumed_and_auto_drains_are_not_remediation_s():
    assert next_step(replace(READY, resume_mode="never"), ON).kind == "none"


def test_a_reboot_asked_in_this_boot_is_waited_for_even_before_slurm_shows_it():
    assert next_step(replace(READY, asked="reboot"), ON).kind == "wait-reboot"


def test_a_node_not_back_within_resume_timeout_is_slurms():
    """Slurm marks a node DOWN when it does not come back within ResumeTimeout: never fought over."""
    down = replace(READY, flags=("DOWN", "DRAIN", "NOT_RESPONDING"), idle=True)
    assert next_step(down, ON).kind == "slurm-owns"


def test_a_reset_is_tried_once_only_on_one_gpu_nobody_holds_then_a_reboot():
    policy = replace(ON, gpu_reset=True)
    assert next_step(READY, policy).kind == "reset-gpu"
    assert next_step(replace(READY, resets=1), policy).kind == "reboot"            # it did not clear it
    assert next_step(replace(READY, gpu_busy=True), policy).kind == "reboot"
    assert next_step(replace(READY, gpu_scoped=False), policy).kind == "reboot"    # a node-wide cause


def test_the_count_reached_wins_over_a_reset_and_the_budget():
    spent = replace(READY, reboots=2, rebooting_elsewhere=5)
    assert next_step(spent, replace(ON, gpu_reset=True)).kind == "inspect"


def test_no_budget_limit_with_zero():
    assert next_step(replace(READY, rebooting_elsewhere=50), replace(ON, max_rebooting_nodes=0)).kind == "reboot"


def test_signature_follows_the_gpu_by_uuid_and_window_counts_only_recent_reboots():
    assert signature("gpu.lost gpu3", "GPU-abc") == "gpu.lost gpu3 GPU-abc"
    assert signature("ib.port mlx5_0:1", None) == "ib.port mlx5_0:1"
    assert within([100.0, 3000.0, 3650.0], now=3700.0, window_s=3600) == [3000.0, 3650.0]


def test_rebooting_counts_other_nodes_slurm_reboots_now():
    nodes = [NodeInfo("gpu1", "IDLE+DRAIN+REBOOT_REQUESTED"), NodeInfo("gpu2", "DOWN+REBOOT_ISSUED"),
             NodeInfo("gpu3", "IDLE+DRAIN"), NodeInfo("gpu4", "IDLE")]
    assert rebooting(nodes, "gpu3") == ["gpu1", "gpu2"]
    assert rebooting(nodes, "gpu1") == ["gpu2"]


# -- the ledger --------------------------------------------------------------------------------------
def test_the_ledger_survives_a_new_process_and_counts_per_signature(tmp_path):
    state = str(tmp_path)
    sig = signature("gpu.lost gpu3", "GPU-abc")
    with ledgers.changing(state, "gpu1") as ledger:
        ledger.note_drain(sig, "gpu.lost gpu3", at=10.0)
        ledger.note_reboot(sig, "gpu.lost gpu3", boot_id="boot-1", at=20.0)
    # A reboot is a new process: read it back from the file alone.
    code = ("import sys; from healthcheck.actions import ledger as l; "
            "g = l.load(sys.argv[1], 'gpu1'); e = g.entries[sys.argv[2]]; "
            "import json; print(json.dumps([len(e.reboots), g.asked_in('boot-1'), g.asked_in('boot-2'), "
            "e.episodes[0].reboots]))")
    done = subprocess.run([sys.executable, "-c", code, state, sig], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert json.loads(done.stdout) == [1, "reboot", "", [20.0]], done.stderr
    path = ledgers.ledger_path(state, "gpu1")
    assert oct(os.stat(path).st_mode & 0o777) == "0o640"
    with ledgers.changing(state, "gpu1") as ledger:
        ledger.note_reboot(sig, "gpu.lost gpu3", boot_id="boot-2", at=30.0)
        ledger.note_reboot(signature("gpu.lost gpu5", "GPU-def"), "gpu.lost gpu5", boot_id="boot-3", at=40.0)
    again = ledgers.load(state, "gpu1")
    assert [len(e.reboots) for e in again.entries.values()] == [2, 1]
    assert again.asked_in("boot-3") == "reboot" and again.asked_in("boot-2") == ""


def test_resumed_and_inspect_close_the_episode_with_its_times(tmp_path):
    sig = "kernel.xid gpu1 xid:79 GPU-1"
    ledger = ledgers.Ledger()
    ledger.note_drain(sig, "kernel.xid gpu1 xid:79", at=100.0)
    ledger.note_reboot(sig, "kernel.xid gpu1 xid:79", "b1", at=160.0)
    ledger.note_resumed(at=400.0)
    episode = ledger.entries[sig].episodes[0]
    assert (episode.drained_at, episode.reboots, episode.resumed_at, episode.outcome) == (100.0, [160.0], 400.0,
                                                                                          "resumed")
    assert ledger.asked is None
    ledger.note_drain(sig, "kernel.xid gpu1 xid:79", at=500.0)
    ledger.note_inspect(sig, "kernel.xid gpu1 xid:79", at=600.0)
    assert [e.outcome for e in ledger.entries[sig].episodes] == ["resumed", "inspect"]
    assert ledgers.Ledger.from_json(json.loads(json.dumps(ledger.to_json()))) == ledger


def test_a_corrupt_ledger_is_set_aside_and_starts_empty(tmp_path, capsys):
    path = ledgers.ledger_path(str(tmp_path), "gpu1")
    os.makedirs(os.path.dirname(path), mode=0o750)
    with open(path, "w") as handle:
        handle.write('{"version": 1, "entries": [], "asked": 3}')
    os.chmod(path, 0o640)
    assert ledgers.load(str(tmp_path), "gpu1") == ledgers.Ledger()
    assert os.path.exists(path + ".corrupt") and "corrupt" in capsys.readouterr().err


def test_a_changing_block_that_raises_saves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with ledgers.changing(str(tmp_path), "gpu1") as ledger:
            ledger.note_reboot("s", "c", "b", 1.0)
            raise RuntimeError("boom")
    assert ledgers.load(str(tmp_path), "gpu1") == ledgers.Ledger()
