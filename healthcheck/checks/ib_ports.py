"""ib.port: every expected InfiniBand/RoCE port, judged on its own, so one bad rail fails
the node even when the others are fine (NCCL uses them all)."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput

ACTIVE = 4
LINK_UP = 5


def ib_port(inp: CheckInput) -> List[Finding]:
    expected = inp.expected_ports()
    if expected is None or not inp.ib_ok():
        return []       # which ports matter is the admin's to say: an unused port is often down
    want_rate = inp.expected.get("ib_rate_gbps")
    want_layer = inp.expected.get("ib_link_layer")
    findings: List[Finding] = []
    for hca, number in expected:
        port = inp.ib.port(hca, number)
        name = f"{hca}:{number}"
        if port is None:
            findings.append(inp.finding("ib.port", "fail", f"IB port {name} is missing (no such HCA or port in sysfs)",
                                        hca=hca, port_number=number, evidence={"present": False}))
            continue
        problems = []
        if port.state != ACTIVE:
            problems.append(f"state {port.state_text or port.state} (not ACTIVE)")
        if port.phys_state != LINK_UP:
            problems.append(f"physical state {port.phys_state_text or port.phys_state} (not LinkUp)")
        if want_rate and port.rate_gbps != want_rate:
            problems.append(f"rate {port.rate_gbps:g} Gb/s, {want_rate:g} expected" if port.rate_gbps is not None
                            else f"rate unknown ({port.rate_text!r}), {want_rate:g} Gb/s expected")
        if want_layer and port.link_layer != want_layer:
            problems.append(f"link layer {port.link_layer}, {want_layer} expected")
        if problems:
            findings.append(inp.finding(
                "ib.port", "fail", f"IB port {name}: " + "; ".join(problems), port=port,
                evidence={"state": port.state_text, "phys_state": port.phys_state_text, "rate": port.rate_text,
                          "link_layer": port.link_layer, "expected_rate_gbps": want_rate,
                          "expected_link_layer": want_layer}))
    return findings
