"""GPU checks are pure: hand-made facts in, findings out."""
from __future__ import annotations

import pytest

from healthcheck.checks import (gpu_count, gpu_ecc, gpu_nvml, gpu_pcie, gpu_power, gpu_processes, gpu_recovery,
                               gpu_remap, gpu_thermal)
from healthcheck.facts import GpuFacts, NvmlFacts

from .checks_support import default_input

BUS = "00000000:{:02X}:00.0"


def gpu(index: int = 0, **facts) -> GpuFacts:
    facts.setdefault("uuid", f"GPU-test-{index}")
    facts.setdefault("pci_bus_id", BUS.format(0x18 + 0x10 * index))
    facts.setdefault("name", "NVIDIA H100 80GB HBM3")
    return GpuFacts(index=index, **facts)


def node(*gpus: GpuFacts, count=None, **facts) -> NvmlFacts:
    return NvmlFacts(gpus=list(gpus), device_count=len(gpus) if count is None else count, **facts)


def ids(findings):
    return [f.check for f in findings]


# -- gpu.nvml -------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", ["library_not_found", "driver_not_loaded", "init_error"])
def test_nvml_unusable_fails_a_node_that_expects_gpus(status):
    findings = gpu_nvml.nvml_usable(default_input(nvml=NvmlFacts(status=status, message="x"),
                                                  expected={"gpus": 8}))
    assert [(f.check, f.status, f.action) for f in findings] == [("gpu.nvml", "fail", "drain")]


def test_nvml_missing_without_expectation_is_could_not_check_and_drains_nothing():
    [finding] = gpu_nvml.nvml_usable(default_input(nvml=NvmlFacts(status="library_not_found")))
    assert (finding.status, finding.action) == ("error", "none")
    assert "not installed" in finding.message


def test_nvml_read_errors_on_one_gpu_are_reported_with_the_gpu():
    bad = gpu(2, errors={"power": "Unknown Error"})
    [finding] = gpu_nvml.nvml_usable(default_input(nvml=node(gpu(0), gpu(1), bad)))
    assert (finding.gpu, finding.pci_bus_id, finding.status) == (2, bad.pci_bus_id, "error")
    assert "Unknown Error" in finding.message


# -- gpu.count, gpu.model, gpu.lost ------------------------------------------------------------------
def test_count_below_expected_fails_with_evidence():
    [finding] = gpu_count.gpu_count(default_input(nvml=node(*[gpu(i) for i in range(7)]), expected={"gpus": 8}))
    assert finding.status == "fail" and finding.action == "drain"
    assert finding.evidence["expected"] == 8 and finding.evidence["found"] == 7
    assert "7 GPUs visible to NVML, 8 expected" in finding.message


def test_count_skips_without_expectation_and_passes_when_equal():
    facts = node(*[gpu(i) for i in range(7)])
    assert gpu_count.gpu_count(default_input(nvml=facts)) == []
    assert gpu_count.gpu_count(default_input(nvml=facts, expected={"gpus": 7})) == []


def test_count_is_not_judged_when_nvml_did_not_answer():
    assert gpu_count.gpu_count(default_input(nvml=NvmlFacts(status="timeout"), expected={"gpus": 8})) == []


def test_model_mismatch_warns():
    facts = node(gpu(0, name="NVIDIA A100-SXM4-80GB"), gpu(1))
    [finding] = gpu_count.gpu_model(default_input(nvml=facts, expected={"gpu_model": "H100"}))
    assert finding.gpu == 0 and finding.status == "warn"


def test_lost_gpu_fails_and_judges_without_expectation():
    facts = node(gpu(0), gpu(3, uuid=None, pci_bus_id=None, name=None, state="lost", error="GPU is lost"))
    [finding] = gpu_count.gpu_lost(default_input(nvml=facts))
    assert (finding.check, finding.gpu, finding.status, finding.action) == ("gpu.lost", 3, "fail", "drain")


def test_lost_gpu_outside_the_jobs_gpus_is_not_the_prologs_business():
    facts = node(gpu(0), gpu(3, state="lost"))
    assert gpu_count.gpu_lost(default_input(nvml=facts, gpus=frozenset({0}))) == []


# -- ECC ----------------------------------------------------------------------------------------------
def test_ecc_disabled_fails_and_pending_disable_warns():
    facts = node(gpu(0, ecc_mode=[0, 0]), gpu(1, ecc_mode=[1, 0]), gpu(2, ecc_mode=[1, 1]), gpu(3, ecc_mode=None))
    findings = gpu_ecc.ecc_mode(default_input(nvml=facts))
    assert [(f.gpu, f.status) for f in findings] == [(0, "fail"), (1, "warn")]


def test_volatile_double_bit_errors_drain():
    facts = node(gpu(0, ecc={"volatile_uncorrected": 0, "aggregate_uncorrected": 0}),
                 gpu(1, ecc={"volatile_uncorrected": 2, "aggregate_uncorrected": 2},
                     remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": 1, "failure": 0}))
    [finding] = gpu_ecc.ecc_uncorrectable(default_input(nvml=facts))
    assert (finding.gpu, finding.status, finding.action) == (1, "fail", "drain")
    assert finding.evidence["volatile_uncorrected"] == 2


def test_lifetime_double_bit_errors_count_only_without_row_remapping():
    old = gpu(0, ecc={"volatile_uncorrected": 0, "aggregate_uncorrected": 1})     # pre-Ampere
    remapped = gpu(1, ecc={"volatile_uncorrected": 0, "aggregate_uncorrected": 1},
                   remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": 0, "failure": 0})
    [finding] = gpu_ecc.ecc_uncorrectable(default_input(nvml=node(old, remapped)))
    assert finding.gpu == 0 and "lifetime" in finding.message


def test_uncorrectable_threshold_comes_from_config():
    facts = node(gpu(0, ecc={"volatile_uncorrected": 2}))
    inp = default_input(nvml=facts)
    inp.thresholds = dict(inp.thresholds, ecc_uncorrectable_volatile_max=5)
    assert gpu_ecc.ecc_uncorrectable(inp) == []


def test_correctable_rate_first_run_is_a_baseline():
    facts = node(gpu(0, ecc={"volatile_corrected": 50000}))
    assert gpu_ecc.ecc_correctable_rate(default_input(nvml=facts, now=1000.0)) == []


def test_correctable_rate_fires_only_above_the_threshold():
    key = "gpu/GPU-test-0/ecc.volatile_corrected"
    history = {key: [[0.0, 100.0]]}
    slow = default_input(nvml=node(gpu(0, ecc={"volatile_corrected": 600})), history=history, now=3600.0)
    assert gpu_ecc.ecc_correctable_rate(slow) == []
    fast = default_input(nvml=node(gpu(0, ecc={"volatile_corrected": 5100})), history=history, now=3600.0)
    [finding] = gpu_ecc.ecc_correctable_rate(fast)
    assert finding.status == "fail" and finding.evidence["growth"] == 5000


def test_correctable_samples_name_gpus_by_uuid():
    samples = gpu_ecc.ecc_correctable_samples(default_input(nvml=node(gpu(0, ecc={"volatile_corrected": 7}))))
    assert samples == {"gpu/GPU-test-0/ecc.volatile_corrected": (7, 86400.0)}


# -- the driver's recovery action -----------------------------------------------------------------------
def test_a_recovery_action_drains_naming_what_the_driver_asks_for_and_none_or_unknown_drains_nothing():
    inp = default_input(nvml=node(gpu(0), gpu(1, recovery_action=0), gpu(2, recovery_action=2),
                                  gpu(3, recovery_action=4), gpu(4, recovery_action=9),
                                  gpu(5, recovery_action=2, state="lost")))
    found = gpu_recovery.recovery_action(inp)
    assert [(f.check, f.gpu, f.status, f.action, f.evidence["recovery_action"], f.evidence["xid_action"])
            for f in found] == [("gpu.recovery_action", 2, "fail", "drain", "reboot", "reboot"),
                                ("gpu.recovery_action", 3, "fail", "drain", "drain_and_reset", "reset_gpu"),
                                ("gpu.recovery_action", 4, "fail", "drain", "unknown (9)", "contact_support")]
    assert "asks for recovery action reboot (Node Reboot" in found[0].message


def test_a_recovery_action_finding_becomes_a_reason_that_names_the_action():
    from healthcheck.actions.cause import reason_for
    from healthcheck.drain_reason import format_reason

    [finding] = gpu_recovery.recovery_action(default_input(nvml=node(gpu(6, recovery_action=1))))
    assert format_reason(reason_for(finding), "gpu-hooks:", 120).startswith("gpu-hooks: v1 gpu.recovery_action gpu6 action:reset; ")


# -- row remapping, retired pages ------------------------------------------------------------------------
def test_remap_pending_and_failed_are_separate_findings():
    rows = {"correctable": 0, "uncorrectable": 3, "pending": 1, "failure": 1}
    inp = default_input(nvml=node(gpu(0), gpu(1, remapped_rows=rows)))
    assert [(f.check, f.gpu) for f in gpu_remap.remap_pending(inp)] == [("gpu.remap.pending", 1)]
    assert [(f.check, f.gpu) for f in gpu_remap.remap_failed(inp)] == [("gpu.remap.failed", 1)]
    assert "replac" in gpu_remap.remap_failed(inp)[0].message


def test_retired_pages_pending():
    inp = default_input(nvml=node(gpu(0, retired_pages_pending=False), gpu(1, retired_pages_pending=True),
                                  gpu(2, retired_pages_pending=None)))
    assert [f.gpu for f in gpu_remap.retired_pages_pending(inp)] == [1]


# -- temperature, clocks, power, PCIe, processes -------------------------------------------------------------
def test_temperature_warns_near_and_fails_at_slowdown():
    facts = node(gpu(0, temperature_c=70, temperature_slowdown_c=87),
                 gpu(1, temperature_c=83, temperature_slowdown_c=87),
                 gpu(2, temperature_c=88, temperature_slowdown_c=87))
    findings = gpu_thermal.temperature(default_input(nvml=facts))
    assert [(f.gpu, f.status, f.action) for f in findings] == [(1, "warn", "warn"), (2, "fail", "warn")]


def test_clock_events_flags_only_hardware_reasons():
    facts = node(gpu(0, clock_event_reasons=0x1 | 0x4 | 0x20),     # idle, SW power cap, SW thermal
                 gpu(1, clock_event_reasons=0x8),
                 gpu(2, clock_event_reasons=0x40 | 0x80))
    findings = gpu_thermal.clock_events(default_input(nvml=facts))
    assert [(f.gpu, f.evidence["active"]) for f in findings] == [
        (1, ["HW slowdown"]), (2, ["HW thermal slowdown", "HW power brake"])]


def test_power_limit_below_expected_warns_and_needs_expectation():
    facts = node(gpu(0, power_limit_w=700.0), gpu(1, power_limit_w=500.0), gpu(2, power_limit_w=690.0))
    findings = gpu_power.power_limit(default_input(nvml=facts, expected={"power_limit_w": 700}))
    assert [(f.gpu, f.status) for f in findings] == [(1, "warn")]
    assert gpu_power.power_limit(default_input(nvml=facts)) == []


def test_pcie_width_always_judged_generation_only_when_busy():
    busy, idle = 0x0, 0x1
    facts = node(gpu(0, pcie={"gen": 5, "gen_max": 5, "width": 8, "width_max": 16}, clock_event_reasons=idle),
                 gpu(1, pcie={"gen": 1, "gen_max": 5, "width": 16, "width_max": 16}, clock_event_reasons=idle),
                 gpu(2, pcie={"gen": 3, "gen_max": 5, "width": 16, "width_max": 16}, clock_event_reasons=busy))
    findings = gpu_pcie.pcie_link(default_input(nvml=facts))
    assert [(f.gpu, f.status) for f in findings] == [(0, "warn"), (2, "warn")]
    assert "x8 instead of x16" in findings[0].message and "Gen3 instead of Gen5" in findings[1].message


def test_pcie_expected_values_override_the_maximum():
    facts = node(gpu(0, pcie={"gen": 4, "gen_max": 5, "width": 16, "width_max": 16}, clock_event_reasons=0))
    assert gpu_pcie.pcie_link(default_input(nvml=facts, expected={"pcie_gen": 4})) == []


def test_processes_holding_memory_fail_in_the_prolog():
    facts = node(gpu(0, processes=[]), gpu(1, processes=[{"pid": 4242, "used_memory_mib": 1024},
                                                          {"pid": 4243, "used_memory_mib": None}]))
    [finding] = gpu_processes.stray_processes(default_input(nvml=facts, tier="prolog"))
    assert (finding.gpu, finding.status, finding.action) == (1, "fail", "drain")
    assert "2 compute processes holding 1024 MiB before the job starts" in finding.message
    assert "4242, 4243" in finding.message


def test_processes_are_judged_only_on_the_jobs_gpus():
    facts = node(gpu(0, processes=[]), gpu(1, processes=[{"pid": 1, "used_memory_mib": 10}]))
    assert gpu_processes.stray_processes(default_input(nvml=facts, gpus=frozenset({0}))) == []


def test_hung_and_lost_gpus_are_not_judged_on_stale_facts():
    facts = node(gpu(0, state="hang", temperature_c=99, temperature_slowdown_c=87),
                 gpu(1, state="lost", ecc={"volatile_uncorrected": 9}))
    inp = default_input(nvml=facts)
    assert gpu_thermal.temperature(inp) == [] and gpu_ecc.ecc_uncorrectable(inp) == []
