"""ib.counters: port error counters growing over a window (a marginal cable or transceiver).

Totals are not judged: counters are cleared rarely, and an old count says nothing about now.
A counter at the maximum of its width (``IB_COUNTER_BITS``) has stopped counting: its growth
is unknown, so it is reported as saturated rather than read as "no growth".
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..facts import IB_COUNTER_BITS, IB_COUNTERS
from ..findings import Finding
from ..counters.growth_rate import growth
from .base import CheckInput


def _key(port, counter: str) -> str:
    return f"ib/{port.hca}:{port.port}/{counter}"


def threshold_name(counter: str) -> str:
    return f"ib_{counter}_max_per_window"


def ib_counter_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    window = inp.threshold("ib_counters_window_s")
    return {_key(port, name): (value, window) for port in inp.ports_to_watch()
            for name, value in port.counters.items() if name in IB_COUNTERS and value is not None}


def saturation(counter: str) -> Optional[int]:
    """The value at which the kernel's counter stops; None for the 64-bit ones."""
    bits = IB_COUNTER_BITS.get(counter)
    return None if bits is None else (1 << bits) - 1


def ib_counters(inp: CheckInput) -> List[Finding]:
    window = inp.threshold("ib_counters_window_s")
    findings: List[Finding] = []
    for port in inp.ports_to_watch():
        over, saturated = [], []
        for name in IB_COUNTERS:
            value = port.counters.get(name)
            if value is None:
                continue      # "N/A (no PMA)" or unreadable
            maximum = saturation(name)
            if maximum is not None and value >= maximum:
                saturated.append({"counter": name, "value": value, "max": maximum})
                continue      # it no longer counts: any growth would read as none
            grown = growth(inp.history.get(_key(port, name), []), value, inp.now, window)
            if grown is None:
                continue
            limit = inp.threshold(threshold_name(name))
            if grown[0] > limit:
                over.append({"counter": name, "growth": round(grown[0], 3), "limit": limit, "value": value})
        if not over and not saturated:
            continue
        parts = []
        if over:
            text = ", ".join(f"{o['counter']} +{o['growth']:.0f}" for o in over)
            parts.append(f"error counters growing ({text} within {window:g} s)")
        if saturated:
            text = ", ".join(f"{s['counter']} at {s['value']}" for s in saturated)
            parts.append(f"saturated, growth unknown until cleared ({text})")
        findings.append(inp.finding("ib.counters", "warn", f"IB port {port.name}: " + "; ".join(parts),
                                    port=port, evidence={"window_s": window, "over": over, "saturated": saturated}))
    return findings
