"""The drain gate (``healthcheck/actions/gate.py``): whoever drains (the prolog, the epilog, the
health check), the drain is recorded with its cause, resume mode and boot, so the health check's
reboot-aware resume holds and ``slurm-gpu drained`` shows the evidence; ``slurm-gpu resume`` over a
hostlist resumes ours only. Slurm is the FakeBackend here (argument building and decisions);
tests/lab/test_lab_gate.py proves the same against the real Slurm."""
from __future__ import annotations

import pytest

from healthcheck.actions import budget, gate
from healthcheck.checks.base import CheckInput
from healthcheck.checks.probe_health import probe_findings
from healthcheck.facts import NvmlFacts
from healthcheck.findings import Finding, unseen, without_timeout_drains
from healthcheck.actions import state as node_state
from healthcheck.health.policy import HealthPolicy
from healthcheck.sources import sim_sources
from slurm_hooks import drain
from slurm_hooks.cli import drained_cmd

from .test_drained_cli import run
from .test_health_run import PROFILE, Node


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr(budget, "SETTLE_S", 0.0)


def lost(gpu=3):
    return Finding(check="gpu.lost", status="fail", action="drain", message=f"GPU {gpu} lost", gpu=gpu,
                   uuid=f"GPU-{gpu}")


def sources(node):
    return sim_sources("gpu2", node.state_dir, PROFILE)


def drained_row(node):
    info = node.slurm.node("gpu2")
    return drained_cmd.row(info, node.config.section("drain")["reason_prefix"], node.state_dir)


def resumed_only_after_a_reboot(node):
    """The health check on the drained node: healthy again (without a boot), but not resumed
    until the node rebooted."""
    node.sim.inject([("gpu.3.state", "ok")])
    waiting = node.run_once()
    assert (waiting.decision.kind, waiting.decision.rule) == ("none", "resume-wait-reboot"), waiting.decision
    assert node.slurm_node.drained
    node.sim.reboot()
    back = node.run_once()
    assert back.decision.kind == "resume" and back.applied.done, back.decision
    assert not node.slurm_node.drained and node_state.load(node.state_dir, "gpu2").drained is None


def test_a_prolog_drain_is_recorded_for_the_health_check_and_the_admin(tmp_path):
    node = Node(tmp_path)
    node.sim.inject([("gpu.3.state", "lost")])
    reason, rule = drain.drain_or_refuse(node.config, node.slurm, "gpu2", [lost()], [], by="prolog",
                                         sources=sources(node))
    assert rule == "drain" and reason.startswith("gpu-hooks: v1 gpu.lost gpu3")
    record = node_state.load(node.state_dir, "gpu2").drained
    assert (record.cause, record.resume_mode, record.by) == ("gpu.lost gpu3", "after_reboot", "prolog")
    assert record.boot_id == node.sim.boot_id() and record.evidence[0]["check"] == "gpu.lost"
    row = drained_row(node)
    assert row["evidence"] and row["evidence"][0]["uuid"] == "GPU-3" and row["drained_by"] == "prolog"
    assert row["recommended"].startswith("reboot the node")
    resumed_only_after_a_reboot(node)


def test_an_epilog_drain_for_an_xid_keeps_the_health_checks_resume_mode_for_its_action(tmp_path):
    node = Node(tmp_path)
    node.sim.inject([("gpu.3.state", "lost")])
    xid = {"kind": "xid", "code": 79, "gpu": 3, "action": "reboot", "mnemonic": "GPU_HAS_FALLEN_OFF_THE_BUS"}
    reason = drain.drain_for(node.config, node.slurm, "gpu2", [], [xid], by="epilog", sources=sources(node))
    assert reason.startswith("gpu-hooks: v1 kernel.xid gpu3 xid:79")
    record = node_state.load(node.state_dir, "gpu2").drained
    policy = HealthPolicy.from_config(node.config)
    assert record.by == "epilog" and record.resume_mode == policy.drain.resume_mode("kernel.xid", "reboot")
    assert record.evidence[0]["evidence"]["xid_action"] == "reboot"
    assert drained_row(node)["recommended"].startswith("reboot the node")
    resumed_only_after_a_reboot(node)


def test_an_epilog_xid_that_asks_for_a_person_is_never_resumed_automatically(tmp_path):
    node = Node(tmp_path)
    xid = {"kind": "xid", "code": 95, "gpu": 3, "action": "contact_support"}
    assert drain.drain_for(node.config, node.slurm, "gpu2", [], [xid], by="epilog", sources=sources(node))
    assert node_state.load(node.state_dir, "gpu2").drained.resume_mode == "never"
    node.sim.reboot()
    assert node.run_once().decision.rule == "resume-never" and node.slurm_node.drained


def test_a_job_xid_drains_in_no_hook(tmp_path):
    node = Node(tmp_path)
    xid = {"kind": "xid", "code": 13, "gpu": 3, "action": "job"}
    assert drain.drain_for(node.config, node.slurm, "gpu2", [], [xid], by="epilog", sources=sources(node)) is None
    assert node.slurm.writes() == []


def test_a_health_check_drain_is_recorded_as_its_own(tmp_path):
    node = Node(tmp_path)
    node.sim.inject([("gpu.3.state", "lost")])
    result = node.run_once()
    assert result.decision.kind == "drain" and result.applied.done
    assert node_state.load(node.state_dir, "gpu2").drained.by == "healthcheck"
    resumed_only_after_a_reboot(node)


def test_a_drain_by_another_hook_is_not_forgotten_by_a_concurrent_health_check(tmp_path, monkeypatch):
    """The health check reads the record under the node's lock: a prolog drain that landed while
    its probes ran is kept, not overwritten by the state it loaded before."""
    from healthcheck.health import run as health_run

    node = Node(tmp_path)
    node.sim.inject([("gpu.3.state", "lost")])
    original = health_run.run_checks

    def checks_while_the_prolog_drains(*args, **kwargs):
        report = original(*args, **kwargs)
        drain.drain_or_refuse(node.config, node.slurm, "gpu2", [lost()], [], by="prolog", sources=sources(node))
        return report
    monkeypatch.setattr(health_run, "run_checks", checks_while_the_prolog_drains)
    result = node.run_once()
    assert result.decision.rule == "drained-same-cause", result.decision
    assert node_state.load(node.state_dir, "gpu2").drained.by == "prolog"


def test_resume_of_a_hostlist_resumes_ours_only(tmp_path, monkeypatch):
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpu]\nbackend = "sim"\n[sim]\nprofile = "{PROFILE}"\n')
    from .fake_backend import FakeBackend

    fake = FakeBackend()
    ours = "gpu-hooks: v1 gpu.lost gpu3; GPU 3 lost"
    fake.add_node("gpu1", "IDLE+DRAIN", ours)
    fake.add_node("gpu2", "IDLE+DRAIN", "admin: PSU swap", "alice")
    fake.add_node("gpu3", "IDLE+DRAIN", ours)
    monkeypatch.setattr(drained_cmd, "_backend", lambda config: fake)
    done = run("resume", "--config", str(config), "gpu[1-3]")
    assert done.exit_code == 1 and "gpu2" in done.stderr and "not by this tool" in done.stderr, done.stderr
    assert fake.writes() == [("resume", "gpu1"), ("resume", "gpu3")]
    assert fake.node("gpu2").drained and fake.node("gpu2").reason == "admin: PSU swap"


def test_a_backend_never_takes_a_hostlist_for_a_node_change():
    from healthcheck.slurm import SlurmError
    from healthcheck.slurm.cli_backend import CliBackend

    backend = CliBackend(bin_dir="/nonexistent")
    for call in (lambda: backend.resume("gpu[1-3]"), lambda: backend.drain("gpu1,gpu2", "x")):
        with pytest.raises(SlurmError, match="one node"):
            call()


# -- facts, not messages ------------------------------------------------------------------------------

def test_a_probe_that_did_not_answer_is_a_field_not_a_message():
    reworded = Finding(check="probe.error", status="error", action="warn", message="the GPU driver said nothing",
                       unanswered=True)
    named_alike = Finding(check="probe.error", status="error", action="warn", message="NVML probe failed: but not")
    assert unseen([reworded]) and not unseen([named_alike])


def test_the_probe_checks_mark_what_did_not_answer():
    from healthcheck.config import Config

    config = Config.from_document({}, None)
    inp = CheckInput(node="gpu1", nvml=NvmlFacts(status="timeout", timeout_s=5.0), actions=config.section("actions"))
    findings = probe_findings(inp)
    assert findings and all(f.unanswered for f in findings) and findings[0].to_json()["unanswered"] is True


# -- one Xid-to-drain rule --------------------------------------------------------------------------

def test_every_hook_drains_for_the_same_xids_as_the_data_says():
    """The health check's findings, the prolog's and epilog's job-window events and the job
    classification follow one rule: the ``finding`` column of data/xid-actions.tsv."""
    from healthcheck.config import Config
    from healthcheck.safeio.datafiles import read_text
    from healthcheck.xid.events import XidEvent
    from healthcheck.xid.event_findings import xid_findings
    from healthcheck.xid.xid_actions import XID_ACTIONS
    from healthcheck.records.classify import evidence_class

    config = Config.from_document({}, None)
    rows = [line.split("\t") for line in read_text("xid-actions.tsv").splitlines()
            if line and not line.startswith("#") and not line.startswith("action\t")]
    wanted = {action: finding == "drain" for action, finding, _ in rows}
    assert list(wanted) == list(XID_ACTIONS) and any(wanted.values()) and not all(wanted.values())
    for action, drains in wanted.items():
        event = XidEvent(kind="xid", code=79, pci="0000:18:00", message="", action=action)
        health = [f for f in xid_findings([event], config=config) if f.action == "drain"]
        job = drain.event_finding(config, {"kind": "xid", "code": 79, "gpu": 0, "action": action})
        assert bool(health) == drains, action
        assert (job.action == "drain" and job.status == "fail") == drains, action
        assert (evidence_class({"kind": "xid", "code": 79, "action": action}) is not None) == drains, action


def test_no_xid_action_name_is_written_in_the_code():
    """Outside the data file, the product names no action that only an Xid has (the reader of
    the data file aside): which Xids drain is never decided by a name in code."""
    import ast
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    only_xid = {"reset_gpu", "contact_support"}
    found = []
    for package in ("healthcheck", "slurm_hooks"):
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith(".py") or path.endswith(os.path.join("kernellog", "xid_actions.py")):
                    continue
                tree = ast.parse(open(path, encoding="utf-8").read())
                docs = {id(node.body[0].value) for node in ast.walk(tree)
                        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                        and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
                found += [f"{os.path.relpath(path, root)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                          if isinstance(node, ast.Constant) and node.value in only_xid and id(node) not in docs]
    assert found == []


def _hang_with_siblings(last_answer_s):
    from healthcheck.config import Config
    from healthcheck.facts import GpuFacts

    gpus = [GpuFacts(index=i, state="ok") for i in range(7)] + [GpuFacts(index=7, state="hang")]
    nvml = NvmlFacts(status="ok", timeout_s=5.0, elapsed_s=5.0, gpus=gpus, last_answer_s=last_answer_s)
    config = Config.from_document({}, None)
    findings = probe_findings(CheckInput(node="gpu1", nvml=nvml, actions=config.section("actions")))
    without_timeout_drains(findings, drain_on_timeout=False)
    return findings


def test_one_gpu_hangs_while_its_siblings_answered_early_drains_for_that_gpu():
    [finding] = _hang_with_siblings(0.2)
    assert finding.gpu == 7 and finding.action == "drain" and finding.evidence["answered_gpus"] == 7
    assert finding.message.endswith("while 7 other GPU(s) did")


@pytest.mark.parametrize("last_answer_s", [4.9, None])
def test_siblings_that_answered_only_late_are_a_slow_host_not_a_broken_gpu(last_answer_s):
    """Measured in the lab (200 one-GPU jobs starting at once on 32 simulated nodes, 2 cores): the
    NVML child's threads finished one by one up to the deadline; reading that as 'GPU 2 hangs
    while 2 others answered' drained healthy nodes. A starved host is ambiguous, as a hung driver is."""
    [finding] = _hang_with_siblings(last_answer_s)
    assert finding.action == "warn" and "answered_gpus" not in finding.evidence
    assert finding.evidence["answered_late_gpus"] == 7 and "a slow host, not one GPU" in finding.message
