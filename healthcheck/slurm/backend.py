"""The interface between this project and Slurm."""
from __future__ import annotations

from ..plain import field, plain
from typing import Dict, List, Optional, Protocol, Tuple

# How Slurm 22.05 spells a node's state. ``scontrol show node -o`` writes the base state and
# every flag joined by "+" ("IDLE+DRAIN+NOT_RESPONDING", "MIXED+DRAIN", "IDLE+MAINTENANCE+RESERVED");
# sinfo's short forms add "*" for not responding ("idle*", "drained*"). Measured on the lab
# (tests/fixtures/slurm/) and read from src/common/slurm_protocol_defs.c.
BASE_STATES = ("UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE")
NOT_RESPONDING = "NOT_RESPONDING"
DRAIN_FLAGS = ("DRAIN", "DRAINED", "DRAINING")
# What a job's NodeList says when it names no node: sacct's "None assigned", scontrol's "(null)"
# (CliBackend's too, for a job that `scontrol --json` gives no nodes: a NODE_FAIL job on 26.05, once).
NO_NODES = ("(null)", "None assigned")


class SlurmError(Exception):
    """A Slurm command failed or could not be run; the message is one line."""


@plain
class NodeInfo:
    name: str
    state: str                              # as Slurm printed it, e.g. "IDLE", "MIXED+DRAIN", "DOWN*"
    reason: str = ""
    reason_user: str = ""
    reason_time: str = ""                   # when the reason was set, as Slurm printed it
    raw: Dict[str, str] = field(default_factory=dict)
    reason_epoch: Optional[float] = None    # when the reason was set (seconds since the epoch)
    partitions: List[str] = field(default_factory=list)
    extra: str = ""                         # the node's Extra (an admin's text; ours: actions/kept.py)
    boot_epoch: Optional[float] = None      # the node's BootTime (seconds since the epoch), None when unknown

    @property
    def flags(self) -> List[str]:
        """The base state and every flag, upper case, "*" turned into NOT_RESPONDING."""
        out: List[str] = []
        for word in self.state.upper().split("+"):
            if word.endswith("*"):
                word = word.rstrip("*")
                out.append(NOT_RESPONDING)
            if word:
                out.append(word)
        return out

    @property
    def base(self) -> str:
        flags = self.flags
        return next((flag for flag in flags if flag in BASE_STATES), flags[0] if flags else "UNKNOWN")

    def has(self, *names: str) -> bool:
        flags = self.flags
        return any(name in flags for name in names)

    @property
    def gres(self) -> str:
        """The node's Gres as Slurm printed it ("gpu:h100:8(S:0-1)"; "" when not known)."""
        return self.raw.get("Gres", "")

    @property
    def drained(self) -> bool:
        return self.has(*DRAIN_FLAGS)

    @property
    def down(self) -> bool:
        return self.has("DOWN")

    @property
    def responding(self) -> bool:
        return not self.has(NOT_RESPONDING)


@plain
class JobInfo:
    job_id: str
    fields: Dict[str, str]
    problem: str = ""                       # what could not be read trustworthily, in words; "" when all was

    def get(self, key: str, default: str = "") -> str:
        return self.fields.get(key, default)


class SlurmBackend(Protocol):
    def node(self, name: str) -> NodeInfo: ...
    def nodes(self) -> List[NodeInfo]: ...
    def drain(self, name: str, reason: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def reboot(self, name: str, reason: str) -> None: ...
    def set_extra(self, name: str, text: str) -> None: ...
    def job(self, job_id: str) -> Optional[JobInfo]: ...
    def set_admin_comment(self, job_id: str, text: str) -> None: ...
    def accounting(self, job_ids: List[str], fields: List[str],
                   every_incarnation: bool = False) -> List[Dict[str, str]]: ...
    def expand_hostlist(self, expression: str) -> List[str]: ...
    def sinfo_nodes(self) -> List[NodeInfo]: ...


def local_epoch(text: str) -> Optional[float]:
    """scontrol's "2026-11-30T14:43:09" (the controller's local time) as seconds since the epoch."""
    import time

    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def assigned_nodes(node_list: Optional[str]) -> str:
    """A job's NodeList as Slurm printed it, or "" when it names no node (``NO_NODES``)."""
    return "" if not node_list or node_list in NO_NODES else node_list


def gpu_gres(text: str) -> Dict[str, int]:
    """The GPUs a node's Gres promises, type -> count ("" for untyped): ``gpu:8`` -> {"": 8},
    ``gpu:h100:4(S:0),gpu:h100:4(S:1),shard:16`` -> {"h100": 8}. Other GRES (mps, shard) are
    not GPUs; "(null)" or "" promise none. A count is the last field and a bare ``gpu`` or
    ``gpu:TYPE`` is one (slurm.conf's rule); ``no_consume`` is a flag, not a type. Anything else
    is a ValueError naming the entry."""
    out: Dict[str, int] = {}
    for entry in _outside_parentheses(text.strip()):
        fields = [f for f in entry.split("(", 1)[0].strip().split(":") if f != "no_consume"]
        if entry.strip() in ("", "(null)") or fields[0] != "gpu":
            continue
        count = 1
        if len(fields) > 1 and fields[-1].isascii() and fields[-1].isdigit():
            count = int(fields.pop())
        if len(fields) > 2 or any(not f for f in fields):
            raise ValueError(f"Gres entry {entry!r} is not gpu[:TYPE][:COUNT]")
        gpu_type = fields[1] if len(fields) == 2 else ""
        out[gpu_type] = out.get(gpu_type, 0) + count
    return out


def _outside_parentheses(text: str) -> List[str]:
    """``text`` split at the commas that are not inside "(S:0,1)"."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def one_node(name: str) -> str:
    """``name`` when it names one node; a hostlist (``gpu[1-3]``, ``gpu1,gpu2``) is refused:
    scontrol would change every node in it, ours or not, and the drain gate decides per node."""
    if not name or any(ch in name for ch in "[],= \t\n"):
        raise SlurmError(f"{name!r} is not one node name: a node is changed one at a time")
    return name


def drain_argv(name: str, reason: str) -> Tuple[str, ...]:
    """scontrol's arguments for a drain: what ``--dry-run`` prints and the backend runs."""
    return ("update", f"nodename={name}", "state=drain", f"reason={reason}")


def resume_argv(name: str) -> Tuple[str, ...]:
    return ("update", f"nodename={name}", "state=resume")


def extra_argv(name: str, text: str) -> Tuple[str, ...]:
    """The node's Extra set to ``text`` (the whole field: the caller merged ours into what was
    there, ``actions/kept.py``). Slurm keeps it across the node's reboots and slurmctld's
    restarts (measured: docs/slurm-versions.md)."""
    return ("update", f"nodename={name}", f"extra={text}")


def reboot_argv(name: str, reason: str) -> Tuple[str, ...]:
    """A reboot once the node is idle (ASAP: it takes no new job meanwhile), with our reason kept
    on the node, and no ``nextstate``: on Slurm 24.11 and 26.05 the drain set before the reboot
    then survives it (the node registers IDLE+DRAIN with our reason), so the node takes no job
    until a health check after the boot passes and resumes it; a fault still there keeps it
    drained. ``nextstate=RESUME`` would clear the drain at registration, before any check of
    ours could judge the new boot. 22.05 resumes the node after the reboot either way (its
    default next state is RESUME). Measured in the lab: docs/slurm-versions.md."""
    return ("reboot", "ASAP", f"reason={reason}", name)
