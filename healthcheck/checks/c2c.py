"""nvlink.c2c: the GPU's NVLink-C2C links to its CPU (a Grace superchip's) are all active.

NVML reports the C2C links a GPU has and each one's status (field values 170 and 171, driver
R525+); a GPU without C2C reports none, a driver that does not know the fields leaves the fact
unknown: nothing is judged either way. A link that is not active cuts the GPU off its CPU's
memory: the node cannot run a job as built.
"""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput, join_numbers


def c2c_links(inp: CheckInput) -> List[Finding]:
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        links = gpu.c2c_links
        if not links:            # None: not known; {}: no C2C links
            continue
        down = sorted(link for link, status in links.items() if status != 1)
        if down:
            findings.append(inp.finding(
                "nvlink.c2c", "fail",
                f"{gpu.subject()}: NVLink-C2C link {join_numbers(down)} to the CPU not active "
                f"({len(links) - len(down)} of {len(links)} active)",
                gpu=gpu, evidence={"down": down, "links": len(links)}))
    return findings
