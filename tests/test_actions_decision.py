"""The decision table (healthcheck/actions/decision.py): one test per rule, in table order, and
a test that no rule is left without one."""
from __future__ import annotations

import pytest

from healthcheck.actions.cause import drain_causes, reason_for
from healthcheck.actions.decision import RULES, SLURM_BUSY_FLAGS, Policy, decide, rule_names
from healthcheck.drain_reason import format_reason, parse_reason
from healthcheck.findings import Finding
from healthcheck.slurm.backend import NodeInfo

from .conftest import builtin_settings



def policy_with(**changes) -> Policy:
    """The built-in [drain] policy, without [health]'s resume tables unless a test gives them."""
    return builtin_settings(Policy, **{"resume_by_check": {}, "resume_by_xid_action": {}, **changes})


POLICY = policy_with()
ECC = Finding(check="gpu.ecc.uncorrectable", status="fail", action="drain",
              message="GPU 3 (0000:1b:00.0): 2 uncorrectable (double-bit) ECC errors since the driver loaded",
              gpu=3, evidence={"volatile_uncorrected": 2, "aggregate_uncorrected": 2})
XID = Finding(check="kernel.xid", status="fail", action="drain",
              message="GPU 5: Xid 79 (GPU has fallen off the bus)", gpu=5, evidence={"code": 79, "count": 1})
IB = Finding(check="ib.port", status="fail", action="drain", message="mlx5_0 port 1 is DOWN",
             hca="mlx5_0", port=1, evidence={"state": "1: DOWN"})
TEMP = Finding(check="gpu.temperature", status="warn", action="warn", message="GPU 1 runs hot", gpu=1)
OK = Finding(check="gpu.count", status="ok", action="drain", message="8 GPUs")

OUR_ECC = format_reason(reason_for(ECC), POLICY.reason_prefix, POLICY.max_reason_len)
OUR_XID = format_reason(reason_for(XID), POLICY.reason_prefix, POLICY.max_reason_len)
COVERED = set()


def node(state="IDLE", reason="", user=""):
    return NodeInfo(name="gpu2", state=state, reason=reason, reason_user=user or ("root" if reason else ""))


def check(rule, decision, kind):
    COVERED.add(rule)
    assert (decision.rule, decision.kind) == (rule, kind), decision.why
    assert "\n" not in decision.why and decision.why
    return decision


# -- causes ----------------------------------------------------------------------------------------

def test_a_drain_finding_becomes_our_reason_with_subject_and_key():
    assert OUR_ECC.startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; GPU 3 (0000:1b:00.0)")
    assert OUR_XID.startswith("gpu-hooks: v1 kernel.xid gpu5 xid:79; ")
    text = format_reason(reason_for(IB), POLICY.reason_prefix, POLICY.max_reason_len)
    assert text.startswith("gpu-hooks: v1 ib.port mlx5_0:1; ")
    assert parse_reason(OUR_XID, POLICY.reason_prefix).cause == "kernel.xid gpu5 xid:79"


def test_only_failing_findings_whose_action_is_drain_are_causes():
    assert [c.cause for c in drain_causes([OK, TEMP, ECC, XID, ECC])] == ["gpu.ecc.uncorrectable gpu3", "kernel.xid gpu5 xid:79"]


# -- the table, row by row -----------------------------------------------------------------------------

def test_slurm_unreachable_with_a_fault_is_blocked_never_a_drain():
    decision = check("slurm-unreachable-fault",
                     decide("gpu2", None, [ECC], POLICY, slurm_error="scontrol show node: no answer within 15 s"),
                     "blocked")
    assert "no answer within 15 s" in decision.why and decision.reason == OUR_ECC
    assert decision.scontrol == ("update", "nodename=gpu2", "state=drain", f"reason={OUR_ECC}")


def test_slurm_unreachable_and_healthy_is_nothing():
    check("slurm-unreachable-healthy", decide("gpu2", None, [OK], POLICY, slurm_error="down"), "none")


@pytest.mark.parametrize("state", ["IDLE+REBOOT_REQUESTED", "MIXED+REBOOT_ISSUED", "IDLE+POWERING_DOWN",
                                   "IDLE+POWERED_DOWN", "IDLE+POWERING_UP", "IDLE+MAINTENANCE+RESERVED",
                                   "DOWN+NOT_RESPONDING", "DOWN*", "IDLE+FAIL", "UNKNOWN"])
def test_a_node_slurm_is_handling_is_left_alone(state):
    decision = check("slurm-busy", decide("gpu2", node(state), [ECC], POLICY), "leave-alone")
    assert decision.scontrol is None


def test_our_drained_node_that_stops_responding_is_not_resumed():
    check("slurm-busy", decide("gpu2", node("IDLE+DRAIN+NOT_RESPONDING", OUR_ECC), [], POLICY), "leave-alone")


def test_someone_elses_reason_is_never_overwritten():
    decision = check("foreign-reason",
                     decide("gpu2", node("IDLE+DRAIN", "disk replaced, ticket 4711", "alice"), [XID], POLICY),
                     "leave-alone")
    assert "alice" in decision.why and decision.reason == "disk replaced, ticket 4711"


def test_someone_elses_drain_is_never_resumed():
    check("foreign-reason", decide("gpu2", node("DOWN", "admin: bad PSU"), [], POLICY), "leave-alone")


def test_a_reason_with_another_prefix_is_not_ours():
    other = policy_with(reason_prefix="nhc:")
    check("foreign-reason", decide("gpu2", node("IDLE+DRAIN", OUR_ECC), [], other), "leave-alone")


def test_out_of_service_without_any_reason_is_left_alone():
    check("foreign-out-of-service", decide("gpu2", node("IDLE+DRAIN"), [], POLICY), "leave-alone")


def test_no_redrain_for_the_same_cause():
    decision = check("drained-same-cause", decide("gpu2", node("IDLE+DRAIN", OUR_ECC), [ECC], POLICY), "none")
    assert decision.scontrol is None


def test_the_same_cause_among_several_keeps_our_reason():
    check("drained-same-cause", decide("gpu2", node("MIXED+DRAIN", OUR_ECC), [XID, ECC], POLICY), "none")


def test_a_new_cause_on_a_node_we_drained_updates_our_reason():
    decision = check("drained-new-cause", decide("gpu2", node("IDLE+DRAIN", OUR_ECC), [XID], POLICY), "drain")
    assert decision.reason == OUR_XID
    assert decision.scontrol == ("update", "nodename=gpu2", "state=drain", f"reason={OUR_XID}")


def test_an_older_reason_of_ours_is_replaced_by_a_readable_one():
    check("drained-new-cause", decide("gpu2", node("IDLE+DRAIN", "gpu-hooks: GPU 3 lost"), [ECC], POLICY), "drain")


@pytest.mark.parametrize("state", ["IDLE", "MIXED", "ALLOCATED", "DOWN+COMPLETING"])
def test_a_fault_on_a_node_in_service_drains_it(state):
    reason = OUR_ECC if state.startswith("DOWN") else ""
    decision = check("drain", decide("gpu2", node(state, reason), [ECC, XID], POLICY), "drain")
    assert decision.reason == OUR_ECC and decision.cause.cause == "gpu.ecc.uncorrectable gpu3"
    assert len(decision.reason) <= POLICY.max_reason_len


def test_a_long_message_is_cut_to_the_configured_length():
    long = Finding(check="gpu.lost", status="fail", action="drain", message="x " * 200, gpu=0)
    decision = check("drain", decide("gpu2", node(), [long], policy_with(max_reason_len=60)), "drain")
    assert 50 < len(decision.reason) <= 60 and decision.reason.endswith("...")


def test_resume_waits_while_a_job_completes():
    check("resume-wait-completing", decide("gpu2", node("IDLE+COMPLETING+DRAIN", OUR_ECC), [], POLICY), "leave-alone")


def test_resume_waits_while_a_drain_finding_is_still_being_confirmed():
    check("resume-wait-pending", decide("gpu2", node("IDLE+DRAIN", OUR_ECC), [], POLICY, causes=[], pending=True), "none")


def test_our_drain_is_not_resumed_when_a_probe_could_not_look():
    """NVML hung: no finding asks for a drain, yet nothing was checked; the drain stays."""
    decision = check("resume-wait-unseen", decide("gpu2", node("IDLE+DRAIN", OUR_ECC), [], POLICY, unseen=True), "none")
    assert decision.scontrol is None
    check("healthy", decide("gpu2", node("IDLE"), [], POLICY, unseen=True), "none")


def test_only_the_given_causes_drain():
    """The health check passes only confirmed causes; the others do not drain yet."""
    check("healthy", decide("gpu2", node(), [ECC], POLICY, causes=[]), "none")
    decision = check("drain", decide("gpu2", node(), [ECC, XID], POLICY, causes=[reason_for(XID)]), "drain")
    assert decision.reason == OUR_XID


def test_the_resume_mode_recorded_for_a_cause_wins_over_the_check_default():
    policy = policy_with(resume_by_check={"kernel.xid": "auto"}, resume_by_cause={"kernel.xid gpu5 xid:79": "never"})
    check("resume-never", decide("gpu2", node("IDLE+DRAIN", OUR_XID), [], policy), "none")


def test_a_cause_that_needs_an_admin_is_never_resumed():
    policy = policy_with(resume_by_check={"gpu.remap.failed": "never"})
    reason = "gpu-hooks: v1 gpu.remap.failed gpu1 uncorrectable_rows:3; no spare rows left"
    decision = check("resume-never", decide("gpu2", node("IDLE+DRAIN", reason), [], policy), "none")
    assert decision.scontrol is None and "slurm-gpu resume" in decision.why


def test_a_cause_a_reboot_clears_waits_for_the_reboot():
    policy = policy_with(resume_by_check={"kernel.xid": "after_reboot"})
    check("resume-wait-reboot", decide("gpu2", node("IDLE+DRAIN", OUR_XID), [], policy, rebooted_since_drain=False), "none")
    check("resume-wait-reboot", decide("gpu2", node("IDLE+DRAIN", OUR_XID), [], policy), "none")
    check("resume", decide("gpu2", node("IDLE+DRAIN", OUR_XID), [], policy, rebooted_since_drain=True), "resume")


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "MIXED+DRAIN", "DOWN"])
def test_our_drain_is_resumed_once_every_check_passes(state):
    decision = check("resume", decide("gpu2", node(state, OUR_ECC), [OK, TEMP], POLICY), "resume")
    assert decision.scontrol == ("update", "nodename=gpu2", "state=resume")
    assert decision.cause.cause == "gpu.ecc.uncorrectable gpu3"


def test_a_healthy_node_in_service_is_nothing():
    check("healthy", decide("gpu2", node("MIXED"), [OK, TEMP], POLICY), "none")


def test_master_switch_off_blocks_a_drain_but_says_what_it_would_do():
    decision = decide("gpu2", node(), [ECC], policy_with(enabled=False))
    check("actions-off", decision, "blocked")
    assert decision.reason == OUR_ECC and decision.scontrol[2] == "state=drain"
    assert "would drain" in decision.why


def test_master_switch_off_blocks_a_resume():
    check("actions-off", decide("gpu2", node("IDLE+DRAIN", OUR_ECC), [], policy_with(enabled=False)), "blocked")


def test_master_switch_off_changes_nothing_else():
    check("foreign-reason", decide("gpu2", node("IDLE+DRAIN", "admin"), [ECC], policy_with(enabled=False)), "leave-alone")


def test_busy_flags_are_slurm_2205_spellings():
    assert {"REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_DOWN", "POWERED_DOWN", "POWERING_UP",
            "MAINTENANCE", "NOT_RESPONDING"} <= set(SLURM_BUSY_FLAGS)


def test_zz_every_rule_has_a_test():
    """Runs after the others in this file (pytest keeps file order)."""
    assert [rule.name for rule in RULES][-1] == "healthy"
    assert set(rule_names()) - COVERED == set()


# -- the one table of resume modes (decision.RESUME_MODE_RULES): a case per row, each row the first to answer

RESUME_ROWS = {
    "recorded": (policy_with(resume_by_cause={"kernel.xid gpu5 xid:79": "never"}, resume_by_check={"kernel.xid": "auto"},
                        resume_by_xid_action={"reboot": "auto"}),
                 ("kernel.xid", "reboot", "kernel.xid gpu5 xid:79"), "never"),
    "repeat": (policy_with(resume_by_check={"kernel.xid.repeat": "auto"}, resume_default="auto"),
               ("kernel.xid.repeat", "", ""), "never"),
    "xid-action": (policy_with(resume_by_xid_action={"reboot": "after_reboot"}, resume_by_check={"kernel.xid": "never"}),
                   ("kernel.xid", "reboot", ""), "after_reboot"),
    "check": (policy_with(resume_by_xid_action={"reboot": "auto"}, resume_by_check={"gpu.lost": "after_reboot"}),
              ("gpu.lost", "", ""), "after_reboot"),
    "default": (policy_with(resume_default="never", resume_by_check={"gpu.lost": "auto"}), ("ib.port", "", ""), "never"),
}


def test_every_row_of_the_resume_table_has_a_case():
    from healthcheck.actions.decision import RESUME_MODE_RULES

    assert [name for name, _ in RESUME_MODE_RULES] == list(RESUME_ROWS)


@pytest.mark.parametrize("row", sorted(RESUME_ROWS))
def test_the_resume_table_row(row):
    policy, (check, action, cause), mode = RESUME_ROWS[row]
    assert policy.resume_mode(check, action, cause) == mode
