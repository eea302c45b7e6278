"""gpu.temperature, gpu.clock_events, gpu.clock_events.rate: heat and the hardware slowing the
GPU down.

A slowdown seen once warns (``gpu.clock_events``); seen in too many runs within a window it
drains (``gpu.clock_events.rate``). The count lives in the counter history as a running total
per GPU (one more for every run that sees a slowdown), so its growth within the window is the
number of runs that saw it there, after the window's oldest run.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..counters.growth_rate import growth
from ..driver_support import slowdown_reasons
from ..findings import Finding
from .base import CheckInput, gpu_key

# Which clock event reasons are noise and which are the hardware slowing the GPU down is data:
# healthcheck/data/clock-event-reasons.tsv (driver_support.slowdown_reasons).

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
        active = [reason.name for reason in slowdown_reasons(reasons)]
        if active:
            findings.append(inp.finding("gpu.clock_events", "warn",
                                        f"{gpu.subject()}: clocks held down by {', '.join(active)}",
                                        gpu=gpu, evidence={"clock_event_reasons": hex(reasons), "active": active}))
    return findings


def _slowdown_key(gpu) -> str:
    return f"{gpu_key(gpu)}/clock_slowdown_runs"


def _slowdown_runs(inp: CheckInput, gpu) -> Optional[Tuple[float, bool]]:
    """(the running total of runs that saw a slowdown, this one included; whether this run saw
    one); None when the reasons are unknown (unsupported, not read)."""
    reasons = gpu.clock_event_reasons
    if reasons is None:
        return None
    series = inp.history.get(_slowdown_key(gpu), [])
    before = float(series[-1][1]) if series else 0.0
    seen = bool(slowdown_reasons(reasons))
    return before + (1 if seen else 0), seen


def clock_slowdown_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    window = inp.threshold("clock_slowdown_window_s")
    out: Dict[str, Tuple[float, float]] = {}
    for gpu in inp.healthy_gpus():
        runs = _slowdown_runs(inp, gpu)
        if runs is not None:
            out[_slowdown_key(gpu)] = (runs[0], window)
    return out


def clock_slowdown_rate(inp: CheckInput) -> List[Finding]:
    window = inp.threshold("clock_slowdown_window_s")
    limit = inp.threshold("clock_slowdown_max_runs_per_window")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        runs = _slowdown_runs(inp, gpu)
        if runs is None or not runs[1]:
            continue          # judged only while it lasts: a slowdown that stopped drains nothing new
        grown = growth(inp.history.get(_slowdown_key(gpu), []), runs[0], inp.now, window)
        if grown is None or grown[0] <= limit:
            continue
        active = [reason.name for reason in slowdown_reasons(gpu.clock_event_reasons or 0)]
        findings.append(inp.finding(
            "gpu.clock_events.rate", "fail",
            f"{gpu.subject()}: clocks held down by {', '.join(active)} in {grown[0]:.0f} runs within "
            f"{window:g} s (more than {limit:g})",
            gpu=gpu, evidence={"clock_event_reasons": hex(gpu.clock_event_reasons or 0), "active": active,
                               "runs": round(grown[0], 3), "limit": limit, "window_s": window}))
    return findings
