"""The check list: every check id, the function that judges it (``module:function`` under
``healthcheck/checks/``), the facts it needs and its one-line summary; the findings that come
from running checks rather than from one check.

Plain data below the checks: the config's validation reads ``CHECKS`` and ``FINDING_IDS`` here
without importing the checks' package, and ``healthcheck.checks.judge`` loads a check's function
by its ``target``. ``docs/checks.md`` describes every id.
"""
from __future__ import annotations

from .plain import plain
from typing import Dict, FrozenSet, List, Optional, Tuple


@plain(frozen=True)
class CheckSpec:
    id: str
    target: str                    # "module:function" under healthcheck.checks
    # "nvml:<group>" (see facts.NVML_READ_GROUPS), "nvml", "ib", "dcgm", "kernel", "perftest", "imex",
    # "aer" (the GPUs' PCIe AER counters in sysfs, read for the bus ids NVML gives)
    needs: Tuple[str, ...]
    samples: Optional[str] = None  # "module:function" giving the counters it judges growth of
    summary: str = ""


_SPECS = (
    CheckSpec("gpu.nvml", "gpu_nvml:nvml_usable", ("nvml",),
              summary="NVML loads, the driver is loaded, every GPU answers"),
    CheckSpec("gpu.count", "gpu_count:gpu_count", ("nvml",),
              summary="as many GPUs as [[nodes]] gpus"),
    CheckSpec("gpu.model", "gpu_count:gpu_model", ("nvml",),
              summary="each GPU's name contains [[nodes]] gpu_model"),
    CheckSpec("gpu.lost", "gpu_count:gpu_lost", ("nvml",),
              summary="no GPU has fallen off the bus"),
    CheckSpec("gpu.ecc.mode", "gpu_ecc:ecc_mode", ("nvml:ecc",),
              summary="ECC is enabled"),
    CheckSpec("gpu.ecc.uncorrectable", "gpu_ecc:ecc_uncorrectable", ("nvml:ecc", "nvml:remap"),
              summary="no uncorrectable (double-bit) ECC errors"),
    CheckSpec("gpu.ecc.correctable_rate", "gpu_ecc:ecc_correctable_rate", ("nvml:ecc",),
              samples="gpu_ecc:ecc_correctable_samples",
              summary="correctable ECC errors do not grow fast"),
    CheckSpec("gpu.remap.pending", "gpu_remap:remap_pending", ("nvml:remap",),
              summary="no row remapping waits for a GPU reset"),
    CheckSpec("gpu.remap.failed", "gpu_remap:remap_failed", ("nvml:remap",),
              summary="row remapping has not failed"),
    CheckSpec("gpu.retired_pages.pending", "gpu_remap:retired_pages_pending", ("nvml:retired_pages",),
              summary="no page retirement waits for a reboot (pre-Ampere)"),
    CheckSpec("gpu.recovery_action", "gpu_recovery:recovery_action", ("nvml:recovery",),
              summary="the driver asks for no GPU reset or node reboot (NVML recovery action, R570+)"),
    CheckSpec("gpu.temperature", "gpu_thermal:temperature", ("nvml:thermal",),
              summary="temperature below the slowdown threshold"),
    CheckSpec("gpu.clock_events", "gpu_thermal:clock_events", ("nvml:clocks",),
              summary="no HW slowdown, HW thermal or power-brake clock events"),
    CheckSpec("gpu.clock_events.rate", "gpu_thermal:clock_slowdown_rate", ("nvml:clocks",),
              samples="gpu_thermal:clock_slowdown_samples",
              summary="a hardware slowdown is not seen in too many runs within a window"),
    CheckSpec("gpu.power_limit", "gpu_power:power_limit", ("nvml:power",),
              summary="enforced power limit not below [[nodes]] power_limit_w"),
    CheckSpec("gpu.pcie", "gpu_pcie:pcie_link", ("nvml:pcie",),
              summary="PCIe link at its full width and generation"),
    CheckSpec("gpu.pcie.aer_fatal", "pcie_aer:aer_fatal", ("nvml", "aer"),
              summary="no fatal PCIe AER error on a GPU since boot"),
    CheckSpec("gpu.pcie.aer_nonfatal", "pcie_aer:aer_nonfatal", ("nvml", "aer"),
              samples="pcie_aer:aer_nonfatal_samples",
              summary="uncorrectable non-fatal PCIe AER errors neither many since boot nor growing"),
    CheckSpec("gpu.pcie.aer_correctable_rate", "pcie_aer:aer_correctable_rate", ("nvml", "aer"),
              samples="pcie_aer:aer_correctable_samples",
              summary="correctable PCIe AER errors do not grow fast"),
    CheckSpec("gpu.processes", "gpu_processes:stray_processes", ("nvml:processes",),
              summary="no compute process holds GPU memory (before a job starts)"),
    CheckSpec("nvlink.down", "nvlink:links_down", ("nvml:nvlink",),
              summary="every expected NVLink is active"),
    CheckSpec("nvlink.errors", "nvlink:link_errors", ("nvml:nvlink_errors",),
              samples="nvlink:link_error_samples",
              summary="NVLink replay/recovery/CRC/ECC counters do not grow fast"),
    CheckSpec("nvlink.fabric", "fabric:fabric_state", ("nvml:fabric",),
              summary="NVSwitch fabric registration completed (fabric manager running)"),
    # -- multi-node NVLink fabric (GB200 NVL72; fabric info v3, R570+) and its IMEX domain --
    CheckSpec("nvlink.c2c", "c2c:c2c_links", ("nvml:c2c",),
              summary="every NVLink-C2C link from GPU to CPU is active (Grace superchips; driver R525+)"),
    CheckSpec("nvlink.fabric_health", "fabric_health:fabric_health", ("nvml:fabric",),
              summary="the NVLink fabric's health summary and mask report no fault (fabric info v3, R570+)"),
    CheckSpec("imex.domain", "imex_domain:imex_domain", ("nvml:fabric", "imex"),
              summary="the IMEX daemon is READY and a channel exists, where the node is in a multi-node NVLink "
                      "domain and [[nodes]] imex_owned is true"),
    CheckSpec("ib.port", "ib_ports:ib_port", ("ib",),
              summary="every expected IB/RoCE port present, ACTIVE, LinkUp, right rate and link layer"),
    CheckSpec("ib.counters", "ib_counters:ib_counters", ("ib",),
              samples="ib_counters:ib_counter_samples",
              summary="IB port error counters do not grow fast"),
    CheckSpec("ib.bandwidth", "ib_bandwidth:ib_bandwidth", ("ib", "perftest"),
              summary="ib_write_bw loopback between the node's ports reaches [thresholds] ib_bandwidth_min_pct of the rate"),
    CheckSpec("roce.gid", "roce_gid:roce_gid", ("ib",),
              summary="the GID index NCCL uses is RoCE v2"),
    CheckSpec("kernel.xid", "kernel_log:kernel_xid", ("kernel", "nvml"),
              summary="no Xid or fallen-off-the-bus event that NVIDIA's catalog says needs the node taken out"),
    CheckSpec("kernel.sxid", "kernel_log:kernel_sxid", ("kernel", "nvml"),
              summary="no fatal NVSwitch SXid event"),
    CheckSpec("dcgm.diag", "dcgm:dcgm_diag", ("dcgm", "nvml"),
              summary="dcgmi diag passes at the tier's level"),
)

CHECKS: Dict[str, CheckSpec] = {spec.id: spec for spec in _SPECS}

# Findings that come from running the checks rather than from one check; they can be given
# an action in [actions] but are not listed in [tiers] (every tier can raise them).
PROBE_FINDINGS: Dict[str, str] = {
    "probe.timeout": "a probe (NVML, sysfs, dcgmi) did not answer within its deadline",
    "probe.error": "a probe failed for a reason other than the hardware (e.g. permissions)",
    "check.error": "a check raised an exception (a bug in this tool)",
}

FINDING_IDS: FrozenSet[str] = frozenset(CHECKS) | frozenset(PROBE_FINDINGS)


def nvml_features(check_ids: List[str]) -> FrozenSet[str]:
    return frozenset(need.split(":", 1)[1] for cid in check_ids for need in CHECKS[cid].needs
                     if need.startswith("nvml:"))


def needs(check_ids: List[str]) -> FrozenSet[str]:
    return frozenset(need.split(":", 1)[0] for cid in check_ids for need in CHECKS[cid].needs)
