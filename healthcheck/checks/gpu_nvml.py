"""gpu.nvml: can this node's GPUs be asked anything at all?"""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput

_INIT_FAILURES = {
    "library_not_found": "NVML library not found: the NVIDIA driver is not installed",
    "driver_not_loaded": "NVIDIA driver is not loaded (NVML: Driver Not Loaded)",
    "init_error": "NVML failed to initialise",
}


def nvml_usable(inp: CheckInput) -> List[Finding]:
    nvml = inp.nvml
    if nvml is None:
        return []
    if nvml.status in _INIT_FAILURES:
        # A node that should have GPUs and cannot reach them is broken; one with no
        # expectation (perhaps a CPU node) is only a node this tool could not check.
        expects_gpus = inp.expected.get("gpus", 0) > 0
        message = _INIT_FAILURES[nvml.status]
        if nvml.status == "init_error" and nvml.message:
            message += f" ({nvml.message})"
        finding = inp.finding("gpu.nvml", "fail" if expects_gpus else "error", message,
                              evidence={"nvml_status": nvml.status, "nvml_error": nvml.message,
                                        "expected_gpus": inp.expected.get("gpus")})
        if not expects_gpus:
            finding.action = "none"     # nothing says this node has GPUs: no ground to drain it
        return [finding]
    findings: List[Finding] = []
    for gpu in inp.gpus_in_scope():
        if gpu.state == "error":
            findings.append(inp.finding("gpu.nvml", "error", f"{gpu.subject()}: NVML could not read it ({gpu.error})",
                                        gpu=gpu, evidence={"nvml_error": gpu.error}))
        elif gpu.state == "ok" and gpu.errors:
            reads = ", ".join(f"{what}: {text}" for what, text in sorted(gpu.errors.items()))
            findings.append(inp.finding("gpu.nvml", "error", f"{gpu.subject()}: NVML refused some reads ({reads})",
                                        gpu=gpu, evidence={"nvml_errors": dict(gpu.errors)}))
    findings.extend(_required_facts(inp))
    return findings


def _required_facts(inp: CheckInput) -> List[Finding]:
    """A fact the driver cannot give fails only where [[nodes]] nvml_required demands it."""
    required = inp.expected.get("nvml_required") or []
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        lacking = [fact for fact in required if fact in gpu.driver_missing]
        if lacking:
            calls = "; ".join(f"{fact}: {gpu.driver_missing[fact]}" for fact in lacking)
            findings.append(inp.finding(
                "gpu.nvml", "fail",
                f"{gpu.subject()}: driver {inp.nvml.driver_version or '?'} cannot report "
                f"{', '.join(lacking)} ([[nodes]] nvml_required), missing {calls}",
                gpu=gpu, evidence={"driver_version": inp.nvml.driver_version, "lacking": lacking,
                                   "missing_functions": {f: gpu.driver_missing[f] for f in lacking}}))
    return findings
