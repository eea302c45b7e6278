"""gpu.temperature, gpu.clock_events: heat and the hardware slowing the GPU down."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput

# NVML clock event reasons (nvmlClocksEventReason*) that mean the hardware is protecting
# itself. Software power capping and SW thermal slowdown are normal under load; these are not.
HW_SLOWDOWN = 0x8
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
BAD_CLOCK_EVENTS = {
    HW_SLOWDOWN: "HW slowdown",
    HW_THERMAL_SLOWDOWN: "HW thermal slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "HW power brake",
}


def temperature(inp: CheckInput) -> List[Finding]:
    margin = inp.threshold("temperature_margin_c")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        temp, slowdown = gpu.temperature_c, gpu.temperature_slowdown_c
        if temp is None or slowdown is None:
            continue
        evidence = {"temperature_c": temp, "slowdown_c": slowdown, "margin_c": margin}
        if temp >= slowdown:
            findings.append(inp.finding("gpu.temperature", "fail",
                                        f"{gpu.subject()} is at {temp:g} °C, at or above its slowdown "
                                        f"threshold ({slowdown:g} °C): check cooling", gpu=gpu, evidence=evidence))
        elif temp >= slowdown - margin:
            findings.append(inp.finding("gpu.temperature", "warn",
                                        f"{gpu.subject()} is at {temp:g} °C, within {margin:g} °C of its "
                                        f"slowdown threshold ({slowdown:g} °C)", gpu=gpu, evidence=evidence))
    return findings


def clock_events(inp: CheckInput) -> List[Finding]:
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        reasons = gpu.clock_event_reasons
        if not reasons:
            continue
        active = [name for bit, name in BAD_CLOCK_EVENTS.items() if reasons & bit]
        if active:
            findings.append(inp.finding("gpu.clock_events", "warn",
                                        f"{gpu.subject()}: clocks held down by {', '.join(active)}",
                                        gpu=gpu, evidence={"clock_event_reasons": hex(reasons), "active": active}))
    return findings
