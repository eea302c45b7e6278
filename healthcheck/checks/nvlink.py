"""nvlink.down, nvlink.errors: GPU-to-GPU links."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..facts import NVLINK_COUNTERS
from ..findings import Finding
from ..counters.growth_rate import growth
from .base import CheckInput, gpu_key, join_numbers

# Counter -> the threshold its growth is held to. CRC errors on flits and on data are one
# symptom (a marginal link), so they share a budget.
FAMILIES = {
    "replay": "nvlink_replay_max_per_window",
    "recovery": "nvlink_recovery_max_per_window",
    "crc_flit": "nvlink_crc_max_per_window",
    "crc_data": "nvlink_crc_max_per_window",
    "ecc_data": "nvlink_ecc_data_max_per_window",
}


def links_down(inp: CheckInput) -> List[Finding]:
    expected = inp.expected.get("nvlinks_per_gpu")
    if expected == 0:
        return []          # a PCIe node: NVML has no NVLink to report, and that is right
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        states = gpu.nvlink_states
        if states is None:
            if expected:
                findings.append(inp.finding("nvlink.down", "fail",
                                            f"{gpu.subject()}: NVML reports no NVLink, {expected} expected",
                                            gpu=gpu, evidence={"expected": expected, "active": 0}))
            continue
        down = sorted(link for link, state in states.items() if not state)
        active = len(states) - len(down)
        if expected is None and not active:
            continue       # PCIe cards without an NVLink bridge report every link present but down
        if expected is not None and active < expected:
            detail = f" (link {join_numbers(down)} down)" if down else ""
            message = f"{gpu.subject()}: {active} of {expected} NVLinks active{detail}"
        elif expected is None and down:
            message = f"{gpu.subject()}: NVLink {join_numbers(down)} down ({active} of {len(states)} active)"
        else:
            continue
        findings.append(inp.finding("nvlink.down", "fail", message, gpu=gpu,
                                    evidence={"expected": expected, "active": active, "down": down,
                                              "links_reported": len(states)}))
    return findings


def _key(gpu, link: int, counter: str) -> str:
    return f"{gpu_key(gpu)}/nvlink/{link}/{counter}"


def link_error_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    window = inp.threshold("nvlink_errors_window_s")
    return {_key(gpu, link, name): (value, window)
            for gpu in inp.healthy_gpus() for link, counters in gpu.nvlink_errors.items()
            for name, value in counters.items() if name in NVLINK_COUNTERS}


def link_errors(inp: CheckInput) -> List[Finding]:
    window = inp.threshold("nvlink_errors_window_s")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        over: List[Dict] = []
        for link, counters in sorted(gpu.nvlink_errors.items()):
            per_family: Dict[str, float] = {}
            for name, value in counters.items():
                if name not in FAMILIES:
                    continue
                grown = growth(inp.history.get(_key(gpu, link, name), []), value, inp.now, window)
                if grown is not None:
                    per_family[FAMILIES[name]] = per_family.get(FAMILIES[name], 0.0) + grown[0]
            for threshold, delta in sorted(per_family.items()):
                limit = inp.threshold(threshold)
                if delta > limit:
                    family = threshold[len("nvlink_"):-len("_max_per_window")]
                    over.append({"link": link, "counter": family, "growth": round(delta, 3), "limit": limit})
        if over:
            text = ", ".join(f"link {o['link']} {o['counter']} +{o['growth']:.0f}" for o in over)
            findings.append(inp.finding("nvlink.errors", "warn",
                                        f"{gpu.subject()}: NVLink errors growing ({text} within {window:g} s)",
                                        gpu=gpu, evidence={"window_s": window, "over": over}))
    return findings
