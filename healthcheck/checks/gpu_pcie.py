"""gpu.pcie: the GPU's PCIe link trained below its width or generation."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput

# nvmlClocksEventReasonGpuIdle: an idle GPU drops its PCIe link to a lower generation to
# save power, so the generation is judged only while the GPU is not idle.
GPU_IDLE = 0x1


def pcie_link(inp: CheckInput) -> List[Finding]:
    want_gen = inp.expected.get("pcie_gen")
    want_width = inp.expected.get("pcie_width")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        link = gpu.pcie
        width, width_max = link.get("width"), link.get("width_max")
        gen, gen_max = link.get("gen"), link.get("gen_max")
        target_width = want_width or width_max
        target_gen = want_gen or gen_max
        problems = []
        if width is not None and target_width and width < target_width:
            problems.append(f"x{width} instead of x{target_width}")
        idle = gpu.clock_event_reasons is None or bool(gpu.clock_event_reasons & GPU_IDLE)
        if gen is not None and target_gen and gen < target_gen and not idle:
            problems.append(f"Gen{gen} instead of Gen{target_gen}")
        if problems:
            findings.append(inp.finding(
                "gpu.pcie", "warn", f"{gpu.subject()}: PCIe link runs at " + " and ".join(problems)
                + " (reseat or check the riser/retimer)",
                gpu=gpu, evidence={"width": width, "width_max": width_max, "gen": gen, "gen_max": gen_max,
                                   "expected_width": want_width, "expected_gen": want_gen,
                                   "idle": idle}))
    return findings
