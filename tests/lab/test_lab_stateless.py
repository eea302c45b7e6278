"""Nodes booted from a stateless image (issue 31), on the real lab: `slurm-gpu lab up --stateless`
makes the lab's RebootProgram empty a rebooted node's state and runtime directories, as a diskless
(Warewulf) node's /var and /run are after a boot. What must outlive a boot lives in Slurm: the
reboot count in the node's Extra (merged into what another tool wrote there), "ours, waits for a
reboot" in our reason and Slurm's BootTime. A lemon still gets exactly max_reboots reboots; a GPU
lost once is back in service by itself."""
from __future__ import annotations

import os
import time

import pytest

from healthcheck.actions import kept
from healthcheck.actions import state as node_state

from .conftest import slurm_gpu, wait_for
from .test_lab_remediate import PREFIX, REBOOTING, Remediating, backend, boot_epoch, boot_time, distinct_boots

pytestmark = pytest.mark.lab

OTHER_TOOL = "rack=12 owner=ml"


@pytest.fixture
def stateless(lab):
    up = slurm_gpu("lab", "up", "--stateless", env=lab.env, timeout=300)
    assert up.returncode == 0, up.stderr
    assert "nodes: stateless" in up.stdout
    try:
        yield lab
    finally:
        back = slurm_gpu("lab", "up", env=lab.env, timeout=300)
        assert back.returncode == 0, back.stderr
        assert not os.path.exists(lab.paths.stateless_file)


def lab_log_lines(lab) -> list:
    with open(lab.paths.lab_log, encoding="utf-8", errors="replace") as handle:
        return handle.read().splitlines()


def set_extra(lab, node: str, text: str) -> None:
    done = lab.run("scontrol", "update", f"nodename={node}", f"extra={text}")
    assert done.returncode == 0, done.stderr


@pytest.mark.every_release
def test_a_lemon_on_a_stateless_node_gets_exactly_max_reboots_then_inspection(stateless):
    lab, slurm = stateless, backend(stateless)
    with Remediating(lab, max_reboots=2):
        set_extra(lab, "gpu3", OTHER_TOOL)
        try:
            result = slurm_gpu("sim", "inject", "gpu3", "gpu.5.state=lost", "gpu.5.lost_every_boot=true", env=lab.env)
            assert result.returncode == 0, result.stderr
            boots = {boot_epoch(lab, "gpu3")}
            logged = len(lab_log_lines(lab))

            def inspected():
                boots.add(boot_epoch(lab, "gpu3"))
                info = slurm.node("gpu3")
                return info.drained and " reboots:2; inspect: " in info.reason and not info.has(*REBOOTING)
            wait_for("gpu3 drained for inspection", inspected, timeout=420, every=1)
            assert distinct_boots(boots) == 3              # the first boot and the two the reboots made
            # each boot started with the node's state emptied (its ledger among it)
            wiped = [line for line in lab_log_lines(lab)[logged:] if "gpu3: stateless boot: " in line]
            assert len(wiped) == 2, wiped
            info = slurm.node("gpu3")
            assert info.extra.startswith(OTHER_TOOL + " " + kept.TOKEN)
            [times] = kept.reboots_kept(info.extra).values()
            assert len(times) == 2
            reason, settled = info.reason, boot_epoch(lab, "gpu3")
            time.sleep(25)                                 # two more health-check intervals: left alone
            info = slurm.node("gpu3")
            assert info.drained and info.reason == reason
            assert distinct_boots([settled, boot_epoch(lab, "gpu3")]) == 1
        finally:
            set_extra(lab, "gpu3", "")


def test_a_gpu_lost_once_on_a_stateless_node_is_back_in_service_by_itself(stateless):
    lab, slurm = stateless, backend(stateless)
    with Remediating(lab) as remediating:
        before = boot_time(lab, "gpu2")
        result = slurm_gpu("sim", "inject", "gpu2", "gpu.3.state=lost", env=lab.env)
        assert result.returncode == 0, result.stderr
        wait_for("gpu2 drained by us", lambda: slurm.node("gpu2").reason.startswith(PREFIX + "gpu.lost gpu3"),
                 timeout=60)
        wait_for("gpu2 rebooted (a new BootTime)", lambda: boot_time(lab, "gpu2") not in ("", before), timeout=180)
        wait_for("gpu2 back in service", lambda: (lambda info: not info.drained and not info.down
                                                  and not info.has(*REBOOTING))(slurm.node("gpu2")), timeout=120)
        # The new boot's health state holds no drain: it learnt from Slurm, not from a file.
        assert node_state.load(remediating.state_dir, "gpu2").drained is None
