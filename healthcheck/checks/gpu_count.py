"""gpu.count, gpu.model, gpu.lost: are all the GPUs there, the right ones, and on the bus?"""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput, plural


def gpu_count(inp: CheckInput) -> List[Finding]:
    expected = inp.expected.get("gpus")
    if expected is None or not inp.nvml_ok():
        return []
    found = inp.nvml.device_count
    if found == expected:
        return []
    if found < expected:
        message = (f"{plural(found, 'GPU')} visible to NVML, {expected} expected: "
                   f"{plural(expected - found, 'GPU')} missing (fallen off the bus or failed to initialise)")
    else:
        message = f"{plural(found, 'GPU')} visible to NVML, only {expected} expected ([[nodes]] gpus)"
    present = [g.pci_bus_id for g in inp.nvml.gpus if g.pci_bus_id]
    return [inp.finding("gpu.count", "fail", message,
                        evidence={"expected": expected, "found": found, "present_bus_ids": present})]


def gpu_model(inp: CheckInput) -> List[Finding]:
    model = inp.expected.get("gpu_model")
    if not model:
        return []
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        if gpu.name is not None and model.lower() not in gpu.name.lower():
            findings.append(inp.finding(
                "gpu.model", "warn", f"{gpu.subject()} is a {gpu.name}, [[nodes]] expects {model}",
                gpu=gpu, evidence={"name": gpu.name, "expected_model": model}))
    return findings


def gpu_lost(inp: CheckInput) -> List[Finding]:
    return [inp.finding("gpu.lost", "fail",
                        f"{gpu.subject()} has fallen off the bus (NVML: {gpu.error or 'GPU is lost'}); "
                        "the node needs a reboot", gpu=gpu, evidence={"nvml_error": gpu.error})
            for gpu in inp.gpus_in_scope() if gpu.state == "lost"]
