"""gpu.pcie.aer_fatal, gpu.pcie.aer_nonfatal, gpu.pcie.aer_correctable_rate: the kernel's PCIe
AER counters of each GPU (``facts.PcieAerFacts``).

The counters count since boot and only a reboot clears them. A fatal error is judged on its
total (the link was reset under whatever ran); a non-fatal (uncorrectable) error on its total
since boot and on its growth within a window; correctable errors (a marginal link that retried)
on their growth only. A device without AER (no files) is not judged.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..counters.growth_rate import growth
from ..facts import AER_FILES, GpuFacts, PcieAerDevice
from ..findings import Finding
from .base import CheckInput, gpu_key


def _key(gpu: GpuFacts, kind: str) -> str:
    return f"{gpu_key(gpu)}/pcie_aer_{kind}"


def _devices(inp: CheckInput) -> List[Tuple[GpuFacts, PcieAerDevice]]:
    if inp.aer is None or inp.aer.status != "ok":
        return []
    out = []
    for gpu in inp.healthy_gpus():
        device = inp.aer.device(gpu.pci_bus_id)
        if device is not None:
            out.append((gpu, device))
    return out


def _top(device: PcieAerDevice, kind: str) -> Dict[str, int]:
    """The error kinds that counted, as the kernel names them."""
    return {name: count for name, count in device.counts.get(kind, {}).items() if count}


def _samples(inp: CheckInput, kind: str, window_name: str) -> Dict[str, Tuple[float, float]]:
    window = inp.threshold(window_name)
    return {_key(gpu, kind): (device.totals[kind], window) for gpu, device in _devices(inp)
            if device.totals.get(kind) is not None}


def aer_nonfatal_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    return _samples(inp, "nonfatal", "pcie_aer_nonfatal_window_s")


def aer_correctable_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    return _samples(inp, "correctable", "pcie_aer_correctable_window_s")


def _grown(inp: CheckInput, gpu: GpuFacts, kind: str, value: int, window: float) -> Optional[float]:
    grown = growth(inp.history.get(_key(gpu, kind), []), value, inp.now, window)
    return None if grown is None else grown[0]


def aer_fatal(inp: CheckInput) -> List[Finding]:
    limit = inp.threshold("pcie_aer_fatal_max")
    findings: List[Finding] = []
    for gpu, device in _devices(inp):
        total = device.totals.get("fatal")
        if total is None or total <= limit:
            continue
        errors = _top(device, "fatal")
        named = f" ({', '.join(f'{k} {v}' for k, v in errors.items())})" if errors else ""
        findings.append(inp.finding(
            "gpu.pcie.aer_fatal", "fail",
            f"{gpu.subject()}: {total} fatal PCIe AER error(s) since boot{named}: the link was reset; "
            "reboot, and reseat or replace the card if it comes back",
            gpu=gpu, evidence={"file": AER_FILES["fatal"], "address": device.address, "total": total,
                               "limit": limit, "errors": errors}))
    return findings


def aer_nonfatal(inp: CheckInput) -> List[Finding]:
    total_limit = inp.threshold("pcie_aer_nonfatal_max")
    window = inp.threshold("pcie_aer_nonfatal_window_s")
    growth_limit = inp.threshold("pcie_aer_nonfatal_max_per_window")
    findings: List[Finding] = []
    for gpu, device in _devices(inp):
        total = device.totals.get("nonfatal")
        if total is None:
            continue
        grown = _grown(inp, gpu, "nonfatal", total, window)
        reasons = []
        if total > total_limit:
            reasons.append(f"{total} since boot (more than {total_limit:g})")
        if grown is not None and grown > growth_limit:
            reasons.append(f"+{grown:.0f} within {window:g} s (more than {growth_limit:g})")
        if not reasons:
            continue
        errors = _top(device, "nonfatal")
        named = f" ({', '.join(f'{k} {v}' for k, v in errors.items())})" if errors else ""
        findings.append(inp.finding(
            "gpu.pcie.aer_nonfatal", "fail",
            f"{gpu.subject()}: uncorrectable non-fatal PCIe AER errors{named}: " + "; ".join(reasons),
            gpu=gpu, evidence={"file": AER_FILES["nonfatal"], "address": device.address, "total": total,
                               "total_limit": total_limit, "growth": None if grown is None else round(grown, 3),
                               "growth_limit": growth_limit, "window_s": window, "errors": errors}))
    return findings


def aer_correctable_rate(inp: CheckInput) -> List[Finding]:
    window = inp.threshold("pcie_aer_correctable_window_s")
    limit = inp.threshold("pcie_aer_correctable_max_per_window")
    findings: List[Finding] = []
    for gpu, device in _devices(inp):
        total = device.totals.get("correctable")
        if total is None:
            continue
        grown = _grown(inp, gpu, "correctable", total, window)
        if grown is None or grown <= limit:
            continue
        errors = _top(device, "correctable")
        named = f" ({', '.join(f'{k} {v}' for k, v in errors.items())})" if errors else ""
        findings.append(inp.finding(
            "gpu.pcie.aer_correctable_rate", "warn",
            f"{gpu.subject()}: correctable PCIe AER errors growing, +{grown:.0f} within {window:g} s "
            f"(more than {limit:g}){named}",
            gpu=gpu, evidence={"file": AER_FILES["correctable"], "address": device.address, "total": total,
                               "growth": round(grown, 3), "limit": limit, "window_s": window, "errors": errors}))
    return findings
