"""The cluster budget, a circuit breaker: one mechanism for our drains and our reboots.

A limit (``Budget``) counts what this tool has done across the cluster from one Slurm node list:
our drains set within a window ([health] budget_*: a bad rollout or a broken check drains a few
nodes, not the cluster), or the nodes rebooting at our request ([remediate] max_rebooting_nodes).
Nodes on different hosts act at the same moment, each after one query that cannot see the
others yet; so ``settle`` is the one act-settle-reread-undo: act (the drain, a claim to reboot),
wait until every node acting now has acted, read the nodes again, keep the act only when the
ranking (the same on every node) puts it within the limit, else undo it.
"""
from __future__ import annotations

import math
import time
from typing import Callable, List, Optional, Sequence

from ..drain_reason import is_ours
from ..config.settings import Budget
from ..slurm.backend import NodeInfo

# The re-read waits this long, so every concurrent act (slurmd fires every node's health check on
# one interval) is visible to every node and all rank alike; else two nodes each see only themselves.
SETTLE_S = 2.0


def settle(reread: Callable[[], Sequence[NodeInfo]], keeps: Callable[[Sequence[NodeInfo]], bool],
           undo: Callable[[], None]) -> bool:
    """After our act: wait ``SETTLE_S``, read the nodes again; True when ``keeps`` holds, else the
    act is undone (``undo``) and False. Slurm's errors go to the caller."""
    time.sleep(SETTLE_S)
    if keeps(reread()):
        return True
    undo()
    return False


def _ours_recent(nodes: Sequence[NodeInfo], budget: Budget, prefix: str, now: float) -> List[NodeInfo]:
    return [node for node in nodes if node.drained and is_ours(node.reason, prefix)
            and (node.reason_epoch is None or now - node.reason_epoch <= budget.window_s)]


def _peers(nodes: Sequence[NodeInfo], me: str) -> List[NodeInfo]:
    mine = next((node for node in nodes if node.name == me), None)
    if mine is None or not mine.partitions:
        return list(nodes)
    wanted = set(mine.partitions)
    return [node for node in nodes if wanted & set(node.partitions)]


def limit(nodes: Sequence[NodeInfo], me: str, budget: Budget) -> Optional[int]:
    """How many of our drains the budget allows; None: no limit."""
    limits = []
    if budget.max_nodes > 0:
        limits.append(budget.max_nodes)
    if budget.max_fraction > 0:
        limits.append(max(1, math.floor(budget.max_fraction * len(_peers(nodes, me)))))
    return min(limits) if limits and budget.enabled else None


def over_budget(nodes: Sequence[NodeInfo], me: str, budget: Budget, prefix: str, now: float) -> Optional[str]:
    """Why one more drain (``me``'s) would exceed the budget; None when it would not."""
    allowed = limit(nodes, me, budget)
    drained = [node.name for node in _ours_recent(nodes, budget, prefix, now) if node.name != me]
    if allowed is None or len(drained) + 1 <= allowed:
        return None
    return (f"drain budget spent: {len(drained)} node(s) drained by this tool within "
            f"{budget.window_s:g} s ({', '.join(sorted(drained)[:8])}), at most {allowed}")


def keeps_its_drain(nodes: Sequence[NodeInfo], me: str, budget: Budget, prefix: str, now: float) -> bool:
    """After draining ``me``: whether its drain is within the budget once concurrent drains
    by other nodes are counted. The earliest drains keep their place (then by name)."""
    allowed = limit(nodes, me, budget)
    ranked = sorted(_ours_recent(nodes, budget, prefix, now), key=lambda n: (n.reason_epoch or 0.0, n.name))
    names = [node.name for node in ranked]
    return allowed is None or me not in names or names.index(me) < allowed
