"""The kernel-log probe: Xid/SXid events the log gained since this consumer's last read.

Each consumer keeps its own cursor (the health check's is the node's; an on-demand
``slurm-gpu check`` of another tier gets ``<node>.<tier>``), so an admin's check never
takes new lines away from the health check.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ..facts import KernelLogFacts


def cursor_name(node: str, tier: str) -> str:
    return node if tier == "health" else f"{node}.{tier}"


def probe_kernel_log(kernel_log: str, state_dir: str, node: str, tier: str, config: Any,
                     gpus: Iterable[Any] = (), now: Optional[float] = None) -> KernelLogFacts:
    from ..kernellog.api import KernelLogError, read_new_events

    try:
        read = read_new_events(kernel_log, state_dir, cursor_name(node, tier), config=config, gpus=gpus, now=now)
    except (KernelLogError, ValueError) as exc:
        return KernelLogFacts(status="error", source=kernel_log, message=str(exc))
    return KernelLogFacts(source=read.source, events=read.events, rescan=read.rescan)
