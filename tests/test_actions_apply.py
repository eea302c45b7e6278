"""The apply edge and FakeBackend: a decision becomes exactly one scontrol call, a dry run
changes nothing, and Slurm's failures come back as one line instead of an exception."""
from __future__ import annotations

import pytest

from healthcheck.actions import Policy, apply, decide
from healthcheck.findings import Finding
from healthcheck.slurm.backend import JobInfo, NodeInfo, SlurmError
from .conftest import builtin_settings
from .fake_backend import FakeBackend

ECC = Finding(check="gpu.ecc.uncorrectable", status="fail", action="drain",
              message="GPU 3: 2 uncorrectable (double-bit) ECC errors", gpu=3,
              evidence={"volatile_uncorrected": 2})


def cluster() -> FakeBackend:
    fake = FakeBackend()
    fake.add_node("gpu1")
    fake.add_node("gpu2", "IDLE+DRAIN", "disk replaced, ticket 4711", "alice")
    fake.add_node("gpu3", "MIXED")
    return fake


def run_once(fake: FakeBackend, name: str, findings, policy=None, dry_run=False):
    policy = policy or builtin_settings(Policy, resume_by_check={}, resume_by_xid_action={})
    try:
        node, error = fake.node(name), ""
    except SlurmError as exc:
        node, error = None, str(exc)
    return apply(fake, decide(name, node, findings, policy, slurm_error=error), dry_run=dry_run)


def test_drain_then_no_redrain_then_resume():
    fake = cluster()
    first = run_once(fake, "gpu1", [ECC])
    assert first.done and first.settled and first.argv[:4] == ["scontrol", "update", "nodename=gpu1", "state=drain"]
    assert fake.node("gpu1").state == "IDLE+DRAIN"
    assert fake.node("gpu1").reason.startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; ")
    second = run_once(fake, "gpu1", [ECC])
    assert second.decision.kind == "none" and not second.done
    third = run_once(fake, "gpu1", [])
    assert third.decision.kind == "resume" and third.done
    assert (fake.node("gpu1").state, fake.node("gpu1").reason) == ("IDLE", "")
    assert [call[0] for call in fake.writes()] == ["drain", "resume"]


def test_an_admin_drain_is_neither_overwritten_nor_resumed():
    fake = cluster()
    for findings in ([ECC], []):
        result = run_once(fake, "gpu2", findings)
        assert result.decision.kind == "leave-alone" and not result.done
    assert fake.writes() == []
    assert fake.node("gpu2").reason == "disk replaced, ticket 4711"


def test_dry_run_returns_the_argv_and_changes_nothing():
    fake = cluster()
    result = run_once(fake, "gpu3", [ECC], dry_run=True)
    assert result.dry_run and not result.done and fake.writes() == []
    assert result.argv == ["scontrol", *result.decision.scontrol]
    assert result.argv[-1].startswith("reason=gpu-hooks: v1 gpu.ecc.uncorrectable gpu3")


def test_control_plane_down_drains_nothing_and_fails_nothing():
    fake = cluster()
    fake.unreachable = "scontrol show node: no answer within 15 s"
    result = run_once(fake, "gpu1", [ECC])
    assert result.decision.kind == "blocked" and not result.done
    assert fake.writes() == []


def test_a_failed_drain_is_one_line_and_not_settled():
    class Refusing(FakeBackend):
        def drain(self, name, reason):
            raise SlurmError("scontrol update nodename=gpu1 state=drain: Invalid node name specified")

    fake = Refusing([NodeInfo("gpu1", "IDLE")])
    result = run_once(fake, "gpu1", [ECC])
    assert not result.done and not result.settled
    assert result.error == "scontrol update nodename=gpu1 state=drain: Invalid node name specified"


def test_nothing_to_apply_is_settled():
    result = run_once(cluster(), "gpu3", [])
    assert result.decision.kind == "none" and result.settled and result.argv is None


def test_fake_records_the_argv_the_cli_backend_would_run():
    fake = cluster()
    fake.drain("gpu3", "gpu-hooks: v1 kernel.xid gpu0 xid:79")
    fake.resume("gpu3")
    assert fake.scontrol_argvs() == [("update", "nodename=gpu3", "state=drain", "reason=gpu-hooks: v1 kernel.xid gpu0 xid:79"),
                                     ("update", "nodename=gpu3", "state=resume")]
    assert fake.node("gpu3").state == "MIXED"


def test_fake_resume_of_a_down_node_makes_it_idle_and_unknown_nodes_fail():
    fake = FakeBackend([NodeInfo("gpu1", "DOWN", reason="x")])
    fake.resume("gpu1")
    assert fake.node("gpu1").state == "IDLE"
    with pytest.raises(SlurmError, match="no such node"):
        fake.node("gpu9")


def test_fake_jobs_and_admin_comment():
    fake = FakeBackend(jobs=[JobInfo("7", {"JobState": "COMPLETING"})])
    fake.set_admin_comment("7", "SGH1:{}")
    assert fake.job("7").get("AdminComment") == "SGH1:{}" and fake.job("8") is None
    fake.accounting_rows = [{"JobID": "7", "State": "COMPLETED"}, {"JobID": "8", "State": "FAILED"}]
    assert fake.accounting(["7"], ["JobID", "State"]) == [{"JobID": "7", "State": "COMPLETED"}]
    assert fake.expand_hostlist("gpu[1-2]") == ["gpu1", "gpu2"]


def test_the_decision_imports_nothing_that_runs_programs():
    import subprocess
    import sys

    probe = ("import sys, healthcheck.actions.decision, healthcheck.slurm; "
             "print(sorted(m for m in ('subprocess', 'healthcheck.safeio.programs', 'healthcheck.slurm.cli_backend', "
             "'slurm_hooks') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
