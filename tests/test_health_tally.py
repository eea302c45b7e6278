"""Confirmation over runs, the boot grace runs, and the Xid that comes back after reboots
(healthcheck/health/streaks.py: pure)."""
from __future__ import annotations

from healthcheck.actions.cause import causes_of
from healthcheck.actions.decision import REPEAT_CHECK, Policy
from healthcheck.findings import Finding
from healthcheck.health.policy import HealthPolicy
from healthcheck.health.streaks import tally

from .conftest import builtin_settings

POLICY = builtin_settings(HealthPolicy, confirm_runs=2, confirm_by_check={"gpu.ecc.uncorrectable": 1, "kernel.xid": 1},
                          max_reboots=2, drain=builtin_settings(Policy, resume_by_check={"gpu.lost": "after_reboot"},
                                                                resume_by_xid_action={"reboot": "after_reboot",
                                                                                      "contact_support": "never"}))
IB = Finding(check="ib.port", status="fail", action="drain", message="mlx5_3 port 1 is DOWN", hca="mlx5_3", port=1)
DBE = Finding(check="gpu.ecc.uncorrectable", status="fail", action="drain", message="GPU 3: 2 DBE", gpu=3,
              evidence={"volatile_uncorrected": 2})
XID79 = Finding(check="kernel.xid", status="fail", action="drain", message="GPU 5: Xid 79", gpu=5,
                uuid="GPU-5555", evidence={"code": 79, "xid_action": "reboot"})
WARN = Finding(check="gpu.temperature", status="warn", action="warn", message="hot", gpu=1)


def run(findings, failing=None, boots=None, boot="A", grace=False):
    return tally(causes_of(findings, POLICY.drain), failing or {}, boots or {}, boot, grace, POLICY)


def test_a_flapping_check_drains_only_after_k_consecutive_runs():
    first = run([IB])
    assert first.confirmed == [] and [(c.key, n, k) for c, n, k in first.pending] == [("ib.port mlx5_3:1", 1, 2)]
    second = run([IB], failing=first.failing)
    assert [c.key for c in second.confirmed] == ["ib.port mlx5_3:1"] and second.pending == []


def test_a_run_without_the_finding_starts_the_count_again():
    first = run([IB])
    healthy = run([], failing=first.failing)
    assert healthy.failing == {}
    again = run([IB], failing=healthy.failing)
    assert again.confirmed == [] and again.failing == {"ib.port mlx5_3:1": 1}


def test_double_bit_ecc_and_a_fatal_xid_drain_at_once():
    result = run([DBE, XID79, WARN])
    assert [c.key for c in result.confirmed] == ["gpu.ecc.uncorrectable gpu3", "kernel.xid gpu5 xid:79"]


def test_grace_runs_after_boot_count_no_flapping_failure_but_count_a_dbe():
    result = run([IB, DBE], grace=True)
    assert [c.key for c in result.confirmed] == ["gpu.ecc.uncorrectable gpu3"]
    assert result.failing["ib.port mlx5_3:1"] == 0


def test_resume_mode_follows_the_xid_action_and_the_check():
    causes = causes_of([XID79, DBE, Finding(check="gpu.lost", status="fail", action="drain", message="lost", gpu=2)],
                       POLICY.drain)
    assert [c.resume_mode for c in causes] == ["after_reboot", "auto", "after_reboot"]


def test_the_same_xid_after_two_reboots_is_an_inspection_drain():
    boots = {}
    for boot, expected in (("A", "kernel.xid"), ("B", "kernel.xid"), ("C", REPEAT_CHECK)):
        result = run([XID79], boots=boots, boot=boot)
        boots = result.xid_boots
        cause = result.confirmed[0]
        assert cause.reason.check == expected
    assert cause.resume_mode == "never"
    assert cause.reason.keys == {"xid": "79", "reboots": "2"}
    assert boots == {"GPU-5555 xid:79": ["A", "B", "C"]}


def test_the_same_xid_twice_in_one_boot_is_not_a_reboot():
    first = run([XID79], boot="A")
    second = run([XID79], boots=first.xid_boots, boot="A")
    assert second.xid_boots == {"GPU-5555 xid:79": ["A"]}
    assert second.confirmed[0].reason.check == "kernel.xid"


def test_a_per_code_override_of_the_reboot_count():
    policy = builtin_settings(HealthPolicy, confirm_by_check={"kernel.xid": 1}, max_reboots=2,
                              max_reboots_by_xid={"79": 1})
    first = tally(causes_of([XID79], policy.drain), {}, {}, "A", False, policy)
    second = tally(causes_of([XID79], policy.drain), {}, first.xid_boots, "B", False, policy)
    assert second.confirmed[0].reason.check == REPEAT_CHECK
