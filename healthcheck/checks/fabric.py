"""nvlink.fabric: on NVSwitch systems (Hopper and later) each GPU must have joined the fabric.

A GPU whose registration never completes (fabric manager not running, or failing) shows as
stuck "in progress", and CUDA jobs then fail to initialise on it.
"""
from __future__ import annotations

from typing import List

from ..facts import FABRIC_STATES
from ..findings import Finding
from .base import CheckInput

_COMPLETED = 3
_SUCCESS = 0


def fabric_state(inp: CheckInput) -> List[Finding]:
    expected = inp.expected.get("nvswitch_fabric")
    if expected is False:
        return []
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        state, status = gpu.fabric_state, gpu.fabric_status
        evidence = {"state": FABRIC_STATES.get(state, state) if state is not None else None,
                    "status": status, "expected": expected}
        if state is None:
            # A driver too old to report the fabric (R470) is not a fault: gpu.nvml says so
            # when [[nodes]] nvml_required demands the fact.
            if expected and "fabric" not in gpu.driver_missing:
                findings.append(inp.finding("nvlink.fabric", "fail",
                                            f"{gpu.subject()}: no NVSwitch fabric reported, one is expected",
                                            gpu=gpu, evidence=evidence))
            continue
        if state != _COMPLETED:
            name = FABRIC_STATES.get(state, f"state {state}")
            findings.append(inp.finding(
                "nvlink.fabric", "fail",
                f"{gpu.subject()}: NVSwitch fabric registration {name} (is nvidia-fabricmanager running?); "
                "CUDA jobs will fail to start", gpu=gpu, evidence=evidence))
        elif status not in (None, _SUCCESS):
            findings.append(inp.finding(
                "nvlink.fabric", "fail",
                f"{gpu.subject()}: NVSwitch fabric registration failed (NVML return code {status})",
                gpu=gpu, evidence=evidence))
    return findings
