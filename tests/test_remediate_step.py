"""Remediation through the drain gate, on a simulated node with the FakeBackend standing in for
Slurm's answers (what Slurm does with the reboot: tests/lab/test_lab_remediate.py): a GPU
lost once is rebooted through Slurm and back in service; a lemon gets exactly max_reboots reboots,
then our reason says inspect and nothing more happens; the cluster-wide budget; off by default."""
from __future__ import annotations

import os
import re
import time

import pytest

from healthcheck.actions import budget
from healthcheck.config import Config
from healthcheck.health.run import run_health
from healthcheck.actions import kept, ledger as ledgers
from healthcheck.actions.ledger import signature_of
from healthcheck.remediate.step import situation_of
from healthcheck.sim.node import SimNode
from healthcheck.slurm.backend import reboot_argv
from healthcheck.sources import sim_sources

from .checks_support import HARDWARE
from .conftest import SIM_PROFILES
from .fake_backend import FakeBackend

PROFILE = os.path.join(SIM_PROFILES, "h100-healthy.toml")


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr(budget, "SETTLE_S", 0.0)


def make_config(tmp_path, health=None, **remediate):
    doc = {"paths": {"state_dir": str(tmp_path)}, "gpu": {"backend": "sim", "probe_timeout_s": 10},
           "sim": {"profile": PROFILE}, "nodes": [dict(match="gpu*", **HARDWARE["H100"])],
           "health": dict({"syslog": False}, **(health or {})), "remediate": dict({"enabled": True}, **remediate)}
    return Config.from_document(doc, None)


class Cluster:
    def __init__(self, tmp_path, names=("gpu1", "gpu2", "gpu3"), health=None, **remediate):
        self.state_dir = str(tmp_path)
        self.config = make_config(tmp_path, health, **remediate)
        self.slurm = FakeBackend()
        self.sims = {}
        for name in names:
            self.slurm.add_node(name)
            self.sims[name] = SimNode(self.state_dir, name, PROFILE)
            self.sims[name].ensure()
            self.run(name)                       # the boot's grace run

    def run(self, name):
        return run_health(self.config, name, self.slurm, sim_sources(name, self.state_dir, PROFILE))

    def reboot(self, name, drain_survives=True):
        """What the lab's RebootProgram and Slurm do: the node reboots; on 24.11 and later our
        drain is still there when it registers (``drain_survives``), on 22.05 Slurm resumes it."""
        self.sims[name].reboot()
        self.slurm.finish_reboot(name, drain_survives=drain_survives)


def totals_in(textfile: str, node: str) -> dict:
    """The remediation's counters in a textfile, and its back-in-service histogram's count."""
    names = {"reboots_asked": "reboots_asked_total", "gpu_resets": "gpu_resets_total",
             "inspections": "inspections_total", "returns": "back_in_service_seconds_count"}
    found = {}
    for key, name in names.items():
        match = re.search(rf'^slurm_gpu_health_remediation_{name}{{node="{node}"}} (\S+)$', textfile, flags=re.M)
        assert match, name
        found[key] = int(float(match.group(1)))
    return found


def test_the_ledgers_totals_count_ever_and_outlive_an_admins_resume(tmp_path):
    from healthcheck.actions.remedy_totals import read_totals

    with ledgers.changing(str(tmp_path), "gpu1") as ledger:
        ledger.note_drain("gpu.lost gpu3 GPU-1", "gpu.lost gpu3", at=1000.0)
        ledger.note_reset("gpu.lost gpu3 GPU-1", "gpu.lost gpu3", "boot-a", at=1100.0)
        ledger.note_reboot("gpu.lost gpu3 GPU-1", "gpu.lost gpu3", "boot-a", at=1200.0)
        ledger.note_resumed(at=1000.0 + 2000.0)            # back after 2000 s: the le="3600" bucket
        ledger.note_drain("gpu.ecc gpu1", "gpu.ecc gpu1", at=5000.0)
        ledger.note_inspect("gpu.ecc gpu1", "gpu.ecc gpu1", at=5100.0)
        ledger.forget()                                    # an admin's resume: the counts start again
    totals = read_totals(str(tmp_path), "gpu1")
    assert (totals.reboots, totals.resets, totals.inspections) == (1, 1, 1)
    assert totals.back_in_service == [0, 0, 1, 0, 0, 0, 0, 0, 0] and totals.back_in_service_sum == 2000.0
    assert ledgers.load(str(tmp_path), "gpu1").entries == {}
    assert read_totals(str(tmp_path), "gpu2") == type(totals)()      # no ledger: zeros


def test_off_by_default_nothing_is_rebooted(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), enabled=False)
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    for _ in range(3):
        result = cluster.run("gpu1")
    assert result.remediation is None and [c[0] for c in cluster.slurm.writes()] == ["drain"]


def test_a_gpu_lost_once_is_rebooted_through_slurm_and_back_in_service(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    drained = cluster.run("gpu1")
    assert drained.decision.kind == "drain"
    # The same run asked for the reboot: drained by us, idle, a cause a reboot clears.
    assert drained.remediation.decision.kind == "reboot" and drained.remediation.applied.done
    reason = cluster.slurm.node("gpu1").reason
    assert reason.startswith("gpu-hooks: v1 gpu.lost gpu3; ")
    assert cluster.slurm.scontrol_argvs()[-1] == reboot_argv("gpu1", reason)
    waiting = cluster.run("gpu1")          # Slurm has not rebooted it yet: nothing asked twice
    assert waiting.remediation.decision.rule == "remediate-reboot-pending"
    from healthcheck.health.outputs import prometheus

    metrics = prometheus(waiting)
    assert 'slurm_gpu_health_remediation_step{node="gpu1",step="wait-reboot"} 1' in metrics
    assert 'slurm_gpu_health_remediation_reboots{node="gpu1"} 1' in metrics
    shown = drained_row(cluster, "gpu1")
    assert (shown["reboots"], shown["next"]) == (1, "wait-reboot") and shown["evidence"]
    # the drain, the claim of a turn within the reboot budget (next:reboot), the reboot counted in
    # the node's Extra (where a stateless node finds it after the boot), the reboot
    assert [c[0] for c in cluster.slurm.writes()] == ["drain", "drain", "set_extra", "reboot"]
    assert kept.times_for(cluster.slurm.node("gpu1").extra, signature_of(waiting.state.drained)) != []
    assert " next:reboot; " in cluster.slurm.writes()[1][2] and "next:" not in reason
    cluster.reboot("gpu1")
    # Slurm kept our drain through the reboot: the node takes no job until a check of the new
    # boot passes; that check resumes it.
    assert cluster.slurm.node("gpu1").drained
    assert cluster.slurm.node("gpu1").reason == reason + " : reboot issued"
    back = cluster.run("gpu1")
    assert back.decision.kind == "resume" and not cluster.slurm.node("gpu1").drained
    assert [c[0] for c in cluster.slurm.writes()] == ["drain", "drain", "set_extra", "reboot", "resume"]
    entry = next(iter(ledgers.load(cluster.state_dir, "gpu1").entries.values()))
    [episode] = entry.episodes
    assert episode.outcome == "resumed" and len(episode.reboots) == 1
    assert episode.drained_at <= episode.reboots[0] <= episode.resumed_at
    # The metrics count it, ever: one reboot, one return to service, no reset, no inspection.
    assert totals_in(prometheus(back), "gpu1") == {"reboots_asked": 1, "gpu_resets": 0, "inspections": 0,
                                                   "returns": 1}


def test_the_fault_signature_names_the_gpu_by_uuid_where_the_evidence_has_it():
    from healthcheck.actions.state import Drained

    evidence = [{"check": "gpu.ecc.uncorrectable", "gpu": 3, "uuid": "GPU-abc"}, {"gpu": 5, "uuid": "GPU-other"}]
    record = Drained(cause="gpu.ecc.uncorrectable gpu3", resume_mode="after_reboot", boot_id="b", at=1.0,
                     evidence=evidence)
    assert signature_of(record) == "gpu.ecc.uncorrectable gpu3 GPU-abc"
    lost = Drained(cause="gpu.lost gpu3", resume_mode="after_reboot", boot_id="b", at=1.0,
                   evidence=[{"check": "gpu.lost", "gpu": 3, "uuid": None}])
    assert signature_of(lost) == "gpu.lost gpu3"      # a GPU lost before NVML named it


# What Slurm writes for a lemon, per release behaviour (docs/slurm-versions.md): 24.11 and later
# keep our drain through the reboot, so the lost GPU found again after the boot needs no new
# drain, and the node is never in service; 22.05 resumes the node at registration and the check
# after the boot drains it again.
LEMON_WRITES = {
    True: ["drain", "drain", "set_extra", "reboot"] + ["drain", "set_extra", "reboot"] + ["drain"],
    False: ["drain", "drain", "set_extra", "reboot"] * 2 + ["drain", "drain"],
}


@pytest.mark.parametrize("drain_survives", [True, False], ids=["24.11-on", "22.05"])
def test_a_lemon_gets_exactly_max_reboots_then_inspection_and_is_left_alone(tmp_path, drain_survives):
    cluster = Cluster(tmp_path, names=("gpu1",), max_reboots=2)
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost"), ("gpu.3.lost_every_boot", True)])
    reboots, in_service_after_a_reboot = 0, []
    for _ in range(6):
        result = cluster.run("gpu1")
        if result.remediation is not None and result.remediation.decision.kind == "reboot":
            reboots += 1
            cluster.reboot("gpu1", drain_survives=drain_survives)
            in_service_after_a_reboot.append(not cluster.slurm.node("gpu1").drained)
    assert reboots == 2
    assert in_service_after_a_reboot == [not drain_survives] * 2
    node = cluster.slurm.node("gpu1")
    assert node.drained and " reboots:2; inspect: back after 2 reboots: " in node.reason
    assert " : reboot issued" not in node.reason        # Slurm's suffix is not carried into ours
    writes = [c[0] for c in cluster.slurm.writes()]
    # the drain, the claim of a turn, the reboot; again after the first boot (with a new drain
    # where Slurm resumed the node); then the inspect reason
    assert writes == LEMON_WRITES[drain_survives]
    for _ in range(3):                      # left alone: no reboot, no resume, no new reason
        assert cluster.run("gpu1").remediation.decision.rule == "remediate-inspecting"
    assert [c[0] for c in cluster.slurm.writes()] == writes
    shown = drained_row(cluster, "gpu1")
    assert (shown["reboots"], shown["next"]) == (2, "inspecting")
    # One episode: Slurm put the node back in service after each reboot, but the fault came back.
    [entry] = ledgers.load(cluster.state_dir, "gpu1").entries.values()
    [episode] = entry.episodes
    assert (len(episode.reboots), episode.outcome, episode.resumed_at) == (2, "inspect", None)
    from healthcheck.health.outputs import prometheus

    counted = totals_in(prometheus(cluster.run("gpu1")), "gpu1")
    assert (counted["reboots_asked"], counted["inspections"]) == (2, 1)


def test_the_summary_reports_per_cause_how_remediation_went(tmp_path):
    """slurm-gpu summary's remediation rows: a lost GPU back in service after one reboot, a lemon
    drained for inspection after two, the median time from drain to back in service."""
    from slurm_hooks.summary.remediation import load_ledgers, rows

    cluster = Cluster(tmp_path, names=("gpu1", "gpu2"), health={"budget_enabled": False}, max_reboots=2)
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    cluster.sims["gpu2"].inject([("gpu.1.state", "lost"), ("gpu.1.lost_every_boot", True)])
    for _ in range(6):
        for name in ("gpu1", "gpu2"):
            result = cluster.run(name)
            if result.remediation is not None and result.remediation.decision.kind == "reboot":
                cluster.reboot(name)
    row = rows(load_ledgers(cluster.state_dir))["gpu.lost"]
    assert {k: row[k] for k in ("drains", "back_in_service", "inspect", "open", "reboots", "worked_share")} == \
        {"drains": 2, "back_in_service": 1, "inspect": 1, "open": 0, "reboots": 3, "worked_share": 0.5}
    assert row["median_drain_to_service_s"] is not None and row["median_drain_to_service_s"] >= 0
    assert rows(load_ledgers(cluster.state_dir), since=time.time() + 60) == {}


def drained_row(cluster, name):
    """What `slurm-gpu drained --json` shows for the node."""
    from healthcheck.config.settings import RemediatePolicy
    from slurm_hooks.cli.drained_cmd import row

    return row(cluster.slurm.node(name), "gpu-hooks:", cluster.state_dir, RemediatePolicy.from_config(cluster.config))


def test_the_reboot_budget_holds_in_a_storm_on_every_node(tmp_path):
    cluster = Cluster(tmp_path, health={"budget_enabled": False}, max_rebooting_nodes=1)   # every node drains
    for sim in cluster.sims.values():
        sim.inject([("gpu.0.state", "lost")])
    for name in cluster.sims:
        cluster.run(name)
    rebooting = [n.name for n in cluster.slurm.nodes() if n.has("REBOOT_REQUESTED")]
    assert rebooting == ["gpu1"]
    assert all(cluster.slurm.node(n).drained for n in ("gpu2", "gpu3"))
    assert all("next:reboot" not in cluster.slurm.node(n).reason for n in cluster.sims)
    cluster.reboot("gpu1")
    for name in cluster.sims:
        cluster.run(name)
    assert [n.name for n in cluster.slurm.nodes() if n.has("REBOOT_REQUESTED")] == ["gpu2"]


def test_claims_made_at_the_same_moment_agree_on_whose_turn_it_is():
    from healthcheck.remediate.plan import reboot_turn
    from healthcheck.slurm.backend import NodeInfo

    claim = "gpu-hooks: v1 gpu.lost gpu0 next:reboot; x"
    nodes = [NodeInfo(f"gpu{i}", "IDLE+DRAIN", reason=claim) for i in (1, 2, 3)]
    assert [reboot_turn(nodes, n.name, 1, "gpu-hooks:") for n in nodes] == [True, False, False]
    assert [reboot_turn(nodes, n.name, 2, "gpu-hooks:") for n in nodes] == [True, True, False]
    nodes.append(NodeInfo("gpu9", "DOWN+DRAIN+REBOOT_ISSUED", reason="gpu-hooks: v1 gpu.lost gpu1; y"))
    assert [reboot_turn(nodes, n.name, 2, "gpu-hooks:") for n in nodes[:3]] == [True, False, False]


# -- the GPU reset ([remediate] gpu_reset; the simulated node's nvidia-smi does the reset) ----------

def test_a_gpu_lost_once_is_reset_not_rebooted_and_back_in_service(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    sim = cluster.sims["gpu1"]
    boot = sim.boot_id()
    sim.inject([("gpu.3.state", "lost")])
    drained = cluster.run("gpu1")
    assert drained.decision.kind == "drain"
    remedy = drained.remediation
    assert (remedy.decision.kind, remedy.decision.rule, remedy.applied.done) == ("reset", "remediate-reset-first", True)
    assert remedy.applied.argv == [os.path.join(sim.programs_dir, "nvidia-smi"), "--gpu-reset", "-i", "3"]
    assert drained.to_json()["remediation"]["command"] == remedy.applied.argv
    assert sim.load()["gpu"][3]["state"] == "ok"                 # the reset cleared it on the node
    back = cluster.run("gpu1")                                   # healthy, and reset since the drain
    assert back.decision.kind == "resume" and back.remediation is None
    assert [c[0] for c in cluster.slurm.writes()] == ["drain", "resume"]     # no reboot asked
    assert sim.boot_id() == boot
    [entry] = ledgers.load(cluster.state_dir, "gpu1").entries.values()
    [episode] = entry.episodes
    assert (entry.reboots, len(episode.resets), episode.outcome) == ([], 1, "resumed")
    from healthcheck.health.outputs import prometheus

    assert totals_in(prometheus(back), "gpu1") == {"reboots_asked": 0, "gpu_resets": 1, "inspections": 0,
                                                   "returns": 1}


def test_a_gpu_a_process_holds_is_not_reset_the_node_is_rebooted_in_the_same_run(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    sim = cluster.sims["gpu1"]
    sim.inject([("gpu.3.state", "lost"), ("gpu.3.processes", [{"pid": 4242, "used_memory_mib": 1024}])])
    drained = cluster.run("gpu1")
    remedy = drained.remediation
    assert remedy.decision.kind == "reboot" and remedy.applied.done
    said = [note for note in drained.notes if note.startswith("remediation: GPU reset not done")]
    assert said and "being used by some other process" in said[0]
    assert sim.load()["gpu"][3]["state"] == "lost"               # refused: nothing changed
    assert [c[0] for c in cluster.slurm.writes()] == ["drain", "drain", "set_extra", "reboot"]   # drain, claim, count, reboot
    assert ledgers.load(cluster.state_dir, "gpu1").asked.kind == "reboot"


def test_a_failed_reset_falls_back_to_a_reboot_and_a_missing_command_too(tmp_path):
    for command, why in ((["nvidia-smi", "--bogus"], "exit 2"), (["no-such-reset"], "not found")):
        cluster = Cluster(tmp_path / command[0].strip("-"), names=("gpu1",), gpu_reset=True,
                          gpu_reset_command=command)
        cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
        drained = cluster.run("gpu1")
        assert drained.remediation.decision.kind == "reboot" and drained.remediation.applied.done
        assert any(note.startswith("remediation: GPU reset not done") and why in note for note in drained.notes)


def test_a_reset_that_did_not_clear_the_fault_is_followed_by_a_reboot(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    sim = cluster.sims["gpu1"]
    sim.inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").remediation.decision.kind == "reset"
    sim.inject([("gpu.3.state", "lost")])                       # back at once: the reset was not enough
    again = cluster.run("gpu1")
    assert again.decision.kind != "resume"
    assert again.remediation.decision.kind == "reboot" and again.remediation.applied.done
    cluster.reboot("gpu1")
    assert cluster.slurm.node("gpu1").drained                  # our drain outlived the reboot
    assert cluster.run("gpu1").decision.kind == "resume" and not cluster.slurm.node("gpu1").drained


def test_the_gpus_a_run_saw_a_process_on_are_busy_for_the_decision():
    from healthcheck.actions.state import Drained
    from healthcheck.config import Config
    from healthcheck.config.settings import RemediatePolicy
    from healthcheck.drain_reason import parse_reason
    from healthcheck.slurm.backend import NodeInfo

    record = Drained(cause="gpu.remap.pending gpu2", resume_mode="after_reboot", boot_id="b", at=1.0)
    reason = "gpu-hooks: v1 gpu.remap.pending gpu2; a row remap is pending"
    info = NodeInfo(name="gpu1", state="IDLE+DRAIN", reason=reason)
    ours = parse_reason(reason, "gpu-hooks:")
    for busy, expected in (((2, 5), True), ((5,), False), ((), False)):
        situation = situation_of(record, info, ours, ledgers.Ledger(), "s", "b", 2.0,
                                 RemediatePolicy.from_config(Config.from_document({}, None)), busy)
        assert situation.gpu_busy is expected and situation.gpu_scoped


def test_the_reset_target_is_the_pci_bus_id_else_the_uuid_else_the_index():
    from healthcheck.actions.gpu_reset import reset_argv, reset_target

    assert reset_target([{"gpu": 3, "uuid": "GPU-a", "pci_bus_id": "00000000:5D:00.0"}], "gpu3") == "00000000:5D:00.0"
    assert reset_target([{"gpu": 3, "uuid": "GPU-a", "pci_bus_id": None}, {"gpu": 4, "pci_bus_id": "x"}],
                        "gpu3") == "GPU-a"
    assert reset_target([{"gpu": 3, "uuid": None}], "gpu3") == "3"
    assert reset_target([], "mlx5_0:1") is None and reset_target([], "node") is None
    assert reset_argv(("nvidia-smi", "--gpu-reset", "-i", "{gpu}"), "3") == ("nvidia-smi", "--gpu-reset", "-i", "3")


def test_a_gpu_the_run_sees_a_process_on_is_not_reset_the_node_is_rebooted(tmp_path):
    """With gpu_reset on, the health check reads the GPUs' processes: a GPU NVML still answers for
    (a pending row remap) with a process on it is never handed to the reset command."""
    from healthcheck.remediate import health_reads

    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    assert health_reads(cluster.config) == ("nvml:processes",)
    assert health_reads(make_config(tmp_path / "off", gpu_reset=False)) == ()
    sim = cluster.sims["gpu1"]
    sim.inject([("gpu.2.remapped_rows.pending", True), ("gpu.2.processes", [{"pid": 4242, "used_memory_mib": 10}])])
    drained = cluster.run("gpu1")
    assert drained.decision.kind == "drain" and drained.decision.cause.cause == "gpu.remap.pending gpu2"
    assert drained.remediation.decision.kind == "reboot" and drained.remediation.applied.done
    assert not any("GPU reset" in note for note in drained.notes)
    [entry] = ledgers.load(cluster.state_dir, "gpu1").entries.values()
    assert entry.resets == {} and len(entry.reboots) == 1          # no reset tried


def test_a_drain_that_replaces_a_record_someone_else_ended_opens_its_own_episode(tmp_path):
    """Seen in the lab: a drain of ours for another cause was resumed outside the gate (a test's
    clean-up, an admin's scontrol), its record still in the health state, when a new fault drained
    the node in the next run. That drain must open its episode, or its reboot and its return to
    service are never counted (the episode stayed unopened and never closed)."""
    from healthcheck.actions.state import Drained, NodeState, load, save

    cluster = Cluster(tmp_path, names=("gpu1",))
    boot = load(cluster.state_dir, "gpu1").boot_id
    save(cluster.state_dir, "gpu1", NodeState(boot_id=boot, runs_in_boot=5, drained=Drained(
        cause="gpu.ecc.uncorrectable gpu2", resume_mode="after_reboot", boot_id=boot, at=time.time() - 60)))
    assert not cluster.slurm.node("gpu1").drained              # resumed by someone else
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    drained = cluster.run("gpu1")
    assert drained.decision.kind == "drain" and drained.remediation.decision.kind == "reboot"
    [entry] = [e for e in ledgers.load(cluster.state_dir, "gpu1").entries.values() if e.cause == "gpu.lost gpu3"]
    [episode] = entry.episodes
    assert episode.outcome == "" and len(episode.reboots) == 1
    cluster.reboot("gpu1")
    assert cluster.run("gpu1").decision.kind == "resume"
    [entry] = [e for e in ledgers.load(cluster.state_dir, "gpu1").entries.values() if e.cause == "gpu.lost gpu3"]
    assert entry.episodes[-1].outcome == "resumed"


# -- a stateless node (issue 31): every boot starts with an empty state directory ------------------

def stateless_reboot(cluster, name, drain_survives=True):
    """A reboot of a diskless node: what the lab's RebootProgram does with `lab up --stateless`."""
    from slurm_hooks.lab.stateless import forget_node

    cluster.reboot(name, drain_survives=drain_survives)
    assert forget_node(cluster.state_dir, name)          # something of the node's was kept, and is gone


@pytest.mark.parametrize("drain_survives", [True, False], ids=["24.11-on", "22.05"])
def test_on_a_stateless_node_a_lemon_still_gets_exactly_max_reboots_then_inspection(tmp_path, drain_survives):
    """The count lives in Slurm (the node's Extra): the ledger is gone after every boot. Without it
    the count started again at each boot and the lemon was rebooted for ever."""
    cluster = Cluster(tmp_path, names=("gpu1",), max_reboots=2)
    cluster.slurm.set_extra("gpu1", "rack=12 {owner:ml}")     # another tool's words in the field
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost"), ("gpu.3.lost_every_boot", True)])
    reboots = 0
    for _ in range(8):
        result = cluster.run("gpu1")
        if result.remediation is not None and result.remediation.decision.kind == "reboot":
            reboots += 1
            stateless_reboot(cluster, "gpu1", drain_survives)
    assert reboots == 2
    node = cluster.slurm.node("gpu1")
    assert node.drained and " reboots:2; inspect: back after 2 reboots: " in node.reason
    assert node.extra.startswith("rack=12 {owner:ml} sgh-reboots:")
    assert cluster.run("gpu1").remediation.decision.rule == "remediate-inspecting"
    for _ in range(2):      # an admin's reboot (Slurm resumes the node): the fault, then no reboot of ours
        stateless_reboot(cluster, "gpu1")
        assert cluster.run("gpu1").remediation.decision.kind != "reboot"
        node = cluster.slurm.node("gpu1")
        assert node.drained and " reboots:2; inspect: " in node.reason
    assert [call[0] for call in cluster.slurm.writes()].count("reboot") == 2


def test_on_a_stateless_node_a_gpu_lost_once_is_back_in_service_by_itself(tmp_path):
    """After the boot no record says the drain is ours and waits for a reboot: our reason says it
    is ours, Slurm's BootTime after the reason's time says the reboot came."""
    cluster = Cluster(tmp_path, names=("gpu1",))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").remediation.decision.kind == "reboot"
    stateless_reboot(cluster, "gpu1")
    assert cluster.slurm.node("gpu1").drained
    back = cluster.run("gpu1")
    assert (back.decision.kind, back.decision.rule) == ("resume", "resume")
    assert not cluster.slurm.node("gpu1").drained


def test_on_a_stateless_node_a_drain_of_ours_made_in_this_boot_still_waits_for_its_reboot(tmp_path):
    """No record and a reason set after the boot: the reboot the cause needs has not come."""
    cluster = Cluster(tmp_path, names=("gpu1",))          # remediation on, so nothing reboots below
    cluster.config = make_config(tmp_path, **{"enabled": False})
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").decision.kind == "drain"
    cluster.slurm.node("gpu1")
    cluster.slurm._known("gpu1").boot_epoch = time.time() - 3600          # booted an hour ago
    from slurm_hooks.lab.stateless import forget_node

    forget_node(cluster.state_dir, "gpu1")                # the state went, the boot did not change
    cluster.sims["gpu1"].inject([("gpu.3.state", "ok")])
    waiting = cluster.run("gpu1")
    assert (waiting.decision.kind, waiting.decision.rule) == ("none", "resume-wait-reboot")


def test_on_a_stateless_node_a_foreign_reason_set_during_the_reboot_is_kept(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").remediation.decision.kind == "reboot"
    cluster.slurm.user = "admin"
    cluster.slurm.drain("gpu1", "cable check, ticket 4411")        # while the node reboots
    stateless_reboot(cluster, "gpu1")
    before = list(cluster.slurm.writes())
    result = cluster.run("gpu1")
    assert result.decision.rule == "foreign-reason"
    node = cluster.slurm.node("gpu1")
    assert node.drained and node.reason.startswith("cable check, ticket 4411")
    assert cluster.slurm.writes() == before


def test_an_admins_resume_clears_the_reboot_count_kept_in_slurm_and_keeps_other_words(tmp_path):
    from healthcheck.actions.gate import Request, submit

    cluster = Cluster(tmp_path, names=("gpu1",), max_reboots=3)
    cluster.slurm.set_extra("gpu1", "rack=12")
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost"), ("gpu.3.lost_every_boot", True)])
    assert cluster.run("gpu1").remediation.decision.kind == "reboot"
    stateless_reboot(cluster, "gpu1")
    assert kept.reboots_kept(cluster.slurm.node("gpu1").extra)
    cluster.sims["gpu1"].inject([("gpu.3.state", "ok"), ("gpu.3.lost_every_boot", False)])
    outcome = submit(cluster.config, cluster.slurm, Request("resume", "gpu1", "cli"))
    assert outcome.applied.done
    assert cluster.slurm.node("gpu1").extra == "rack=12"


def test_a_run_that_found_slurm_still_rebooting_the_node_does_not_make_the_next_runs_quiet(tmp_path):
    """The first run of the new boot finds Slurm still rebooting the node (it has not seen the new
    BootTime yet) and learns nothing; the runs after it must ask Slurm again, or the drain of
    ours, which no state records on a stateless node, is never resumed."""
    from slurm_hooks.lab.stateless import forget_node

    cluster = Cluster(tmp_path, names=("gpu1",))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").remediation.decision.kind == "reboot"
    cluster.sims["gpu1"].reboot()
    forget_node(cluster.state_dir, "gpu1")
    early = cluster.run("gpu1")                          # Slurm: REBOOT_REQUESTED still
    assert early.decision.rule == "slurm-busy"
    cluster.slurm.finish_reboot("gpu1")
    back = cluster.run("gpu1")
    assert (back.decision.kind, back.decision.rule) == ("resume", "resume")
    quiet = cluster.run("gpu1"), cluster.run("gpu1")
    assert quiet[-1].decision.rule == "healthy" and not cluster.slurm.node("gpu1").drained


# -- the driver's recovery actions 5-7 (R570+ headers: IMEX domain, bus reset, system reboot) --------

@pytest.mark.parametrize("action, kind, rule", [
    ("bus_reset", "reset", "remediate-reset-first"),         # 6: what a GPU reset does
    ("system_reboot", "reboot", "remediate-reboot"),         # 7: a reboot, no reset first
    ("reboot", "reboot", "remediate-reboot"),                # 2: the same
])
def test_recovery_actions_6_and_7_plan_a_reset_and_a_reboot_with_gpu_reset_on(tmp_path, action, kind, rule):
    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    cluster.sims["gpu1"].inject([("gpu.3.recovery_action", action)])
    drained = cluster.run("gpu1")
    assert drained.decision.kind == "drain"
    assert cluster.slurm.node("gpu1").reason.startswith(f"gpu-hooks: v1 gpu.recovery_action gpu3 action:{action}; ")
    remedy = drained.remediation
    assert (remedy.decision.kind, remedy.decision.rule, remedy.applied.done) == (kind, rule, True)


def test_recovery_action_5_drains_naming_imex_domain_recovery_and_is_neither_reset_nor_rebooted(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    sim = cluster.sims["gpu1"]
    sim.inject([("gpu.3.recovery_action", "recover_imex_domain")])
    drained = cluster.run("gpu1")
    assert drained.decision.kind == "drain"
    reason = cluster.slurm.node("gpu1").reason
    assert reason.startswith("gpu-hooks: v1 gpu.recovery_action gpu3 action:recover_imex_domain; ")
    assert "Recover IMEX Domain: the IMEX domain (multi-node NVLink) needs recovery" in drained.decision.cause.summary
    # A person recovers the IMEX domain (contact_support: resumed by `slurm-gpu resume` only).
    assert drained.remediation.decision.kind == "none"
    assert drained.remediation.decision.rule == "remediate-not-after-reboot"
    assert [c[0] for c in cluster.slurm.writes()] == ["drain"]
    assert sim.load()["gpu"][3]["recovery_action"] == "recover_imex_domain"


def test_only_a_recovery_action_that_maps_to_reboot_is_reboot_only():
    from healthcheck.drain_reason import DrainReason
    from healthcheck.remediate.step import reboot_only

    def ours(action, check="gpu.recovery_action"):
        return DrainReason(check=check, subject="gpu3", keys={"action": action})

    assert [reboot_only(ours(a)) for a in ("reboot", "system_reboot", "reset", "bus_reset", "drain_and_reset",
                                          "recover_imex_domain", "unknown_(9)")] == [
        True, True, False, False, False, False, False]
    assert not reboot_only(ours("reboot", check="gpu.lost")) and not reboot_only(None)


def queue_jobs(cluster, jobs, node="gpu1"):
    """Records of jobs that ended on the node, queued for accounting as the epilog leaves them."""
    from healthcheck.records import outbox, store

    for job in jobs:
        store.write_record(cluster.state_dir, {"job_id": job, "node": node, "class": "COMPLETED",
                                               "slurm_class": "COMPLETED", "ended_at": time.time()})
        outbox.queue_record(cluster.state_dir, {"job_id": job, "node": node})


def test_the_reboot_waits_for_the_nodes_records_to_reach_accounting_first(tmp_path, monkeypatch):
    """With slurmdbd down the queued records would die with a stateless node's state directory:
    the reboot waits (wait-records), each run tries to deliver, and once accounting has them all
    the reboot is asked (issue 31)."""
    from healthcheck.records import outbox

    monkeypatch.setattr(outbox.DeliverySettings, "from_config",
                        classmethod(lambda cls, config: cls(attempts=1, verify_delay_s=0.0, jitter_s=0.0,
                                                            max_jobs_per_run=50, expire_s=86400.0,
                                                            backoff_max_s=0.0, backoff_s=0.0)))
    cluster = Cluster(tmp_path, names=("gpu1",))
    jobs = [str(n) for n in range(100, 120)]
    queue_jobs(cluster, jobs)
    real_accounting = cluster.slurm.accounting

    def slurmdbd_down(*args, **kwargs):
        raise ledgers_error("sacct: error: Problem talking to the database: Connection refused")
    from healthcheck.slurm.backend import SlurmError as ledgers_error

    cluster.slurm.accounting = slurmdbd_down
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    waiting = cluster.run("gpu1")
    assert waiting.decision.kind == "drain"
    assert (waiting.remediation.decision.kind, waiting.remediation.decision.rule) == ("none", "remediate-records-first")
    assert any("20 job record(s) not yet in accounting before the reboot" in n for n in waiting.notes)
    assert "reboot" not in [c[0] for c in cluster.slurm.writes()]
    # slurmdbd is back: a few jobs a run reach accounting, then the reboot
    cluster.slurm.accounting = real_accounting
    rows = {job: {"JobID": job, "JobIDRaw": job, "AdminComment": "", "State": "COMPLETED", "ExitCode": "0:0",
                  "Start": "2026-12-06T07:00:00"} for job in jobs}
    cluster.slurm.accounting_rows = list(rows.values())
    write = cluster.slurm.set_admin_comment

    def sacctmgr(job_id, text):             # accounting shows what was written
        write(job_id, text)
        rows[job_id]["AdminComment"] = text
    cluster.slurm.set_admin_comment = sacctmgr
    kinds = []
    for _ in range(5):
        result = cluster.run("gpu1")
        kinds.append(result.remediation.decision.kind if result.remediation else None)
        if kinds[-1] == "reboot":
            break
    assert kinds[-1] == "reboot" and "none" in kinds[:-1]          # RECORDS_PER_RUN at a time
    assert not outbox.has_pending(cluster.state_dir)
    written = {call[1] for call in cluster.slurm.calls if call[0] == "set_admin_comment"}
    assert written == set(jobs)


def test_the_reboot_goes_ahead_once_records_wait_s_is_spent(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), records_wait_s=0)
    queue_jobs(cluster, ["7"])
    cluster.slurm.unreachable = None

    def slurmdbd_down(*args, **kwargs):
        from healthcheck.slurm.backend import SlurmError

        raise SlurmError("sacct: error: Problem talking to the database")
    cluster.slurm.accounting = slurmdbd_down
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").remediation.decision.kind == "reboot"


def test_a_gpu_resets_output_is_never_held_whole(tmp_path):
    """Issue 34, 6: 200 MB printed by a reset command took the health check to 605 MB RSS (the
    output was read whole). Read as a stream now: what the run holds stays small whatever the
    command prints, and the line that says what went wrong is still found."""
    import sys
    import tracemalloc

    from healthcheck.actions.gpu_reset import ResetError, run_reset

    size = 32 << 20
    chatty = [sys.executable, "-c", f"import sys; sys.stdout.buffer.write(b'x' * {size}); "
              "sys.stdout.write('\\nUnable to reset GPU 00000000:1B:00.0\\n'); sys.exit(3)"]
    tracemalloc.start()
    try:
        with pytest.raises(ResetError) as failed:
            run_reset(chatty, 60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "exit 3: Unable to reset GPU 00000000:1B:00.0" in str(failed.value)
    assert peak < size // 8, peak
    run_reset([sys.executable, "-c", f"import sys; sys.stdout.buffer.write(b'y' * {size})"], 60)   # exit 0: done


class _RefusedExtra(FakeBackend):
    """A slurmctld that refuses the reboot count in Extra (an older Slurm, a site's policy)."""

    def set_extra(self, name, text):
        from healthcheck.slurm.backend import SlurmError

        self._call("set_extra", name, text)
        raise SlurmError("scontrol update: Invalid node field Extra")


@pytest.mark.parametrize("extra_kept", [True, False], ids=["extra-kept", "extra-refused"])
def test_a_ledger_that_cannot_be_written_stops_the_reboots_and_says_so_every_run(tmp_path, extra_kept):
    """Issue 34, 4: with the ledger's path a directory, a lemon got 5 reboots with max_reboots = 2,
    said once, then silently. The remediation cannot count, so it asks for no reboot (nor a GPU
    reset), and every run says why in one note line."""
    from healthcheck.health.outputs import log_line

    cluster = Cluster(tmp_path, names=("gpu1",), max_reboots=2)
    if not extra_kept:
        refusing = _RefusedExtra()
        refusing.add_node("gpu1")
        cluster.slurm = refusing
    os.makedirs(os.path.join(ledgers.ledger_path(cluster.state_dir, "gpu1"), "in-the-way"))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost"), ("gpu.3.lost_every_boot", True)])
    reboots = 0
    for run in range(6):
        result = cluster.run("gpu1")
        remedy = result.remediation
        if remedy is not None and remedy.decision.kind == "reboot" and remedy.applied.done:
            reboots += 1
            cluster.reboot("gpu1")
        said = [note for note in result.notes if "ledger" in note]
        assert len(said) == 1 and "\n" not in said[0], (run, result.notes)
        assert "no reboot" in said[0] and ledgers.ledger_path(cluster.state_dir, "gpu1") in said[0]
        assert remedy is not None and remedy.decision.rule == "remediate-uncounted"
        assert result.to_json()["remediation"]["rule"] == "remediate-uncounted"
        assert said[0] in log_line(result)                           # syslog and stderr, every run
    assert reboots == 0
    assert [c[0] for c in cluster.slurm.writes()] == ["drain"]        # nothing but the drain itself
    assert cluster.slurm.node("gpu1").drained


def test_a_ledger_that_cannot_be_written_never_lets_a_gpu_reset_run_each_time(tmp_path):
    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True)
    os.makedirs(os.path.join(ledgers.ledger_path(cluster.state_dir, "gpu1"), "in-the-way"))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    for _ in range(3):
        result = cluster.run("gpu1")
        assert result.remediation.decision.rule == "remediate-uncounted"
    assert cluster.sims["gpu1"].load()["gpu"][3]["state"] == "lost"      # never reset: it could not be counted
    assert [c[0] for c in cluster.slurm.writes()] == ["drain"]


class _SlowSlurm(FakeBackend):
    """A slurmctld that takes ``delay_s`` to answer each call: each call waits in a command run as
    CliBackend runs scontrol (``programs.run`` under ``[slurm] timeout_s``, a CommandError becoming
    a SlurmError), so the run's deadline cuts it as it cuts scontrol."""

    delay_s = 0.0
    timeout_s = 15.0

    def _call(self, *call):
        from healthcheck.safeio import programs
        from healthcheck.slurm.backend import SlurmError

        try:
            programs.run(["sleep", str(self.delay_s)], self.timeout_s)
        except programs.CommandError as exc:
            self.calls.append(call)
            raise SlurmError(str(exc)) from None
        super()._call(*call)


def _hanging_reset(cluster, name="gpu1") -> None:
    """A reset command that does not answer (a GPU that fell off the bus may not)."""
    path = os.path.join(cluster.sims[name].programs_dir, "hang-reset")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\nexec sleep 60\n")
    os.chmod(path, 0o755)


def _real_reboot(cluster, name="gpu1") -> None:
    """The node rebooted (not through scontrol reboot): Slurm keeps our drain, BootTime moves."""
    cluster.sims[name].reboot()
    known = cluster.slurm._known(name)
    known.boot_epoch = max(time.time(), (known.reason_epoch or 0.0) + 1.0)


def _run_within(cluster, deadline_s: float, name="gpu1"):
    """A run as the hook skeleton runs it: under the whole-run watchdog; the children killed when
    it fires. Returns (the run or None, where the watchdog fired or None)."""
    from healthcheck.hooklib.watchdog import Watchdog, kill_children, whole_run

    try:
        with whole_run(deadline_s):
            return cluster.run(name), None
    except Watchdog as fired:
        kill_children()
        return None, fired.where or "fired"


def test_a_reset_that_does_not_answer_is_bounded_by_the_time_left_in_the_run(tmp_path):
    """Issue 34, 3: a reset that does not answer ([remediate] gpu_reset_timeout_s = 20) and a slow
    slurmctld: the run's deadline struck during the reset, after the drain and before anything
    was saved. Every command of the run (the reset, each scontrol) now gets at most the time the
    run has left, less what it needs to save what it did: the run ends by itself, the drain
    recorded, the reset counted, the reboot taken in the same run or the next."""
    from healthcheck.actions.state import load_kept

    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True, gpu_reset_command=["hang-reset", "{gpu}"],
                      gpu_reset_timeout_s=20)
    slow = _SlowSlurm()
    slow.add_node("gpu1")
    slow.delay_s = 0.05
    cluster.slurm = slow
    _hanging_reset(cluster)
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    result, fired = _run_within(cluster, 4.0)
    assert fired is None, f"the watchdog struck at {fired}"
    assert result.decision.kind == "drain" and result.applied.done
    assert any(note.startswith("remediation: GPU reset not done") and "did not finish within" in note and "the time left in the run" in note
               for note in result.notes), result.notes
    assert load_kept(cluster.state_dir, "gpu1")[0].drained is not None          # the drain recorded
    assert ledgers.load(cluster.state_dir, "gpu1").asked is not None            # the reset counted


def test_a_reset_that_does_not_answer_leaves_the_record_and_the_node_comes_back_after_the_reboot(tmp_path):
    """Issue 34, 3, the finding's scenario with the default deadline's shape: the hanging reset
    ends within the run, the reboot follows in the same run, the record is kept, and after the
    reboot the healthy node is back in service by itself."""
    from healthcheck.actions.state import load_kept

    cluster = Cluster(tmp_path, names=("gpu1",), gpu_reset=True, gpu_reset_command=["hang-reset", "{gpu}"])
    _hanging_reset(cluster)
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    result, fired = _run_within(cluster, 3.0)
    assert fired is None, f"the watchdog struck at {fired}"
    assert (result.remediation.decision.kind, result.remediation.applied.done) == ("reboot", True)
    record = load_kept(cluster.state_dir, "gpu1")[0].drained
    assert record is not None and record.cause == "gpu.lost gpu3"
    cluster.reboot("gpu1")
    back = cluster.run("gpu1")
    assert (back.decision.kind, back.applied.done) == ("resume", True), back.decision
    assert not cluster.slurm.node("gpu1").drained


def test_a_drain_of_ours_with_no_record_is_found_again_from_slurm_after_a_real_reboot(tmp_path):
    """Issue 34, 3, as the finding saw it: the record of our drain lost (a run killed between the
    drain and its record, before this release), then the node really rebooted, healthy. Slurm
    says the drain is ours (our reason) and that the node booted since (BootTime after the
    reason's time): the node is resumed, nobody acting (gate.booted_since_reason)."""
    from healthcheck.actions import state as node_state

    cluster = Cluster(tmp_path, names=("gpu1",), **{"enabled": False})
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])
    assert cluster.run("gpu1").decision.kind == "drain"
    kept_state, _ = node_state.load_kept(cluster.state_dir, "gpu1")
    kept_state.drained = None                                     # the record lost
    node_state.save(cluster.state_dir, "gpu1", kept_state)
    _real_reboot(cluster)                                          # what clears a lost GPU
    back = cluster.run("gpu1")
    assert (back.decision.kind, back.decision.rule, back.applied.done) == ("resume", "resume", True)
    assert not cluster.slurm.node("gpu1").drained


def test_the_drain_record_is_saved_before_the_remediation_acts(tmp_path, monkeypatch):
    """Whatever the remediation then does, the run's judgement (our drain and its record) is on
    disk first: a watchdog striking in the remediation (here, in scontrol reboot) loses no drain."""
    from healthcheck.actions.state import load_kept
    from healthcheck.hooklib.watchdog import Watchdog

    cluster = Cluster(tmp_path, names=("gpu1",))
    cluster.sims["gpu1"].inject([("gpu.3.state", "lost")])

    def struck(name, reason):
        raise Watchdog("cli_backend.py:1 in run")

    monkeypatch.setattr(cluster.slurm, "reboot", struck)
    with pytest.raises(Watchdog):
        cluster.run("gpu1")
    record = load_kept(cluster.state_dir, "gpu1")[0].drained
    assert record is not None and record.cause == "gpu.lost gpu3" and record.resume_mode == "after_reboot"
    monkeypatch.undo()
    again = cluster.run("gpu1")                       # the next run goes on with the record
    assert again.decision.rule == "drained-same-cause" and again.remediation is not None
    assert again.remediation.decision.kind == "reboot" and again.remediation.applied.done
    # The reboot whose scontrol call the watchdog cut counted too: one too many at worst, never one
    # too few (a count written down before the act).
    [entry] = ledgers.load(cluster.state_dir, "gpu1").entries.values()
    assert len(entry.reboots) == 2
