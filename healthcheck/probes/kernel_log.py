"""The kernel-log probe: Xid/SXid events the log gained since this consumer's last commit.

Each consumer keeps its own cursor, ``<node>.<tier>`` for the hooks and
``<node>.cli.<tier>`` for ``slurm-gpu check``, so an admin's check never takes new lines
away from the health check, nor the health check from the prolog.

The probe saves nothing: ``KernelLogFacts.read`` holds the new cursor and flood state, and
the runner's commit step saves them after the caller acted on the events.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ..facts import KernelLogFacts


def cursor_name(node: str, tier: str, consumer: str = "hook") -> str:
    return f"{node}.{tier}" if consumer == "hook" else f"{node}.{consumer}.{tier}"


def probe_kernel_log(kernel_log: str, state_dir: str, node: str, tier: str, config: Any,
                     gpus: Iterable[Any] = (), now: Optional[float] = None,
                     consumer: str = "hook") -> KernelLogFacts:
    from ..kernellog.api import KernelLogError, read_new_events

    try:
        read = read_new_events(kernel_log, state_dir, cursor_name(node, tier, consumer), config=config,
                               gpus=gpus, now=now)
    except (KernelLogError, ValueError) as exc:
        return KernelLogFacts(status="error", source=kernel_log, message=str(exc))
    return KernelLogFacts(source=read.source, events=read.events, rescan=read.rescan, capped=read.capped, read=read)
