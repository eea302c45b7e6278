"""The NVML probe on the simulator: the same code that reads pynvml on a real node."""
from __future__ import annotations

import types

import pynvml
import pytest

from healthcheck.facts import NVML_READ_GROUPS
from healthcheck.probes.nvml import assemble, gather_gpu, probe_nvml
from healthcheck.sim.node import SimNode

from .checks_support import sim


def probe(tmp_path, profile, **kwargs):
    sources = sim(tmp_path, profile)
    kwargs.setdefault("timeout_s", 5.0)
    return probe_nvml(sources.nvml, **kwargs)


def test_healthy_h100_facts(tmp_path):
    facts = probe(tmp_path, "h100-healthy.toml")
    assert (facts.status, facts.device_count, facts.driver_version) == ("ok", 8, "570.133.20")
    first = facts.gpus[0]
    assert (first.index, first.name, first.pci_bus_id) == (0, "NVIDIA H100 80GB HBM3", "00000000:18:00.0")
    assert first.uuid.startswith("GPU-") and first.state == "ok"
    assert len(first.nvlink_states) == 18 and set(first.nvlink_states.values()) == {1}
    assert first.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and first.fabric_status == 0
    assert first.ecc_mode == [1, 1] and first.ecc["volatile_uncorrected"] == 0
    assert first.remapped_rows == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}
    assert first.retired_pages_pending is None and "retired_pages" in first.unsupported
    assert first.power_limit_w == 700.0 and first.temperature_slowdown_c == 87
    assert first.pcie == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16}
    assert first.processes == [] and first.errors == {}
    assert set(first.nvlink_errors[0]) == {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"}


def test_pcie_l40s_has_no_nvlink_and_no_fabric(tmp_path):
    facts = probe(tmp_path, "pcie-l40s-healthy.toml")
    assert facts.device_count == 4
    for gpu in facts.gpus:
        assert gpu.nvlink_states is None and gpu.fabric_state is None
        assert {"nvlink", "fabric"} <= set(gpu.unsupported)


def test_v100_has_retired_pages_and_no_row_remapper(tmp_path):
    gpu = probe(tmp_path, "v100-healthy.toml").gpus[0]
    assert gpu.retired_pages_pending is False and gpu.remapped_rows is None
    assert len(gpu.nvlink_states) == 6


def test_lost_gpu_is_marked_and_the_others_are_read(tmp_path):
    facts = probe(tmp_path, "h100-xid79-gpu-lost.toml")
    states = [g.state for g in facts.gpus]
    assert states == ["ok", "ok", "ok", "lost", "ok", "ok", "ok", "ok"]
    assert facts.gpus[3].error == "GPU is lost" and facts.gpus[4].temperature_c is not None


@pytest.mark.parametrize("mode,status", [("missing", "library_not_found"), ("driver_not_loaded", "driver_not_loaded")])
def test_nvml_that_cannot_start(tmp_path, mode, status):
    sources = sim(tmp_path, "h100-healthy.toml")
    SimNode(str(tmp_path), "n1").inject([("node.nvml", mode)])
    facts = probe_nvml(sources.nvml, 5.0)
    assert facts.status == status and facts.gpus == []


def test_only_the_wanted_features_and_gpus_are_read(tmp_path):
    facts = probe(tmp_path, "h100-healthy.toml", features={"ecc"}, gpus=[1, 6])
    assert [g.index for g in facts.gpus] == [1, 6] and facts.device_count == 8
    assert facts.gpus[0].ecc and facts.gpus[0].temperature_c is None and facts.gpus[0].nvlink_states is None


def test_absent_gpu_is_not_enumerated(tmp_path):
    facts = probe(tmp_path, "h100-gpu-missing.toml")
    assert facts.device_count == 7 and "00000000:BA:00.0" not in [g.pci_bus_id for g in facts.gpus]


def test_bus_id_as_bytes_is_decoded():
    """Older bindings hand back ctypes char arrays as bytes."""
    info = types.SimpleNamespace(busId=b"00000000:3B:00.0")
    fake = types.SimpleNamespace(
        nvmlDeviceGetHandleByIndex=lambda i: object(),
        nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetUUID=lambda h: b"GPU-1",
        nvmlDeviceGetPciInfo=lambda h: info, nvmlDeviceGetMinorNumber=lambda h: 3,
    )
    gpu = gather_gpu(fake, 0, frozenset())
    assert (gpu.pci_bus_id, gpu.name, gpu.uuid) == ("00000000:3B:00.0", "NVIDIA A100-SXM4-80GB", "GPU-1")
    assert gpu.minor_number == 3


def test_unexpected_nvml_errors_are_kept_per_feature():
    def unknown(*args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake = types.SimpleNamespace(
        nvmlDeviceGetHandleByIndex=lambda i: object(), nvmlDeviceGetName=lambda h: "x",
        nvmlDeviceGetUUID=lambda h: "GPU-1", nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId="0:1:0.0"),
        nvmlDeviceGetMinorNumber=lambda h: 0, nvmlDeviceGetPowerUsage=unknown, nvmlDeviceGetEnforcedPowerLimit=lambda h: 400000,
    )
    gpu = gather_gpu(fake, 0, frozenset({"power"}))
    assert gpu.state == "ok" and gpu.power_limit_w == 400.0 and gpu.power_w is None
    assert gpu.errors == {"power": "Unknown Error"}


def test_assemble_marks_gpus_that_never_reported_as_hung():
    records = [("node", {"status": "ok", "device_count": 3, "probed": [0, 1, 2]}),
               ("identity", {"index": 2, "uuid": "GPU-2", "pci_bus_id": "00000000:3A:00.0", "name": "x"})]
    facts = assemble(records, timed_out=True, error=None, timeout_s=5.0)
    assert [(g.index, g.state, g.pci_bus_id) for g in facts.gpus] == [
        (0, "hang", None), (1, "hang", None), (2, "hang", "00000000:3A:00.0")]
    assert assemble([], timed_out=True, error=None, timeout_s=5.0).status == "timeout"


def test_all_features_are_known_to_the_probe():
    assert set(NVML_READ_GROUPS) == {"ecc", "remap", "retired_pages", "thermal", "power", "clocks", "pcie",
                                  "nvlink", "nvlink_errors", "fabric", "processes", "recovery", "c2c"}


def test_a_binding_that_cannot_be_imported_is_the_probes_error_not_a_drain():
    """NodeSources.nvml is imported in the probe's child (sources.LazyModule): when that import
    fails, the probe says so (probe.error, whose action is none) and nothing drains."""
    from healthcheck.checks.probe_health import probe_findings
    from healthcheck.sources import LazyModule

    from .checks_support import default_input

    def broken():
        raise ImportError("No module named 'pynvml'")

    facts = probe_nvml(LazyModule(broken), 5.0)
    assert facts.status == "crashed" and "No module named 'pynvml'" in facts.message
    [finding] = probe_findings(default_input(nvml=facts))
    assert (finding.check, finding.status, finding.action) == ("probe.error", "error", "none")


# -- fabric info v3 (B200, GB200 NVL72) and IMEX ---------------------------------------------------
def test_the_v3_fabric_structure_is_pynvmls_layout_with_a_one_byte_state():
    import ctypes

    from healthcheck.probes.nvml_structs import FabricInfoV3

    theirs = pynvml.c_nvmlGpuFabricInfo_v3_t
    assert FabricInfoV3().version == pynvml.nvmlGpuFabricInfo_v3 == 0x3000028
    assert ctypes.sizeof(FabricInfoV3) == ctypes.sizeof(theirs)
    assert [name for name, _ in FabricInfoV3._fields_] == [name for name, _ in theirs._fields_]
    assert {name: getattr(FabricInfoV3, name).offset for name, _ in FabricInfoV3._fields_} == \
        {name: getattr(theirs, name).offset for name, _ in theirs._fields_}
    assert FabricInfoV3.state.size == 1 and FabricInfoV3.healthSummary.size == 1


def test_the_health_mask_decodes_with_pynvmls_shifts_and_widths():
    from healthcheck.facts import FABRIC_HEALTH_MASK_FIELDS, FABRIC_HEALTH_SUMMARIES, fabric_health_fields

    for name, (shift, width) in FABRIC_HEALTH_MASK_FIELDS.items():
        constant = name.upper()
        assert getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{constant}") == shift, name
        assert getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{constant}") == width, name
    assert FABRIC_HEALTH_SUMMARIES[pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY] == "limited capacity"
    # 0xaa: every 2-bit field reads FALSE (2), the nccl#2186 mask: nothing is wrong in it
    fields = fabric_health_fields(0xaa)
    assert {fields[n] for n in ("degraded_bw", "route_recovery", "route_unhealthy", "access_timeout_recovery")} == \
        {pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE}
    assert fabric_health_fields(0x5aa)["incorrect_configuration"] == \
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS


def test_gb200_fabric_facts_come_from_the_v3_call_and_a_single_box_has_no_domain(tmp_path):
    import os

    from .conftest import SIM_PROFILES

    gb200 = probe_nvml(sim(tmp_path / "a", os.path.join(SIM_PROFILES, "gb200-fabric-limited-capacity.toml")).nvml,
                       10.0, features=["fabric"])
    assert [(g.fabric_health_summary, g.fabric_health_mask, g.fabric_clique_id) for g in gb200.gpus] == \
        [(1, 0, 32766), (1, 0, 32766), (3, 0, 32766), (1, 0, 32766)]
    assert {g.fabric_cluster_uuid for g in gb200.gpus} == {"6b1d3c2e-9f4a-4e1b-8c7d-2a5f0e9b7c31"}
    h100 = probe_nvml(sim(tmp_path / "b", os.path.join(SIM_PROFILES, "h100-healthy.toml")).nvml, 10.0,
                      features=["fabric"]).gpus[0]
    assert (h100.fabric_cluster_uuid, h100.fabric_clique_id) == ("00000000-0000-0000-0000-000000000000", 0)
    assert h100.fabric_health_summary == 0 and h100.driver_missing == {}   # R570: v3 read, nothing reported


def test_the_imex_probe_reads_the_daemon_and_the_channel_names(tmp_path):
    from healthcheck.probes.imex import probe_imex

    dev, bin_dir = tmp_path / "dev", tmp_path / "bin"
    (dev / "nvidia-caps-imex-channels").mkdir(parents=True)
    for name in ("channel0", "channel12", "channelx", ".hidden", "channel"):
        (dev / "nvidia-caps-imex-channels" / name).write_text("")
    bin_dir.mkdir()
    assert probe_imex(str(dev), 5.0, str(bin_dir)).status == "not_installed"
    ctl = bin_dir / "nvidia-imex-ctl"
    ctl.write_text("#!/bin/sh\n[ \"$1\" = -q ] && echo WAITING_FOR_PEERS\n")
    ctl.chmod(0o755)
    facts = probe_imex(str(dev), 5.0, str(bin_dir))
    assert (facts.status, facts.daemon, facts.channels) == ("ok", "WAITING_FOR_PEERS", [0, 12])
    ctl.write_text("#!/bin/sh\necho 'nvidia-imex-ctl: cannot connect' >&2\nexit 1\n")
    failed = probe_imex(str(tmp_path / "nodev"), 5.0, str(bin_dir))
    assert (failed.status, failed.daemon, failed.channels) == ("error", None, [])
    assert "cannot connect" in failed.message


def _slow_driver(delay_of):
    """A driver whose GPU i takes ``delay_of(i)`` seconds to give its handle (None: never)."""
    import threading
    import time

    never = threading.Event()

    def handle(index):
        delay = delay_of(index)
        if delay is None:
            never.wait(30)
        else:
            time.sleep(delay)
        return index

    return types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "570.133.20",
        nvmlDeviceGetCount=lambda: 4, nvmlDeviceGetHandleByIndex=handle, nvmlDeviceGetName=lambda h: "x",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}", nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"0:{h}:0.0"),
        nvmlDeviceGetMinorNumber=lambda h: h)


def test_last_answer_says_when_the_slowest_gpu_that_answered_did():
    facts = probe_nvml(_slow_driver(lambda i: None if i == 3 else 0.0), timeout_s=1.0, features=())
    assert [g.state for g in facts.gpus] == ["ok", "ok", "ok", "hang"]
    assert facts.last_answer_s is not None and facts.last_answer_s < 0.5

    # siblings that answer one after another until the deadline: a slow host
    facts = probe_nvml(_slow_driver(lambda i: 0.35 * (i + 1)), timeout_s=1.0, features=())
    assert [g.state for g in facts.gpus][-1] == "hang" and facts.last_answer_s >= 0.5


def test_an_answer_without_its_stamp_counts_as_late():
    records = [("node", {"status": "ok", "device_count": 2, "probed": [0, 1]}),
               ("gpu", gather_gpu(_slow_driver(lambda i: 0.0), 0, frozenset()))]
    facts = assemble(records, timed_out=True, error=None, timeout_s=5.0, started=100.0)
    assert facts.last_answer_s == 5.0
    stamped = assemble(records + [("answered", (0, 100.25))], timed_out=True, error=None, timeout_s=5.0, started=100.0)
    assert stamped.last_answer_s == 0.25
