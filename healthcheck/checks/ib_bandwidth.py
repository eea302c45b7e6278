"""ib.bandwidth: what perftest's ``ib_write_bw`` loopback measured between this node's own
ports, against ``[thresholds] ib_bandwidth_min_pct`` of the slower port's rate. A link can be
ACTIVE at full rate and still deliver a fraction of it (a bad cable, PCIe, a congested or
misconfigured fabric); only moving data shows it."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput


def _split(name: str):
    hca, _, port = name.partition(":")
    return hca, int(port or 1)


def ib_bandwidth(inp: CheckInput) -> List[Finding]:
    facts = inp.ib_bandwidth
    if facts is None or facts.status == "unsupported":
        return []       # perftest is optional: without it the check is unsupported, never a failure
    if facts.status != "ok":
        return [_not_drained(inp.finding("ib.bandwidth", "error", facts.message or "ib_write_bw could not run",
                                         evidence={"program": facts.program}))]
    min_pct = inp.threshold("ib_bandwidth_min_pct")
    findings: List[Finding] = []
    for result in facts.results:
        hca, port = _split(result.client)
        pair = result.client if result.client == result.server else f"{result.client} -> {result.server}"
        evidence = {"client": result.client, "server": result.server, "rate_gbps": result.rate_gbps,
                    "measured_gbps": result.bw_avg_gbps, "message_bytes": result.message_bytes,
                    "min_pct": min_pct}
        if result.status != "ok":
            # A run that hangs between two ACTIVE ports is a fabric or HCA problem ([actions]
            # decides); one that fails to start is reported, never drained for.
            finding = inp.finding("ib.bandwidth", "fail" if result.status == "timeout" else "error",
                                  f"IB write bandwidth {pair}: {result.message}", hca=hca, port_number=port,
                                  evidence=dict(evidence, status=result.status))
            findings.append(finding if result.status == "timeout" else _not_drained(finding))
            continue
        if result.rate_gbps is None or result.bw_avg_gbps is None:
            continue
        expected = result.rate_gbps * min_pct / 100.0
        if result.bw_avg_gbps < expected:
            findings.append(inp.finding(
                "ib.bandwidth", "fail",
                f"IB write bandwidth {pair}: {result.bw_avg_gbps:g} Gb/s measured, at least {expected:g} Gb/s "
                f"expected ({min_pct:g}% of {result.rate_gbps:g} Gb/s)",
                hca=hca, port_number=port, evidence=dict(evidence, expected_gbps=expected)))
    return findings


def _not_drained(finding: Finding) -> Finding:
    """perftest failing to run (permissions, a missing library) is the tool's problem: report
    it, never drain for it."""
    if finding.action == "drain":
        finding.action = "warn"
    return finding
