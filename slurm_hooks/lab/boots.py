"""A lab node's boot: when it last (simulated) booted, kept as a wall-clock time in
``$LAB/var/run/boot-<node>``, and the time namespace that gives its slurmd that boot's uptime
(``unshare --time --boottime``: slurmd reports its uptime from ``sysinfo(2)``, which follows the
namespace, and Slurm derives the node's BootTime from it). A slurmd that ``lab up`` restarts for
another reason comes back in the same boot (a later boot time would be "Node unexpectedly
rebooted" to slurmctld); only the RebootProgram (``reboot.py``) starts a new one.
"""
from __future__ import annotations

import os
import time
from typing import List, Optional

from .paths import LabPaths


def boot_file(lab: LabPaths, node: str) -> str:
    return os.path.join(lab.run, f"boot-{node}")


def _host_uptime() -> float:
    """This host's uptime (the root time namespace's), whatever namespace we run in: /proc/uptime
    shows ours, /proc/self/timens_offsets how far ours is from the host's."""
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime = float(handle.read().split()[0])
    try:
        with open("/proc/self/timens_offsets", encoding="ascii") as handle:
            for line in handle:
                parts = line.split()
                if parts and parts[0] in ("boottime", "7"):
                    uptime -= int(parts[1]) + int(parts[2]) / 1e9
    except OSError:
        pass
    return uptime


def boottime_offset(boot_epoch: Optional[float], now: Optional[float] = None,
                    host_uptime: Optional[float] = None) -> int:
    """The ``--boottime`` offset (whole seconds, never positive) that makes a namespace's uptime
    ``now - boot_epoch``; 0 (the host's boot) when the node has no boot of its own or it would
    precede the host's."""
    if boot_epoch is None:
        return 0
    now = time.time() if now is None else now
    host_uptime = _host_uptime() if host_uptime is None else host_uptime
    wanted = max(0.0, now - boot_epoch)
    return min(0, int(wanted - host_uptime))


def node_boot(lab: LabPaths, node: str) -> Optional[float]:
    try:
        with open(boot_file(lab, node), encoding="ascii") as handle:
            return float(handle.read().strip())
    except (OSError, ValueError):
        return None


def slurmd_prefix(lab: LabPaths, node: str, unshare: str) -> List[str]:
    """What goes before ``slurmd -N node`` so that it runs in the node's boot."""
    offset = boottime_offset(node_boot(lab, node))
    return [unshare, "--time", f"--boottime={offset}"] if offset else []


