"""Kernel-log events -> Findings (pure: no I/O, no clock).

One finding per check, code and GPU (an Xid 79 line and its "fallen off the bus" companion are
one finding; so are an Xid 154's successive recovery actions, at the strongest). Check ids:
``kernel.xid`` (Xid and fallen-off-the-bus lines), ``kernel.sxid`` (NVSwitch SXids).

What an Xid does is the ``finding`` column of ``healthcheck/data/xid-actions.tsv`` for its
action (the one rule, also the prolog's and the epilog's: ``judge``):

| finding   | status | Finding.action | meaning                                                        |
| --------- | ------ | -------------- | -------------------------------------------------------------- |
| none      | -      | -              | no finding (ignore)                                            |
| evidence  | ok     | none           | the job's own fault: recorded (for the epilog), the node stays up |
| drain     | fail   | drain          | drain (reset_gpu, reboot, contact_support)                      |

``job`` is "ok", not "warn": a user's out-of-bounds access says nothing about the node, and
repeats on one GPU escalate through ``[xid] escalate`` instead. ``[actions] "kernel.xid"`` (or
``"kernel.sxid"``) in config, when set, replaces "drain" (e.g. "warn" to only report).

Events whose last line was written before the running kernel booted (``before_boot``) never
drain on their own: the reboot was the action most of them ask for. A code and GPU seen only
before the boot is a "warn" finding with action "none" (evidence; ``evidence.before_boot``);
one also seen since the boot is judged on the lines since the boot.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..findings import Finding
from .catalog import catalog_entries
from .events import XidEvent, action_rank, iso_time
from .pci import GpuMap

from .xid_actions import ACTION_TEXT, finding_for

# xid-actions.tsv's "finding" column -> (status, Finding.action): the one Xid-to-drain rule.
# (An action whose finding is "none" makes no finding in xid_findings; judged alone, it drains nothing.)
_STATUS = {"none": ("ok", "none"), "evidence": ("ok", "none"), "drain": ("fail", "drain")}


def judge(action: str, check: str, configured: Mapping[str, str]) -> Tuple[str, str]:
    """(status, Finding.action) of an Xid/SXid finding whose action is ``action``: the one rule
    of every hook. ``[actions] "kernel.xid"`` (``configured``), when set, replaces "drain"."""
    status, finding_action = _STATUS.get(finding_for(action), ("fail", "drain"))
    if finding_action == "drain" and check in configured:
        finding_action = configured[check]
    return status, finding_action


def check_id(event: XidEvent) -> str:
    return "kernel.sxid" if event.kind == "sxid" else "kernel.xid"


def xid_findings(events: Iterable[XidEvent], gpus: Iterable[Any] = (), config: Any = None,
                 actions: Optional[Mapping[str, str]] = None) -> List[Finding]:
    """Findings for events (``KernelLogRead.events`` for the health check, ``events_between``'s
    result for the epilog). ``gpus``: NVML facts, to name the GPU; ``[actions]`` from ``actions``,
    else from ``config``."""
    gpu_map = GpuMap(gpus)
    if actions is None:
        actions = config.section("actions") if config is not None else {}
    configured = dict(actions or {})
    merged: Dict[Tuple[Any, ...], List[XidEvent]] = {}
    for event in events:
        if finding_for(event.action) == "none":
            continue
        key = (check_id(event), event.code, event.pci, event.device)
        merged.setdefault(key, []).append(event)
    findings = [_finding(group, gpu_map, configured) for group in merged.values()]
    return sorted(findings, key=lambda finding: (finding.check, finding.gpu if finding.gpu is not None else -1,
                                                 finding.evidence.get("code", 0)))


def _finding(group: List[XidEvent], gpu_map: GpuMap, configured: Dict[str, str]) -> Finding:
    current = [event for event in group if not event.before_boot]
    strongest = max(current or group, key=lambda event: action_rank(event.action))
    action = strongest.action
    check = check_id(strongest)
    status, finding_action = judge(action, check, configured)
    if not current and status != "ok":
        status, finding_action = "warn", "none"
    index, uuid, bus_id = gpu_map.lookup(strongest.pci) if strongest.kind != "sxid" else (None, None, None)
    index = index if index is not None else strongest.gpu
    uuid = uuid or strongest.uuid
    # An Xid 79 line and its "fallen off the bus" line report one fall: count the kind seen most.
    per_kind: Dict[str, int] = {}
    for event in group:
        per_kind[event.kind] = per_kind.get(event.kind, 0) + event.count
    count = max(per_kind.values())
    first = _least(event.first_seen for event in group)
    last = _most(event.last_seen for event in group)
    evidence = {
        "code": strongest.code,
        "kind": sorted({event.kind for event in group}),
        "count": count,
        "first_seen": first,
        "last_seen": last,
        "first_seen_iso": iso_time(first),
        "last_seen_iso": iso_time(last),
        "mnemonic": strongest.mnemonic,
        "nvidia_action": strongest.nvidia_action,
        "xid_action": action,
        "action_source": strongest.action_source,
        "message": strongest.message,
        "pci": strongest.pci,
        "pids": sorted({event.pid for event in group if event.pid is not None})[:16],
        "processes": sorted({event.process for event in group if event.process})[:16],
    }
    instances = sorted({(event.gpu_instance, event.compute_instance) for event in group
                        if event.gpu_instance is not None})
    if instances:
        evidence["mig_instances"] = [{"gpu_instance": gi, "compute_instance": ci} for gi, ci in instances]
    if strongest.kind == "sxid":
        evidence.update(device=strongest.device, severity=strongest.severity)
    if strongest.recovery_action is not None:
        evidence["recovery_action"] = strongest.recovery_action
    message = _message(strongest, action, index, count)
    if not current:
        evidence["before_boot"] = True
        message = _message(strongest, action, index, count, before_boot=True)
    return Finding(check=check, status=status, action=finding_action, message=message,
                   gpu=index, uuid=uuid, pci_bus_id=bus_id or strongest.pci, evidence=evidence)


def _message(event: XidEvent, action: str, index: Optional[int], count: int, before_boot: bool = False) -> str:
    if event.kind == "sxid":
        where = f"{event.device or 'NVSwitch'} ({event.pci})"
        what = f"SXid {event.code} {event.severity or ''}".rstrip()
    else:
        where = f"GPU {index} ({event.pci})" if index is not None else f"GPU {event.pci}"
        entry = catalog_entries().get(event.code)
        described = entry is not None and entry.description and entry.description != "Unused"
        what = f"Xid {event.code}" + (f" ({entry.description})" if described else "")
    times = f" x{count}" if count > 1 else ""
    if before_boot:
        return f"{what} on {where}{times} before the current boot: evidence only, not a reason to drain"
    return f"{what} on {where}{times}: {ACTION_TEXT.get(action, action)}"


def _least(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _most(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [value for value in values if value is not None]
    return max(present) if present else None
