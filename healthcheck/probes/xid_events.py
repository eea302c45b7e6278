"""The kernel-log probe: Xid/SXid events the log gained since this consumer's last commit.

Each consumer keeps its own cursor, ``<node>.<tier>`` for the hooks and
``<node>.cli.<tier>`` for ``slurm-gpu check``, so an admin's check never takes new lines
away from the health check, nor the health check from the prolog.

The probe saves nothing: ``KernelLogFacts.read`` holds the new cursor and flood state, and
the runner's commit step saves them after the caller acted on the events.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional

from ..facts import KernelLogFacts


def cursor_name(node: str, tier: str, consumer: str = "hook") -> str:
    return f"{node}.{tier}" if consumer == "hook" else f"{node}.{consumer}.{tier}"


def probe_kernel_log(kernel_log: str, state_dir: str, node: str, tier: str, config: Any,
                     gpus: Iterable[Any] = (), now: Optional[float] = None,
                     consumer: str = "hook") -> KernelLogFacts:
    reader = cursor_name(node, tier, consumer)
    if _nothing_new(kernel_log, state_dir, reader):
        # The common run: a read would find no line and commit the state it loaded (the flood
        # state ages by the clock when it is next loaded). Skipped, and so is loading the reader.
        return KernelLogFacts(source=os.path.abspath(kernel_log))
    from ..kernellog.api import KernelLogError, read_new_events

    try:
        read = read_new_events(kernel_log, state_dir, reader, config=config,
                               gpus=gpus, now=now)
    except (KernelLogError, ValueError) as exc:
        return KernelLogFacts(status="error", source=kernel_log, message=str(exc))
    return KernelLogFacts(source=read.source, events=read.events, rescan=read.rescan, capped=read.capped, read=read)


def _nothing_new(kernel_log: str, state_dir: str, reader: str) -> bool:
    """A plain-file log this reader has read to its end (kmsg and the journal: never known)."""
    if kernel_log in ("auto", "kmsg", "journal", "-"):
        return False
    from ..kernellog.cursor import file_unchanged

    try:
        return file_unchanged(kernel_log, state_dir, reader)
    except (OSError, ValueError):
        return False            # the read says what is wrong
