"""One decider per node at a time: the prolog, the epilog and the health check of one node can
run at the same moment, and each reads the node from Slurm, decides and drains. Without an
order, two of them both see the node in service and both drain it (a double drain, and two
reasons racing). ``deciding_alone`` holds a lock in the state dir from the Slurm read to the
applied decision, so the second one reads the node the first one drained.

The wait has a deadline (a hook must finish under slurmd's kill), and a lock that cannot be had
(the deadline passed, the state dir is read-only or full) is said and the hook decides anyway:
a drain is never lost for want of a lock; at worst the same reason is set twice.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from ..config.settings import SlurmSettings
from ..safeio import fsutil


@contextlib.contextmanager
def deciding_alone(state_dir: str, node: str, wait_s: float) -> Iterator[Optional[str]]:
    """Hold this node's decision lock; yields None, or why the decision is made without it."""
    path = os.path.join(state_dir, "actions", f".{fsutil.path_component(node)}.decide.lock")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(fsutil.locked(path, wait_s))
        except (OSError, ValueError) as exc:
            yield f"deciding without the node's decision lock: {exc}"
            return
        yield None


def decision_lock_wait_s(config) -> float:
    """How long a hook waits for another's decision: two Slurm calls' worth ([slurm] timeout_s)."""
    return 2 * config.typed(SlurmSettings).timeout_s
