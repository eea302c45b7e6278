"""gpu.power_limit: a GPU capped below its expected power limit runs every job slower."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput


def power_limit(inp: CheckInput) -> List[Finding]:
    expected = inp.expected.get("power_limit_w")
    if not expected:
        return []
    floor = expected * inp.threshold("power_limit_min_pct") / 100.0
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        limit = gpu.power_limit_w
        if limit is not None and limit < floor:
            findings.append(inp.finding(
                "gpu.power_limit", "warn",
                f"{gpu.subject()}: enforced power limit is {limit:g} W, {expected:g} W expected",
                gpu=gpu, evidence={"enforced_w": limit, "expected_w": expected, "floor_w": floor,
                                   "power_w": gpu.power_w}))
    return findings
