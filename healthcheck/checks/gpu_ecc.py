"""gpu.ecc.mode, gpu.ecc.uncorrectable, gpu.ecc.correctable_rate: GPU memory errors."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..findings import Finding
from ..counters.growth_rate import growth
from .base import CheckInput, gpu_key


def ecc_mode(inp: CheckInput) -> List[Finding]:
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        if gpu.ecc_mode is None:
            continue      # NVML: NotSupported, a GPU without ECC memory
        current, pending = gpu.ecc_mode
        evidence = {"current": current, "pending": pending}
        if not current:
            later = " (enabled at the next reboot)" if pending else ""
            findings.append(inp.finding("gpu.ecc.mode", "fail",
                                        f"{gpu.subject()}: ECC is disabled{later}; memory errors go undetected",
                                        gpu=gpu, evidence=evidence))
        elif not pending:
            findings.append(inp.finding("gpu.ecc.mode", "warn",
                                        f"{gpu.subject()}: ECC will be disabled at the next reboot",
                                        gpu=gpu, evidence=evidence))
    return findings


def ecc_uncorrectable(inp: CheckInput) -> List[Finding]:
    volatile_max = inp.threshold("ecc_uncorrectable_volatile_max")
    aggregate_max = inp.threshold("ecc_uncorrectable_aggregate_max")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        volatile = gpu.ecc.get("volatile_uncorrected")
        aggregate = gpu.ecc.get("aggregate_uncorrected")
        # With a row remapper (Ampere and later) an uncorrectable error is repaired by
        # remapping the row, and the lifetime count stays non-zero for good: the remapper's
        # own state (gpu.remap.*) carries that signal, so only the volatile count is judged.
        has_remapper = gpu.remapped_rows is not None
        reasons = []
        if volatile is not None and volatile > volatile_max:
            reasons.append(f"{volatile} uncorrectable (double-bit) ECC errors since the driver loaded")
        if not has_remapper and aggregate is not None and aggregate > aggregate_max:
            reasons.append(f"{aggregate} uncorrectable ECC errors in its lifetime")
        if reasons:
            findings.append(inp.finding(
                "gpu.ecc.uncorrectable", "fail", f"{gpu.subject()}: " + "; ".join(reasons),
                gpu=gpu, evidence={"volatile_uncorrected": volatile, "aggregate_uncorrected": aggregate,
                                   "volatile_max": volatile_max, "aggregate_max": aggregate_max,
                                   "aggregate_judged": not has_remapper}))
    return findings


def _correctable_key(gpu) -> str:
    return f"{gpu_key(gpu)}/ecc.volatile_corrected"


def ecc_correctable_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    window = inp.threshold("ecc_correctable_window_s")
    return {_correctable_key(gpu): (gpu.ecc["volatile_corrected"], window)
            for gpu in inp.healthy_gpus() if gpu.ecc.get("volatile_corrected") is not None}


def ecc_correctable_rate(inp: CheckInput) -> List[Finding]:
    window = inp.threshold("ecc_correctable_window_s")
    limit = inp.threshold("ecc_correctable_max_per_window")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        current = gpu.ecc.get("volatile_corrected")
        if current is None:
            continue
        grown = growth(inp.history.get(_correctable_key(gpu), []), current, inp.now, window)
        if grown is None:
            continue      # first sighting: this run is the baseline
        delta, span = grown
        if delta > limit:
            findings.append(inp.finding(
                "gpu.ecc.correctable_rate", "fail",
                f"{gpu.subject()}: {delta:.0f} correctable (single-bit) ECC errors in {_duration(min(span, window))}"
                f" (limit {limit:g} per {_duration(window)}): its memory is degrading",
                gpu=gpu, evidence={"growth": round(delta, 3), "measured_over_s": round(span, 3),
                                   "window_s": window, "limit": limit, "volatile_corrected": current}))
    return findings


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
