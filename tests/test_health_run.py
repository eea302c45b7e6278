"""One health-check run composed end to end on a simulated node, with the FakeBackend standing
in for Slurm (the real scontrol is proven in tests/lab/test_lab_healthcheck.py)."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck.config import Config
from healthcheck.actions import state as node_state
from healthcheck.health.outputs import last_path, textfile_path, write_all
from healthcheck.health.run import run_health
from healthcheck.sim.node import SimNode
from .fake_backend import FakeBackend
from healthcheck.sources import sim_sources

from .checks_support import HARDWARE
from .conftest import SIM_PROFILES

PROFILE = os.path.join(SIM_PROFILES, "h100-healthy.toml")
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


def config(tmp_path, **health):
    doc = {"paths": {"state_dir": str(tmp_path)}, "gpu": {"backend": "sim", "probe_timeout_s": 10},
           "sim": {"profile": PROFILE}, "nodes": [dict(match="gpu*", **HARDWARE["H100"])],
           "health": dict({"syslog": False}, **health)}
    return Config.from_document(doc, None)


class Node:
    """A simulated node ``gpu2`` in a FakeBackend cluster of three."""

    def __init__(self, tmp_path, **health):
        self.config = config(tmp_path, **health)
        self.state_dir = str(tmp_path)
        self.sim = SimNode(self.state_dir, "gpu2", PROFILE)
        self.sim.ensure()
        self.slurm = FakeBackend()
        for name in ("gpu1", "gpu2", "gpu3"):
            self.slurm.add_node(name)
        self.run_once()                       # the first run after "boot": the grace run

    def run_once(self, dry_run=False):
        sources = sim_sources("gpu2", self.state_dir, PROFILE)
        return run_health(self.config, "gpu2", self.slurm, sources, dry_run=dry_run)

    @property
    def slurm_node(self):
        return self.slurm.node("gpu2")


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_a_healthy_run_asks_slurm_nothing_once_its_boot_is_known(node):
    # The fixture's first run of this boot asked (a state of no boot yet: learn from Slurm).
    assert node.slurm.calls == [("node", "gpu2")]
    node.slurm.calls.clear()
    result = node.run_once()
    assert result.decision.kind == "none" and result.decision.rule == "healthy" and result.committed
    assert node.slurm.calls == []
    assert result.slurm_reachable and result.to_json()["decision"] == "none"


def test_the_first_run_of_a_boot_asks_slurm_and_resumes_a_drain_of_ours_it_has_no_record_of(tmp_path):
    """A stateless node rebooted with an empty state dir: our drain is known only to Slurm."""
    node = Node(tmp_path)
    reason = "gpu-hooks: v1 ib.port mlx5_0:1; port mlx5_0 port 1 is Down"
    node.slurm.drain("gpu2", reason)
    node.slurm.calls.clear()
    assert node.run_once().decision.kind == "none"        # the boot is known: nothing asked
    assert node.slurm.calls == []
    node.sim.reboot()
    result = node.run_once()
    assert ("node", "gpu2") in node.slurm.calls
    assert result.decision.kind == "resume" and not node.slurm_node.drained


def test_a_run_with_a_cause_being_confirmed_asks_slurm(node):
    node.slurm.calls.clear()
    node.sim.inject([("ib.mlx5_3:1.state", "1: DOWN"), ("ib.mlx5_3:1.phys_state", "3: Disabled")])
    result = node.run_once()
    assert result.tally.pending and result.decision.kind != "drain"
    assert node.slurm.calls == [("node", "gpu2")]


def test_double_bit_ecc_drains_once_with_our_reason_and_resumes_when_gone(node):
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    result = node.run_once()
    assert result.decision.kind == "drain" and result.applied.done
    assert node.slurm_node.reason.startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; ")
    doc = result.to_json()
    assert {"node", "decision", "reason", "scontrol", "findings"} <= set(doc)
    assert doc["decision"] == "drain" and doc["scontrol"][:3] == ["scontrol", "update", "nodename=gpu2"]
    assert node.run_once().decision.rule == "drained-same-cause"
    node.sim.reset()
    resumed = node.run_once()
    assert resumed.decision.kind == "resume" and not node.slurm_node.drained
    assert [call[0] for call in node.slurm.writes()] == ["drain", "resume"]


def test_an_admin_drain_is_kept_and_the_finding_recorded(node):
    node.slurm.add_node("gpu2", "IDLE+DRAIN", "admin: reseat cable", "alice")
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    result = node.run_once()
    assert result.decision.kind == "leave-alone" and result.to_json()["decision"] == "none"
    assert node.slurm.writes() == [] and node.slurm_node.reason == "admin: reseat cable"
    write_all(result, node.state_dir, "", use_syslog=False)
    with open(os.path.join(node.state_dir, "health", "gpu2.evidence.jsonl")) as handle:
        record = json.loads(handle.read().splitlines()[-1])
    assert record["findings"][0]["check"] == "gpu.ecc.uncorrectable"


def test_slurm_unreachable_never_drains_and_commits_nothing_then_drains(node):
    node.sim.inject([], [XID79])
    node.slurm.unreachable = "scontrol show node: no answer within 15 s"
    blocked = node.run_once()
    assert blocked.decision.kind == "blocked" and not blocked.committed and node.slurm.writes() == []
    node.slurm.unreachable = None
    drained = node.run_once()                  # the Xid was not committed: it is read again
    assert drained.decision.kind == "drain" and "xid:79" in node.slurm_node.reason


def test_an_xid_read_while_slurm_is_busy_with_the_node_drains_it_once_slurm_is_done(node):
    # A rebooted slurmd shows NOT_RESPONDING until it registers; the watcher can run the health
    # check right then. What that run read must come back (seen in the lab: the Xid was lost).
    node.slurm.add_node("gpu2", state="IDLE+NOT_RESPONDING")
    node.sim.inject([], [XID79])
    busy = node.run_once()
    assert busy.decision.rule == "slurm-busy" and not busy.committed and node.slurm.writes() == []
    node.slurm.add_node("gpu2", state="IDLE")
    drained = node.run_once()
    assert drained.decision.kind == "drain" and "xid:79" in node.slurm_node.reason


def test_an_ib_port_down_for_one_run_does_not_drain_down_for_two_does(node):
    down = [("ib.mlx5_3:1.state", "1: DOWN"), ("ib.mlx5_3:1.phys_state", "3: Disabled")]
    node.sim.inject(down)
    first = node.run_once()
    assert first.decision.kind == "none" and first.to_json()["pending"][0]["cause"] == "ib.port mlx5_3:1"
    node.sim.reset()
    assert node.run_once().decision.kind == "none"
    node.sim.inject(down)
    assert node.run_once().decision.kind == "none"
    assert node.run_once().decision.kind == "drain"
    assert node.slurm_node.reason.startswith("gpu-hooks: v1 ib.port mlx5_3:1")


def test_a_lost_gpu_is_resumed_only_after_a_reboot(node):
    node.sim.inject([("gpu.2.state", "lost")])
    assert node.run_once().decision.kind == "drain"
    record = node_state.load(node.state_dir, "gpu2").drained
    assert record.resume_mode == "after_reboot" and record.evidence[0]["check"] == "gpu.lost"
    node.sim.inject([("gpu.2.state", "ok")])      # it answers again without a reboot: not enough
    assert node.run_once().decision.rule == "resume-wait-reboot"
    node.sim.reboot()
    assert node.run_once().decision.kind == "resume"


def test_the_same_xid_after_two_reboots_drains_for_inspection_and_stays(node):
    for _ in range(2):
        node.sim.inject([], [XID79])
        assert node.run_once().decision.kind == "drain"
        node.sim.reboot()
        assert node.run_once().decision.kind == "resume"
    node.sim.inject([], [XID79])
    third = node.run_once()
    assert third.decision.kind == "drain" and "kernel.xid.repeat" in node.slurm_node.reason
    node.sim.reboot()
    assert node.run_once().decision.rule == "resume-never" and node.slurm_node.drained


def test_what_an_overlapping_run_saved_while_this_one_probed_is_kept(node, monkeypatch):
    """The watcher's run (for an Xid line) and slurmd's periodic run can overlap. Seen in the lab:
    the periodic run loaded the state, the watcher's run counted the Xid's boot and saved, and
    the periodic run (which read the log before the line) saved its older counts over it, so the
    Xid's third return found one reboot, not two. A run counts from the state as it is under the
    decision lock."""
    from healthcheck.health import run as health_run

    real_checks = health_run.run_checks
    boot = node_state.load(node.state_dir, "gpu2").boot_id

    def checks_while_another_run_saves(*args, **kwargs):
        report = real_checks(*args, **kwargs)
        other = node_state.load(node.state_dir, "gpu2")
        other.xid_boots = {"GPU-5555 xid:79": ["an-earlier-boot", boot]}
        node_state.save(node.state_dir, "gpu2", other)
        return report

    monkeypatch.setattr(health_run, "run_checks", checks_while_another_run_saves)
    result = node.run_once()
    assert result.decision.kind == "none"
    kept = node_state.load(node.state_dir, "gpu2")
    assert kept.xid_boots == {"GPU-5555 xid:79": ["an-earlier-boot", boot]}, kept.xid_boots


def test_a_remap_failure_is_never_resumed(node):
    node.sim.inject([("gpu.1.remapped_rows.failure", True)])
    assert node.run_once().decision.kind == "drain"
    node.sim.reset()
    assert node.run_once().decision.rule == "resume-never" and node.slurm_node.drained


def test_the_budget_blocks_a_drain_beyond_it(tmp_path):
    node = Node(tmp_path, budget_max_nodes=1, budget_max_fraction=0)
    node.slurm.drain("gpu1", "gpu-hooks: v1 gpu.lost gpu0; lost")
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    result = node.run_once()
    assert result.decision.kind == "blocked" and result.decision.rule == "drain-budget"
    assert not node.slurm_node.drained and not result.committed
    assert node_state.load(node.state_dir, "gpu2").budget_blocks == 1
    write_all(result, node.state_dir, "", use_syslog=False)
    with open(textfile_path(os.path.join(node.state_dir, "health"), "gpu2")) as handle:
        metrics = handle.read()
    assert 'slurm_gpu_health_budget_blocks_total{node="gpu2"} 1' in metrics
    assert 'slurm_gpu_health_check_status{node="gpu2",check="gpu.ecc.uncorrectable"} 2' in metrics


def test_a_concurrent_drain_beyond_the_budget_is_undone(tmp_path):
    node = Node(tmp_path, budget_max_nodes=1, budget_max_fraction=0)

    class Racing(FakeBackend):
        def drain(self, name, reason):          # gpu1 drains in the same second as we do
            super().drain(name, reason)
            if name == "gpu2":
                FakeBackend.drain(self, "gpu1", "gpu-hooks: v1 gpu.lost gpu0; lost")
                self._nodes["gpu1"].reason_epoch = self._nodes["gpu2"].reason_epoch

    racing = Racing()
    for name in ("gpu1", "gpu2", "gpu3"):
        racing.add_node(name)
    node.slurm = racing
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    result = node.run_once()
    assert result.decision.rule == "drain-budget" and not node.slurm_node.drained
    assert node.slurm.node("gpu1").drained


def test_dry_run_changes_nothing(node):
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    before = node_state.load(node.state_dir, "gpu2").to_json()
    result = node.run_once(dry_run=True)
    assert result.decision.kind == "drain" and result.to_json()["scontrol"][0] == "scontrol"
    assert node.slurm.writes() == [] and not result.committed
    assert node_state.load(node.state_dir, "gpu2").to_json() == before


def test_the_master_switch_blocks_but_commits(tmp_path):
    node = Node(tmp_path)
    node.config = Config.from_document(dict(node.config.data, drain={"enabled": False}), None)
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    result = node.run_once()
    assert result.decision.rule == "actions-off" and result.committed and node.slurm.writes() == []


def test_last_result_is_written_as_json(node):
    result = node.run_once()
    write_all(result, node.state_dir, "", use_syslog=False)
    with open(last_path(node.state_dir, "gpu2")) as handle:
        doc = json.load(handle)
    assert doc["node"] == "gpu2" and doc["decision"] == "none" and doc["findings"] == []


def test_probes_started_before_the_run_are_the_ones_it_judges(node):
    """The health check starts its probes before it loads the decision's code
    (runner.start_probes); the run collects those very children and judges what they read."""
    from healthcheck import healthcheck as program
    from healthcheck.health import run as health_run
    from healthcheck.runner import start_probes

    assert program.HEALTH_TIER == health_run.TIER
    node.sim.inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    sources = sim_sources("gpu2", node.state_dir, PROFILE)
    probes = start_probes(node.config, "gpu2", health_run.TIER, sources=sources)
    result = run_health(node.config, "gpu2", node.slurm, sources, probes=probes)
    assert "gpu.ecc.uncorrectable" in {f.check for f in result.report.findings}
    assert result.report.facts.nvml.gpus[3].ecc["volatile_uncorrected"] == 2


def test_probes_started_for_another_tier_are_refused(node):
    from healthcheck.runner import run_checks, start_probes

    sources = sim_sources("gpu2", node.state_dir, PROFILE)
    probes = start_probes(node.config, "gpu2", "prolog", sources=sources)
    with pytest.raises(ValueError, match="tier"):
        run_checks(node.config, "gpu2", "health", sources=sources, probes=probes)
    run_checks(node.config, "gpu2", "prolog", sources=sources, probes=probes)     # collected, not left behind
