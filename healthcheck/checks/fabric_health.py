"""nvlink.fabric_health: the multi-node NVLink fabric's own health, as the driver reports it.

NVML's fabric info v3 (``nvmlDeviceGetGpuFabricInfoV`` with ``nvmlGpuFabricInfo_v3``, driver
R570+) adds a health summary (healthy, unhealthy, limited capacity) to the health mask's fields
(degraded bandwidth, route recovery, route unhealthy, access-timeout recovery, incorrect
configuration). Judged only on GPUs whose driver reports them: an older driver, or a GPU with no
fabric, leaves them unknown and nothing is judged (``[[nodes]] nvml_required = ["fabric_health"]``
makes such a driver a ``gpu.nvml`` failure).

The 2-bit mask fields read 0 not supported, 1 true, 2 false: a mask of 0xaa is all four "false",
a healthy fabric (NVIDIA/nccl#2186 read it as four paths down; pynvml's constants say otherwise).
"""
from __future__ import annotations

from typing import List

from ..facts import (FABRIC_HEALTH_MASK_TRUE, FABRIC_HEALTH_SUMMARIES, FABRIC_INCORRECT_CONFIGURATIONS,
                     fabric_health_fields)
from ..findings import Finding
from .base import CheckInput

_UNHEALTHY = 2           # NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
_LIMITED_CAPACITY = 3    # NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
_NO_INCORRECT_CONFIGURATION = (0, 1)   # not supported, none

# The 2-bit fields that fail a GPU when "true", and what they mean.
MASK_FAULTS = {
    "degraded_bw": "degraded bandwidth",
    "route_recovery": "route recovery in progress",
    "route_unhealthy": "route unhealthy",
    "access_timeout_recovery": "access-timeout recovery in progress",
}


def fabric_health(inp: CheckInput) -> List[Finding]:
    if inp.expected.get("nvswitch_fabric") is False:
        return []
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        summary, mask = gpu.fabric_health_summary, gpu.fabric_health_mask
        if summary is None and mask is None:
            continue          # not reported by this driver (before R570) or no fabric
        fields = fabric_health_fields(mask or 0)
        problems = []
        if summary in (_UNHEALTHY, _LIMITED_CAPACITY):
            problems.append(f"health summary {FABRIC_HEALTH_SUMMARIES[summary]}")
        problems += [text for name, text in MASK_FAULTS.items() if fields[name] == FABRIC_HEALTH_MASK_TRUE]
        wrong = fields["incorrect_configuration"]
        if wrong not in _NO_INCORRECT_CONFIGURATION:
            problems.append("incorrect configuration: " + FABRIC_INCORRECT_CONFIGURATIONS.get(wrong, f"code {wrong}"))
        if not problems:
            continue
        findings.append(inp.finding(
            "nvlink.fabric_health", "fail",
            f"{gpu.subject()}: NVLink fabric {', '.join(problems)} (NVML fabric health)",
            gpu=gpu, evidence={"health_summary": FABRIC_HEALTH_SUMMARIES.get(summary, summary) if summary is not None
                               else None, "health_mask": f"0x{(mask or 0):x}", "fields": fields,
                               "clique_id": gpu.fabric_clique_id, "cluster_uuid": gpu.fabric_cluster_uuid}))
    return findings
