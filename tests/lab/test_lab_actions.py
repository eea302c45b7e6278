"""The Actions layer against the real Slurm: a decision drains and resumes a node through the
product's CliBackend, and a node an admin drained is neither overwritten nor resumed."""
from __future__ import annotations

import time

import pytest

from healthcheck.actions import Policy, apply, decide
from healthcheck.findings import Finding
from healthcheck.slurm.cli_backend import CliBackend
from slurm_hooks.lab.commands import slurm_env

from ..conftest import builtin_settings

pytestmark = pytest.mark.lab

# A cause the lab's own health check never resumes by itself ([health.resume] "gpu.remap.failed" =
# "never"): it runs on every lab node every few seconds, finds the simulated GPU healthy, and
# would otherwise resume a drain for a fault the simulator does not have before the test reads it.
REMAP_FAILED = Finding(check="gpu.remap.failed", status="fail", action="drain",
              message="GPU 3 (0000:1b:00.0): row remapping failed, 2 uncorrectable rows",
              gpu=3, evidence={"uncorrectable": 2})
ADMIN_REASON = "admin: reseating the NVLink bridge, ticket 4711"


def settle(backend: CliBackend, name: str, drained: bool, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while backend.node(name).drained != drained and time.monotonic() < deadline:
        time.sleep(0.3)


def test_drain_and_resume_through_the_real_backend_with_ownership(lab):
    backend = CliBackend(bin_dir=lab.paths.bin, slurm_conf=lab.paths.slurm_conf, env=slurm_env(lab.paths), timeout_s=20)
    policy = builtin_settings(Policy, resume_by_check={}, resume_by_xid_action={})
    try:
        lab.run("scontrol", "update", "nodename=gpu2", "state=drain", f"reason={ADMIN_REASON}").check_returncode()

        # A fault on gpu1: drained with our reason, set by root.
        drained = apply(backend, decide("gpu1", backend.node("gpu1"), [REMAP_FAILED], policy))
        assert drained.done and drained.decision.kind == "drain", drained
        node = backend.node("gpu1")
        assert node.drained and node.reason_user == "root"
        assert node.reason == drained.decision.reason
        assert node.reason.startswith("gpu-hooks: v1 gpu.remap.failed gpu3 uncorrectable_rows:2; GPU 3")
        stamp = node.reason_time

        # The same fault next run: no second drain (Slurm's reason timestamp is unchanged).
        again = apply(backend, decide("gpu1", backend.node("gpu1"), [REMAP_FAILED], policy))
        assert again.decision.kind == "none" and not again.done
        assert backend.node("gpu1").reason_time == stamp

        # The admin's node: a fault does not overwrite the reason, health does not resume it.
        for findings in ([REMAP_FAILED], []):
            result = apply(backend, decide("gpu2", backend.node("gpu2"), findings, policy))
            assert result.decision.kind == "leave-alone" and not result.done
            admin = backend.node("gpu2")
            assert admin.drained and admin.reason == ADMIN_REASON

        # gpu1 healthy again: resumed, reason gone.
        resumed = apply(backend, decide("gpu1", backend.node("gpu1"), [], policy))
        assert resumed.done and resumed.decision.kind == "resume"
        settle(backend, "gpu1", drained=False)
        node = backend.node("gpu1")
        assert not node.drained and node.reason == ""
    finally:
        for name in ("gpu1", "gpu2"):
            lab.run("scontrol", "update", f"nodename={name}", "state=resume")
