"""What the hooks cost the shared pieces, read on the lab (bench/scale, tests/lab/test_lab_scale.py).

slurmctld counts the RPCs it served by message type and by user (``sdiag``; ``sdiag -r`` zeroes
them); /proc gives each daemon's CPU (its own, and that of the children it waited for: the
hooks slurmd and slurmscriptd run), its memory and its wake-ups. The parsing is pure; the reads
name the process they read.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Mapping, Optional

from . import daemons as D
from . import watchers
from .paths import LabPaths

_RPC_LINE = re.compile(r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)\b")

# What the hooks may ask slurmctld (healthcheck.slurm.cli_backend): a job (scontrol/squeue),
# a node (scontrol show node: its partitions too), a drain, a resume or a note (update), a
# reboot. A federation lookup is what a command without --local asks first.
HOOK_RPC_TYPES = ("REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_INFO", "REQUEST_FED_INFO", "REQUEST_NODE_INFO",
                  "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO", "REQUEST_UPDATE_NODE",
                  "REQUEST_REBOOT_NODES")

CONTROLLER = ("slurmctld", "slurmscriptd", "slurmdbd", "mariadbd")

# One host holds every simulated node's slurmd, slurmstepd and hook processes, and each needs pids
# (threads count). At 256 nodes a host with the kernel's old default pid_max (32,768) ran out
# twice here: slurmctld, then slurmdbd died at pthread_create (EAGAIN). 4,194,304 is what systemd
# sets on 64-bit hosts (sysctl.d/50-pid-max.conf); 64 nodes ran with 32,768.
PID_MAX_WANTED = 4194304
PID_MAX_ENOUGH_UP_TO_NODES = 64


def pid_room_problem(pid_max: int, nodes: int) -> Optional[str]:
    """Why this host cannot simulate ``nodes`` nodes (a one-line reason), or None when it can."""
    if nodes <= PID_MAX_ENOUGH_UP_TO_NODES or pid_max >= PID_MAX_WANTED:
        return None
    return (f"kernel.pid_max is {pid_max}: {nodes} simulated nodes need {PID_MAX_WANTED} (as systemd sets it); "
            f"run 'sysctl -w kernel.pid_max={PID_MAX_WANTED}' first")


def parse_sdiag(text: str) -> Dict[str, Dict[str, int]]:
    """``sdiag``'s two RPC tables: {"by_type": {name: count}, "by_user": {name: count}}; slurmdbd's
    (``sacctmgr show stats``) are in the same form."""
    tables: Dict[str, Dict[str, int]] = {"by_type": {}, "by_user": {}}
    current: Optional[Dict[str, int]] = None
    for line in text.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            current = tables["by_type"]
        elif line.startswith("Remote Procedure Call statistics by user"):
            current = tables["by_user"]
        elif line and not line[0].isspace():
            current = None
        elif current is not None:
            match = _RPC_LINE.match(line)
            if match:
                current[match.group(1)] = current.get(match.group(1), 0) + int(match.group(3))
    return tables


def hook_rpcs(by_type: Mapping[str, int]) -> int:
    """The RPCs of the types a hook sends (``HOOK_RPC_TYPES``)."""
    return sum(by_type.get(name, 0) for name in HOOK_RPC_TYPES)


def dbd_writes(by_type: Mapping[str, int]) -> int:
    """slurmdbd's job modifications (``sacctmgr modify job ... set AdminComment=``: our records)."""
    return sum(count for name, count in by_type.items() if name.startswith("DBD_MODIFY"))


def minus(on: Mapping[str, float], off: Mapping[str, float]) -> Dict[str, float]:
    """``on - off`` for every key of either (a key missing from one counts 0)."""
    return {key: on.get(key, 0) - off.get(key, 0) for key in sorted(set(on) | set(off))}


def percentile(values: List[float], share: float) -> Optional[float]:
    """The nearest-rank percentile (``share`` 0.5, 0.99); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


# -- /proc ------------------------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def cpu_seconds(pid: int) -> Dict[str, float]:
    """{"self": utime+stime, "children": cutime+cstime} of ``pid`` in seconds ({} once it is gone)."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return {}
    fields = text[text.rindex(")") + 2:].split()
    tick = os.sysconf("SC_CLK_TCK")
    # after the name: state is field 3, utime 14, stime 15, cutime 16, cstime 17 (proc(5))
    utime, stime, cutime, cstime = (int(fields[i - 3]) for i in (14, 15, 16, 17))
    return {"self": (utime + stime) / tick, "children": (cutime + cstime) / tick}


def status(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM (KiB) and the context switches of every thread of ``pid`` (its wake-ups)."""
    found: Dict[str, int] = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    switches = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        threads = []
    for tid in threads:
        for line in _read(f"/proc/{pid}/task/{tid}/status").splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                switches += int(value)
    found["switches"] = switches
    try:
        found["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return found


def lab_pids(lab: LabPaths) -> Dict[str, int]:
    """Every lab daemon by name ("slurmctld", "slurmd gpu7", "watch gpu7", "slurmscriptd", ...)."""
    pids: Dict[str, int] = {}
    for daemon in D.daemons(lab):
        pid = daemon.pid(lab)
        if pid is not None:
            pids[daemon.name] = pid
    for node in lab.nodes():
        pid = watchers.pid(lab, node)
        if pid is not None:
            pids[f"watch {node}"] = pid
    ctld = pids.get("slurmctld")
    if ctld is not None:
        for pid in D.all_pids():
            # slurmctld's own fork, renamed: its comm says so, its executable does not
            if _read(f"/proc/{pid}/comm").strip() == "slurmscriptd" and ctld in D.ancestors(pid):
                pids["slurmscriptd"] = pid
                break
    return pids


def snapshot(pids: Mapping[str, int]) -> Dict[str, Dict[str, float]]:
    """CPU and status of each named process now."""
    out: Dict[str, Dict[str, float]] = {}
    for name, pid in pids.items():
        out[name] = dict(cpu_seconds(pid), **status(pid))
    return out


def cpu_between(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]],
                names: Iterable[str], part: str = "self") -> float:
    """The CPU seconds ``names`` spent between two snapshots (``part``: "self" or "children")."""
    return round(sum(after.get(n, {}).get(part, 0.0) - before.get(n, {}).get(part, 0.0) for n in names), 3)
