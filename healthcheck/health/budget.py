"""The drain budget, a circuit breaker: this tool drains no more than a number of nodes and a
share of the nodes it shares a partition with, counting our drains set within a time window.
A bad rollout or a broken check then drains a few nodes, not the cluster.

Pure: it reads the node list of one Slurm query. Nodes on different hosts decide at the same
time, so after a drain each re-reads the list and the drains beyond the budget (latest first,
then by name: every node ranks them alike) are undone by their own nodes (``keeps_its_drain``).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

from ..drain_reason import is_ours
from ..slurm.backend import NodeInfo
from .policy import HealthPolicy


def _ours_recent(nodes: Sequence[NodeInfo], policy: HealthPolicy, now: float) -> List[NodeInfo]:
    prefix = policy.drain.reason_prefix
    out = []
    for node in nodes:
        if not (node.drained and is_ours(node.reason, prefix)):
            continue
        since = node.reason_epoch
        if since is None or now - since <= policy.budget_window_s:
            out.append(node)
    return out


def _peers(nodes: Sequence[NodeInfo], me: str) -> List[NodeInfo]:
    mine = next((node for node in nodes if node.name == me), None)
    if mine is None or not mine.partitions:
        return list(nodes)
    wanted = set(mine.partitions)
    return [node for node in nodes if wanted & set(node.partitions)]


def limit(nodes: Sequence[NodeInfo], me: str, policy: HealthPolicy) -> Optional[int]:
    """How many of our drains the budget allows; None: no limit."""
    limits = []
    if policy.budget_max_nodes > 0:
        limits.append(policy.budget_max_nodes)
    if policy.budget_max_fraction > 0:
        limits.append(max(1, math.floor(policy.budget_max_fraction * len(_peers(nodes, me)))))
    return min(limits) if limits else None


def over_budget(nodes: Sequence[NodeInfo], me: str, policy: HealthPolicy, now: float) -> Optional[str]:
    """Why one more drain (``me``'s) would exceed the budget; None when it would not."""
    if not policy.budget_enabled:
        return None
    allowed = limit(nodes, me, policy)
    if allowed is None:
        return None
    drained = [node.name for node in _ours_recent(nodes, policy, now) if node.name != me]
    if len(drained) + 1 <= allowed:
        return None
    return (f"drain budget spent: {len(drained)} node(s) drained by this tool within "
            f"{policy.budget_window_s:g} s ({', '.join(sorted(drained)[:8])}), at most {allowed}")


def keeps_its_drain(nodes: Sequence[NodeInfo], me: str, policy: HealthPolicy, now: float) -> bool:
    """After draining ``me``: whether its drain is within the budget once concurrent drains
    by other nodes are counted. The earliest drains keep their place."""
    if not policy.budget_enabled:
        return True
    allowed = limit(nodes, me, policy)
    if allowed is None:
        return True
    ranked = sorted(_ours_recent(nodes, policy, now), key=lambda n: (n.reason_epoch or 0.0, n.name))
    names = [node.name for node in ranked]
    return me not in names or names.index(me) < allowed
