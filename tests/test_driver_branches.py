"""Driver branches on the simulator: a profile's driver_version decides which NVML functions
exist (healthcheck/data/nvml-functions.tsv), and the probe degrades instead of draining."""
from __future__ import annotations

import os
import types

import pynvml
import pytest

from healthcheck import driver_support
from healthcheck.probes.nvml import gather_gpu, probe_nvml
from healthcheck.runner import run_checks
from healthcheck.sim import sim_pynvml as sim_nvml
from healthcheck.sim.node import SimNode

from .checks_support import ALL_SIM_CHECKS, HARDWARE, make_config, sim
from .conftest import SIM_PROFILES

H100 = os.path.join(SIM_PROFILES, "h100-healthy.toml")
DRIVERS = {"R470": "470.256.02", "R525": "525.147.05", "R535": "535.161.08", "R550": "550.90.07"}


def h100_on(tmp_path, driver: str, *more):
    sources = sim(tmp_path, H100)
    SimNode(str(tmp_path), "n1").inject([("node.driver_version", driver), *more])
    return sources


# -- the table ------------------------------------------------------------------------------------
@pytest.mark.parametrize("version,branch", [("470.256.02", "R470"), ("535.161.08", "R535"),
                                            ("545.23.08", "R535"), ("550.90.07", "R550"),
                                            ("580.65.06", "R580"), ("450.80.02", "R470")])
def test_branch_of_a_driver_version(version, branch):
    assert driver_support.branch_of(version) == branch


def test_the_table_says_which_branch_first_exports_each_function():
    table = driver_support.functions()
    assert table["nvmlDeviceGetGpuFabricInfoV"].since == "R550"
    assert table["nvmlDeviceGetGpuFabricInfo"].since == "R525"
    assert table["nvmlDeviceGetCurrentClocksEventReasons"].since == "R535"
    assert table["nvmlDeviceGetComputeRunningProcesses_v3"].since == "R525"
    assert all(entry.source for entry in table.values())
    r535 = driver_support.exports("R535")
    assert "nvmlDeviceGetGpuFabricInfo" in r535 and "nvmlDeviceGetGpuFabricInfoV" not in r535
    assert driver_support.exports("R470") < r535 < driver_support.exports("R580")


def test_a_bad_driver_version_in_a_profile_is_rejected(tmp_path):
    sim(tmp_path, H100)
    with pytest.raises(Exception, match="not a driver version"):
        SimNode(str(tmp_path), "n1").inject([("node.driver_version", "latest")])


# -- the simulator acts like the branch ------------------------------------------------------------
def test_simulator_raises_function_not_found_for_what_the_branch_lacks(tmp_path):
    sources = h100_on(tmp_path, DRIVERS["R535"])
    nvml = sources.nvml
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            nvml.nvmlDeviceGetGpuFabricInfoV(handle, pynvml.c_nvmlGpuFabricInfoV_t())
        info = pynvml.c_nvmlGpuFabricInfo_t()
        nvml.nvmlDeviceGetGpuFabricInfo(handle, info)
        assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    finally:
        nvml.nvmlShutdown()


def test_simulator_on_r470_raises_what_pynvml_raises_for_running_processes(tmp_path):
    sources = h100_on(tmp_path, DRIVERS["R470"])
    nvml = sources.nvml
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLLibraryMismatchError):
            nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        assert nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle) == []
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            nvml.nvmlDeviceGetGpuFabricInfo(handle, pynvml.c_nvmlGpuFabricInfo_t())
    finally:
        nvml.nvmlShutdown()


# -- the probe degrades ----------------------------------------------------------------------------
@pytest.mark.parametrize("branch", sorted(DRIVERS))
def test_healthy_h100_checks_ok_on_every_branch(tmp_path, branch):
    cfg = make_config(hardware=HARDWARE["H100"], tiers={"health": ALL_SIM_CHECKS})
    report = run_checks(cfg, "n1", "health", sources=h100_on(tmp_path, DRIVERS[branch]))
    assert report.status == "ok", [f"{f.check}: {f.message}" for f in report.findings]
    assert report.action == "none"


@pytest.mark.parametrize("branch,fabric,missing", [
    ("R550", 3, {}),
    ("R535", 3, {}),                # v1 fallback
    ("R525", 3, {}),
    ("R470", None, {"fabric": "nvmlDeviceGetGpuFabricInfoV, nvmlDeviceGetGpuFabricInfo"}),
])
def test_fabric_falls_back_to_v1_then_to_unsupported(tmp_path, branch, fabric, missing):
    facts = probe_nvml(h100_on(tmp_path, DRIVERS[branch]).nvml, 5.0)
    gpu = facts.gpus[0]
    assert (gpu.state, gpu.fabric_state) == ("ok", fabric)
    assert {k: v for k, v in gpu.driver_missing.items() if k == "fabric"} == missing
    assert gpu.errors == {}


@pytest.mark.parametrize("branch", ["R470", "R525"])
def test_clock_reasons_fall_back_to_the_throttle_call(tmp_path, branch):
    sources = h100_on(tmp_path, DRIVERS[branch], ("gpu.2.clock_event_reasons", 0x40))
    facts = probe_nvml(sources.nvml, 5.0)
    assert facts.gpus[2].clock_event_reasons == 0x40 and "clock_event_reasons" not in facts.gpus[2].driver_missing
    report = run_checks(make_config(hardware=HARDWARE["H100"]), "n1", "health", sources=sources)
    assert [(f.check, f.gpu) for f in report.findings] == [("gpu.clock_events", 2)]


def test_running_processes_on_r470_come_from_the_v2_call(tmp_path):
    facts = probe_nvml(h100_on(tmp_path, DRIVERS["R470"], ("gpu.1.processes", [{"pid": 77, "used_memory_mib": 900}])).nvml, 5.0)
    assert facts.gpus[1].processes == [{"pid": 77, "used_memory_mib": 900}]


def test_library_mismatch_loses_only_its_fact(tmp_path):
    """Bindings without a _v2 call: NVMLLibraryMismatchError (not an NVMLError) costs the
    process list of that GPU, nothing else."""
    h100_on(tmp_path, DRIVERS["R470"])
    sim_nvml._bind(os.path.join(str(tmp_path), "sim", "n1", "profile.toml"))
    without_v2 = types.SimpleNamespace(**{name: getattr(sim_nvml, name) for name in dir(sim_nvml)
                                          if name != "nvmlDeviceGetComputeRunningProcesses_v2"})
    sim_nvml.nvmlInit()
    try:
        gpu = gather_gpu(without_v2, 0, frozenset({"processes", "ecc", "thermal", "nvlink"}))
    finally:
        sim_nvml.nvmlShutdown()
    assert gpu.state == "ok" and gpu.processes is None and gpu.errors == {}
    assert gpu.driver_missing == {"processes": "nvmlDeviceGetComputeRunningProcesses"}
    assert "processes" in gpu.unsupported
    assert gpu.ecc["volatile_uncorrected"] == 0 and gpu.temperature_c == 33 and len(gpu.nvlink_states) == 18


def test_a_fact_the_config_requires_fails_on_a_driver_without_it(tmp_path):
    hardware = dict(HARDWARE["H100"], nvml_required=["fabric"])
    cfg = make_config(hardware=hardware)
    report = run_checks(cfg, "n1", "health", sources=h100_on(tmp_path, DRIVERS["R470"]))
    assert {(f.check, f.status) for f in report.findings} == {("gpu.nvml", "fail")}
    assert len(report.findings) == 8 and report.action == "drain"
    assert "driver 470.256.02 cannot report fabric" in report.findings[0].message
    on_r535 = run_checks(cfg, "n1", "health", sources=h100_on(tmp_path / "b", DRIVERS["R535"]))
    assert on_r535.findings == []


def test_nvml_required_names_only_driver_facts():
    with pytest.raises(Exception, match="nvml_required"):
        make_config(hardware=dict(HARDWARE["H100"], nvml_required=["colour"]))


# -- failure shapes ---------------------------------------------------------------------------------
def test_handle_failing_with_unknown_error_is_a_lost_gpu(tmp_path):
    cfg = make_config(hardware=HARDWARE["H100"])
    report = run_checks(cfg, "n1", "health", sources=sim(tmp_path, os.path.join(SIM_PROFILES, "h100-gpu-unknown-error.toml")))
    by_check = {f.check: f for f in report.findings}
    assert sorted(by_check) == ["gpu.lost", "kernel.xid"] and len(report.findings) == 2
    lost = by_check["gpu.lost"]
    assert (lost.gpu, lost.status, lost.action) == (3, "fail", "drain") and "Unknown Error" in lost.message
    # The driver's three-line message names the same GPU by its address.
    assert by_check["kernel.xid"].pci_bus_id == "0000:5d:00" and by_check["kernel.xid"].action == "drain"


def test_pcie_cards_with_every_link_down_are_judged_by_the_expectation(tmp_path):
    path = os.path.join(SIM_PROFILES, "a100-pcie-no-bridge.toml")
    quiet = run_checks(make_config(hardware=HARDWARE["A100 80GB PCIe"]), "n1", "health",
                       sources=sim(tmp_path / "a", path))
    assert quiet.findings == []
    expecting = run_checks(make_config(hardware=dict(HARDWARE["A100 80GB PCIe"], nvlinks_per_gpu=12)), "n1",
                           "health", sources=sim(tmp_path / "b", path))
    assert {(f.check, f.gpu) for f in expecting.findings} == {("nvlink.down", i) for i in range(4)}


def test_some_links_down_without_expectation_is_still_a_fault(tmp_path):
    sources = sim(tmp_path, os.path.join(SIM_PROFILES, "a100-pcie-no-bridge.toml"))
    SimNode(str(tmp_path), "n1").inject([("gpu.1.nvlink.down", [3, 4])])
    report = run_checks(make_config(hardware=HARDWARE["A100 80GB PCIe"]), "n1", "health", sources=sources)
    assert [(f.check, f.gpu) for f in report.findings] == [("nvlink.down", 1)]


# -- InfiniBand counters stop at their kernel width ------------------------------------------------
def test_simulator_holds_ib_counters_to_their_kernel_width(tmp_path):
    sim(tmp_path, H100)
    SimNode(str(tmp_path), "n1").inject([("ib.mlx5_0:1.counters.symbol_error", 70000),
                                        ("ib.mlx5_0:1.counters.link_downed", 300),
                                        ("ib.mlx5_0:1.counters.local_link_integrity_errors", 16),
                                        ("ib.mlx5_0:1.counters.port_xmit_discards", 70000)])
    counters = tmp_path / "sim" / "n1" / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    read = {name: (counters / name).read_text().strip() for name in
            ("symbol_error", "link_downed", "local_link_integrity_errors", "port_xmit_discards")}
    assert read == {"symbol_error": "65535", "link_downed": "255", "local_link_integrity_errors": "15",
                    "port_xmit_discards": "70000"}


def test_a_saturated_counter_is_reported_never_read_as_no_growth(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=HARDWARE["H100"], state_dir=str(state))
    path = os.path.join(SIM_PROFILES, "h100-ib-counter-saturated.toml")
    for now in (1_000_000.0, 1_000_600.0):     # first run (no history) and a later one (flat at the top)
        report = run_checks(cfg, "n1", "health", sources=sim(state, path), now=now)
        [finding] = report.findings
        assert (finding.check, finding.hca, finding.status) == ("ib.counters", "mlx5_3", "warn")
        assert finding.evidence["saturated"] == [{"counter": "symbol_error", "value": 65535, "max": 65535}]
        assert "saturated" in finding.message and finding.evidence["over"] == []


@pytest.mark.parametrize("counter,top", [("link_downed", 255), ("excessive_buffer_overrun_errors", 15)])
def test_narrow_counters_saturate_at_their_width(tmp_path, counter, top):
    sources = sim(tmp_path, H100)
    SimNode(str(tmp_path), "n1").inject([(f"ib.mlx5_1:1.counters.{counter}", top)])
    report = run_checks(make_config(hardware=HARDWARE["H100"]), "n1", "health", sources=sources)
    assert [(f.check, f.hca, f.evidence["saturated"][0]["counter"]) for f in report.findings] == \
        [("ib.counters", "mlx5_1", counter)]
