"""``slurm-gpu-watch``'s own metrics: a Prometheus textfile beside the health check's, so that a
watcher that died, hangs or can no longer read the kernel log is seen (``SlurmGpuWatcherStalled``
in etc/prometheus/slurm-gpu-hooks.rules.yml) instead of the node silently waiting for the next
HealthCheckInterval.

Written with the health check's writer (``safeio.textfile.publish``: atomic, 0644 in a 0755
directory whatever the umask) into ``[health] textfile_dir`` as ``slurm_gpu_watch_<node>.prom``
(one file per node, as the health check's, so nodes that share a directory, as the lab's do,
keep theirs apart). When: in a turn of the watcher's loop that happens anyway, at most once a
``WRITE_EVERY_S`` and at once after a health-check run it started. No timer of its own: the
watcher wakes no more often than before (issue 30's budget for an idle node).
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

from ..plain import plain
from ..safeio.fsutil import path_component
from ..safeio.textfile import Family, exposition, publish
from . import say

# An idle watcher rewrites its file this often; SlurmGpuWatcherStalled allows several of them
# (and node_exporter's and Prometheus's own intervals) before it says the watcher stalled.
WRITE_EVERY_S = 60.0


@plain
class Snapshot:
    """What the watcher has done since it started (wall-clock times, None: not yet)."""
    looked_at: Optional[float] = None       # its kernel-log source last found in order
    line_at: Optional[float] = None         # a kernel-log line last read
    lines_read: int = 0
    triggers: int = 0                       # health-check runs started (or tried)
    errors: int = 0                         # looks at the kernel log that failed


def textfile_name(node: str) -> str:
    return f"slurm_gpu_watch_{path_component(node)}.prom"


def textfile_place(config: Any, health_dir: str) -> Tuple[str, bool]:
    """Where the file goes, as the health check's: ``[health] textfile_dir`` (relative: to the
    config file's), or ``health_dir`` (``<state_dir>/health``) when it is empty; and whether it
    was configured."""
    from ..config.settings import HealthSettings

    configured = config.typed(HealthSettings).textfile_dir
    return (config.resolve(configured), True) if configured else (health_dir, False)


def _when(at: Optional[float]) -> float:
    return round(at, 3) if at is not None else 0


def families(snapshot: Snapshot) -> List[Family]:
    """The watcher's families; every one on every write, so an alert or a panel finds each."""
    return [
        Family("slurm_gpu_watch_last_look_timestamp_seconds", "gauge",
               "When slurm-gpu-watch last found its kernel log in order: a read that worked, or nothing "
               "new since one (0: not yet).", [({}, _when(snapshot.looked_at))]),
        Family("slurm_gpu_watch_last_line_timestamp_seconds", "gauge",
               "When slurm-gpu-watch last read a kernel-log line (0: none since it started).",
               [({}, _when(snapshot.line_at))]),
        Family("slurm_gpu_watch_lines_read_total", "counter", "Kernel-log lines slurm-gpu-watch read.",
               [({}, snapshot.lines_read)]),
        Family("slurm_gpu_watch_triggers_total", "counter", "Health-check runs slurm-gpu-watch started (or tried to).",
               [({}, snapshot.triggers)]),
        Family("slurm_gpu_watch_read_errors_total", "counter", "Looks at the kernel log that failed.",
               [({}, snapshot.errors)]),
    ]


class Series:
    """When to write the file (``due``) and writing it (``write``); a file that cannot be written
    is said once (until that changes) and never stops the watcher."""

    def __init__(self, node: str, directory: str, explicit: bool, every_s: float = WRITE_EVERY_S):
        self.node, self.directory, self.explicit = node, directory, explicit
        self.every_s = float(every_s)
        self.path = os.path.join(directory, textfile_name(node))
        self.written_at: Optional[float] = None      # monotonic
        self.written_triggers = 0
        self.writes = 0
        self._said: Optional[str] = None

    def due(self, now: float, triggers: int) -> bool:
        return self.written_at is None or triggers != self.written_triggers or now - self.written_at >= self.every_s

    def write(self, now: float, snapshot: Snapshot) -> None:
        try:
            problems = publish(self.directory, os.path.basename(self.path),
                               exposition(families(snapshot), self.node), self.explicit)
        except OSError as exc:
            problems = [f"metrics textfile {self.path} not written: {exc.strerror or exc}"]
        # Tried, worked or not: the next try is a WRITE_EVERY_S later, never every turn.
        self.written_at, self.written_triggers = now, snapshot.triggers
        self.writes += 1
        text = "; ".join(problems) or None
        if text is not None and text != self._said:
            say(f"{self.node}: {text}")
        self._said = text
