"""ib.counters: port error counters growing over a window (a marginal cable or transceiver).

Totals are not judged: counters are cleared rarely, and an old count says nothing about now.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..facts import IB_COUNTERS
from ..findings import Finding
from ..growth import growth
from .base import CheckInput


def _key(port, counter: str) -> str:
    return f"ib/{port.hca}:{port.port}/{counter}"


def threshold_name(counter: str) -> str:
    return f"ib_{counter}_max_per_window"


def ib_counter_samples(inp: CheckInput) -> Dict[str, Tuple[float, float]]:
    window = inp.threshold("ib_counters_window_s")
    return {_key(port, name): (value, window) for port in inp.ports_to_watch()
            for name, value in port.counters.items() if name in IB_COUNTERS and value is not None}


def ib_counters(inp: CheckInput) -> List[Finding]:
    window = inp.threshold("ib_counters_window_s")
    findings: List[Finding] = []
    for port in inp.ports_to_watch():
        over = []
        for name in IB_COUNTERS:
            value = port.counters.get(name)
            if value is None:
                continue      # "N/A (no PMA)" or unreadable
            grown = growth(inp.history.get(_key(port, name), []), value, inp.now, window)
            if grown is None:
                continue
            limit = inp.threshold(threshold_name(name))
            if grown[0] > limit:
                over.append({"counter": name, "growth": round(grown[0], 3), "limit": limit, "value": value})
        if over:
            text = ", ".join(f"{o['counter']} +{o['growth']:.0f}" for o in over)
            findings.append(inp.finding("ib.counters", "warn",
                                        f"IB port {port.name}: error counters growing ({text} within {window:g} s)",
                                        port=port, evidence={"window_s": window, "over": over}))
    return findings
