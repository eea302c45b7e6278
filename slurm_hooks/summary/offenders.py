"""Repeat offenders: nodes ranked by hardware-caused job endings and by drains, each per 1,000
node-hours (the hours jobs ran on the node in the window), and flagged when well above the
fleet's rate even if no single check ever drained them. Pure.

"Well above" is three tests together (thresholds from ``[summary]`` in the config): at least
``offender_min_events`` events, at least ``offender_ratio`` times what the fleet's rate
predicts for the node's hours, and a Poisson tail probability for seeing that many by chance
at the fleet's rate of at most ``offender_max_p`` divided by the number of nodes that ran jobs
(Bonferroni: with a thousand nodes, some node is always unlucky at p = 0.01). A busy node is
not flagged for being busy, and one unlucky ending on an idle node is not a pattern.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional

from healthcheck.config.settings import OffenderRules

from .tally import NodeTally

PER = 1000.0        # rates are per 1,000 node-hours


def poisson_tail(k: int, expected: float) -> float:
    """P(X >= k) for X ~ Poisson(expected)."""
    if k <= 0:
        return 1.0
    if expected <= 0:
        return 0.0
    below = 0.0
    log_expected = math.log(expected)
    for i in range(k):
        below += math.exp(i * log_expected - expected - math.lgamma(i + 1))
    return max(0.0, min(1.0, 1.0 - below))


def _rate(events: int, hours: float) -> Optional[float]:
    return round(events / hours * PER, 3) if hours > 0 else None


def _judge(kind: str, events: int, hours: float, fleet_rate: float, rules: OffenderRules,
           tested: int) -> Optional[str]:
    if events < rules.min_events or hours <= 0:
        return None
    expected = fleet_rate * hours / PER
    if events < rules.ratio * expected:
        return None
    p = poisson_tail(events, expected)
    if p > rules.max_p / max(tested, 1):
        return None
    times = f"{events / expected:.1f}x" if expected > 0 else "far above"
    return (f"{events} {kind} in {hours:.1f} node-hours: {events / hours * PER:.1f} per 1,000 node-hours, "
            f"{times} the fleet's {fleet_rate:.2f} (p={p:.2g})")


def fleet_rates(nodes: Mapping[str, NodeTally]) -> Dict[str, float]:
    hours = sum(t.node_seconds for t in nodes.values()) / 3600.0
    hardware = sum(t.hardware for t in nodes.values())
    drains = sum(t.drains for t in nodes.values())
    return {"node_hours": round(hours, 3),
            "hardware_endings": hardware,
            "drains": drains,
            "hardware_per_1000_node_hours": round(hardware / hours * PER, 3) if hours > 0 else 0.0,
            "drains_per_1000_node_hours": round(drains / hours * PER, 3) if hours > 0 else 0.0}


def rank_nodes(nodes: Mapping[str, NodeTally], rules: OffenderRules) -> List[Dict[str, Any]]:
    """``by_node``: every node that ran a job or was drained, worst first."""
    fleet = fleet_rates(nodes)
    tested = sum(1 for tally in nodes.values() if tally.node_seconds > 0)
    ranked = []
    for name, tally in nodes.items():
        hours = tally.node_seconds / 3600.0
        reasons = [why for why in (
            _judge("hardware-caused endings", tally.hardware, hours, fleet["hardware_per_1000_node_hours"], rules, tested),
            _judge("drains", tally.drains, hours, fleet["drains_per_1000_node_hours"], rules, tested)) if why]
        ranked.append({
            "node": name,
            "jobs": tally.jobs,
            "node_hours": round(hours, 3),
            "hardware_endings": tally.hardware,
            "drains": tally.drains,
            "drains_ours": tally.drains_ours,
            "hardware_per_1000_node_hours": _rate(tally.hardware, hours),
            "drains_per_1000_node_hours": _rate(tally.drains, hours),
            "flagged": bool(reasons),
            "why": "; ".join(reasons),
            "causes": dict(sorted(tally.causes.items(), key=lambda item: (-item[1], item[0]))),
            "xids": {str(code): count for code, count in sorted(tally.xids.items())},
        })
    # Flagged nodes first (their rate stands out), then by how many endings and drains.
    ranked.sort(key=lambda n: (not n["flagged"], -n["hardware_endings"], -n["drains"],
                               -(n["hardware_per_1000_node_hours"] or 0.0), n["node"]))
    return ranked
