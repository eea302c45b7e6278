"""NVLink, fabric, InfiniBand/RoCE, DCGM and probe-health checks on hand-made facts."""
from __future__ import annotations

from healthcheck.checks import dcgm, fabric, ib_counters, ib_ports, nvlink, probe_health, roce_gid
from healthcheck.facts import DcgmFacts, DcgmTestResult, GpuFacts, IbFacts, IbPortFacts, NvmlFacts

from .checks_support import default_input


def gpu(index=0, **facts):
    facts.setdefault("uuid", f"GPU-test-{index}")
    facts.setdefault("pci_bus_id", f"00000000:{0x18 + index:02X}:00.0")
    return GpuFacts(index=index, **facts)


def nvml_of(*gpus):
    return NvmlFacts(gpus=list(gpus), device_count=len(gpus), timeout_s=5.0)


def links(count, down=()):
    return {link: 0 if link in down else 1 for link in range(count)}


def port(hca="mlx5_0", number=1, **facts):
    values = dict(state=4, state_text="ACTIVE", phys_state=5, phys_state_text="LinkUp", rate_gbps=400.0,
                  rate_text="400 Gb/sec (4X NDR)", link_layer="InfiniBand")
    values.update(facts)
    return IbPortFacts(hca=hca, port=number, **values)


NDR = {"ib_ports": ["mlx5_0:1", "mlx5_1:1"], "ib_rate_gbps": 400, "ib_link_layer": "InfiniBand"}


# -- nvlink.down -------------------------------------------------------------------------------------
def test_fewer_active_links_than_expected_fails_naming_the_links():
    facts = nvml_of(gpu(0, nvlink_states=links(18)), gpu(1, nvlink_states=links(18, down=(4, 5))))
    [finding] = nvlink.links_down(default_input(nvml=facts, expected={"nvlinks_per_gpu": 18}))
    assert (finding.gpu, finding.status, finding.action) == (1, "fail", "drain")
    assert "16 of 18 NVLinks active (link 4, 5 down)" in finding.message
    assert finding.evidence["down"] == [4, 5]


def test_pcie_node_expects_no_nvlink_and_raises_nothing():
    facts = nvml_of(gpu(0, nvlink_states=None, unsupported=["nvlink"]))
    assert nvlink.links_down(default_input(nvml=facts, expected={"nvlinks_per_gpu": 0})) == []
    assert nvlink.links_down(default_input(nvml=facts)) == []


def test_expected_nvlink_that_nvml_does_not_report_fails():
    facts = nvml_of(gpu(0, nvlink_states=None))
    [finding] = nvlink.links_down(default_input(nvml=facts, expected={"nvlinks_per_gpu": 12}))
    assert "no NVLink" in finding.message


def test_links_reported_down_fail_even_without_expectation():
    facts = nvml_of(gpu(0, nvlink_states=links(12, down=(3,))))
    [finding] = nvlink.links_down(default_input(nvml=facts))
    assert "NVLink 3 down" in finding.message


# -- nvlink.errors --------------------------------------------------------------------------------------
def test_nvlink_error_growth_over_threshold_warns_per_gpu():
    now = 10_000.0
    current = gpu(0, nvlink_states=links(18), nvlink_errors={2: {"replay": 900, "crc_flit": 60, "crc_data": 60},
                                                             3: {"replay": 5}})
    history = {"gpu/GPU-test-0/nvlink/2/replay": [[now - 600, 100]],
               "gpu/GPU-test-0/nvlink/2/crc_flit": [[now - 600, 0]],
               "gpu/GPU-test-0/nvlink/2/crc_data": [[now - 600, 0]],
               "gpu/GPU-test-0/nvlink/3/replay": [[now - 600, 0]]}
    [finding] = nvlink.link_errors(default_input(nvml=nvml_of(current), history=history, now=now))
    assert finding.status == "warn" and finding.action == "warn"
    over = {(o["link"], o["counter"]): o["growth"] for o in finding.evidence["over"]}
    assert over == {(2, "replay"): 800, (2, "crc"): 120}     # flit+data share the CRC budget


def test_nvlink_errors_first_run_is_a_baseline_and_samples_cover_every_counter():
    current = gpu(0, nvlink_errors={0: {"replay": 10_000, "recovery": 0}})
    inp = default_input(nvml=nvml_of(current), now=5.0)
    assert nvlink.link_errors(inp) == []
    assert set(nvlink.link_error_samples(inp)) == {"gpu/GPU-test-0/nvlink/0/replay",
                                                   "gpu/GPU-test-0/nvlink/0/recovery"}


# -- nvlink.fabric ----------------------------------------------------------------------------------------
def test_fabric_in_progress_fails_with_the_fabric_manager_hint():
    facts = nvml_of(gpu(0, fabric_state=3, fabric_status=0), gpu(1, fabric_state=2, fabric_status=0))
    [finding] = fabric.fabric_state(default_input(nvml=facts, expected={"nvswitch_fabric": True}))
    assert finding.gpu == 1 and "in progress" in finding.message and "fabricmanager" in finding.message


def test_fabric_completed_with_an_error_status_fails():
    facts = nvml_of(gpu(0, fabric_state=3, fabric_status=999))
    [finding] = fabric.fabric_state(default_input(nvml=facts))
    assert "999" in finding.message


def test_fabric_absent_where_expected_fails_and_is_fine_where_not():
    facts = nvml_of(gpu(0, fabric_state=None, unsupported=["fabric"]))
    assert len(fabric.fabric_state(default_input(nvml=facts, expected={"nvswitch_fabric": True}))) == 1
    assert fabric.fabric_state(default_input(nvml=facts)) == []
    stuck = nvml_of(gpu(0, fabric_state=1))
    assert fabric.fabric_state(default_input(nvml=stuck, expected={"nvswitch_fabric": False})) == []


# -- ib.port -------------------------------------------------------------------------------------------------
def test_one_bad_port_fails_although_the_others_are_fine():
    facts = IbFacts(ports=[port("mlx5_0"), port("mlx5_1", state=1, state_text="DOWN", phys_state=2,
                                                 phys_state_text="Polling")])
    [finding] = ib_ports.ib_port(default_input(ib=facts, expected=NDR))
    assert (finding.hca, finding.port, finding.status, finding.action) == ("mlx5_1", 1, "fail", "drain")
    assert "DOWN" in finding.message and "Polling" in finding.message


def test_missing_port_wrong_rate_and_wrong_link_layer():
    expected = dict(NDR, ib_ports=["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"])
    facts = IbFacts(ports=[port("mlx5_0", rate_gbps=200.0), port("mlx5_1", link_layer="Ethernet")])
    findings = ib_ports.ib_port(default_input(ib=facts, expected=expected))
    assert [(f.hca, f.port) for f in findings] == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1)]
    assert "rate 200 Gb/s, 400 expected" in findings[0].message
    assert "link layer Ethernet" in findings[1].message
    assert "missing" in findings[2].message and findings[2].evidence["present"] is False


def test_ports_are_not_judged_without_expectation():
    facts = IbFacts(ports=[port("mlx5_0", state=1, state_text="DOWN")])
    assert ib_ports.ib_port(default_input(ib=facts)) == []


# -- ib.counters -----------------------------------------------------------------------------------------------
def test_ib_counter_growth_over_window_warns_per_port():
    now = 7200.0
    good = port("mlx5_0", counters={"symbol_error": 3, "link_downed": 1})
    bad = port("mlx5_1", counters={"symbol_error": 80, "link_downed": 2, "port_rcv_errors": None})
    history = {"ib/mlx5_0:1/symbol_error": [[now - 60, 3]], "ib/mlx5_0:1/link_downed": [[now - 60, 1]],
               "ib/mlx5_1:1/symbol_error": [[now - 60, 20]], "ib/mlx5_1:1/link_downed": [[now - 60, 1]]}
    [finding] = ib_counters.ib_counters(default_input(ib=IbFacts(ports=[good, bad]), expected=NDR,
                                                      history=history, now=now))
    assert (finding.hca, finding.status) == ("mlx5_1", "warn")
    assert {o["counter"] for o in finding.evidence["over"]} == {"symbol_error", "link_downed"}


def test_ib_counter_samples_skip_unreadable_counters():
    facts = IbFacts(ports=[port("mlx5_0", counters={"symbol_error": 3, "port_rcv_errors": None})])
    assert ib_counters.ib_counter_samples(default_input(ib=facts)) == {"ib/mlx5_0:1/symbol_error": (3, 3600.0)}


# -- roce.gid ----------------------------------------------------------------------------------------------------
def test_roce_gid_index_must_be_v2():
    expected = {"ib_ports": ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"], "roce_gid_index": 3}
    facts = IbFacts(ports=[port("mlx5_0", link_layer="Ethernet", gid_types={1: "RoCE v2", 3: "RoCE v2"}),
                           port("mlx5_1", link_layer="Ethernet", gid_types={1: "RoCE v2", 3: "IB/RoCE v1"}),
                           port("mlx5_2", link_layer="Ethernet", gid_types={0: "IB/RoCE v1", 1: "RoCE v2"})])
    findings = roce_gid.roce_gid(default_input(ib=facts, expected=expected))
    assert [f.hca for f in findings] == ["mlx5_1", "mlx5_2"]
    assert "IB/RoCE v1" in findings[0].message and "no GID at index 3" in findings[1].message
    assert roce_gid.roce_gid(default_input(ib=facts, expected={"ib_ports": expected["ib_ports"]})) == []


# -- dcgm.diag -----------------------------------------------------------------------------------------------------
def test_dcgm_failures_become_one_finding_per_gpu():
    facts = DcgmFacts(level=1, results=[
        DcgmTestResult("Deployment", "Denylist", "pass", []),
        DcgmTestResult("Hardware", "Memory", "fail", [2], ["DBE detected"]),
        DcgmTestResult("Integration", "PCIe", "fail", [2]),
        DcgmTestResult("Hardware", "Memory", "skip", [3]),
    ])
    inp = default_input(dcgm=facts, nvml=nvml_of(gpu(0), gpu(1), gpu(2)))
    [finding] = dcgm.dcgm_diag(inp)
    assert (finding.gpu, finding.pci_bus_id, finding.status, finding.action) == (2, "00000000:1A:00.0", "fail", "drain")
    assert "failed Memory, PCIe: DBE detected" in finding.message


def test_dcgm_not_installed_is_silent_and_failure_to_run_is_an_error():
    assert dcgm.dcgm_diag(default_input(dcgm=DcgmFacts(status="not_installed"))) == []
    [finding] = dcgm.dcgm_diag(default_input(dcgm=DcgmFacts(status="error", message="dcgmi diag exited 1")))
    assert finding.status == "error"


# -- probe.timeout / probe.error ----------------------------------------------------------------------------------
def test_nvml_timeout_is_a_finding_that_names_the_deadline():
    [finding] = probe_health.probe_findings(default_input(nvml=NvmlFacts(status="timeout", timeout_s=5.0)))
    assert (finding.check, finding.status, finding.action) == ("probe.timeout", "error", "drain")
    assert finding.message == "NVML did not answer within 5 s"


def test_a_hung_gpu_is_named():
    facts = nvml_of(gpu(0), gpu(5, state="hang"))
    [finding] = probe_health.probe_findings(default_input(nvml=facts))
    assert finding.gpu == 5 and "did not answer NVML within 5 s" in finding.message


def test_ib_and_dcgm_timeouts_and_probe_errors():
    findings = probe_health.probe_findings(default_input(
        ib=IbFacts(status="timeout", timeout_s=2.0), dcgm=DcgmFacts(status="timeout", message="slow", level=2),
        nvml=NvmlFacts(status="crashed", message="boom")))
    assert [(f.check, f.action) for f in findings] == [("probe.error", "none"), ("probe.timeout", "drain"),
                                                       ("probe.timeout", "drain")]
