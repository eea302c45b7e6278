"""One kernel-log event (an Xid, an SXid or a GPU fallen off the bus) and its JSON form."""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional

from .xid_actions import XID_ACTIONS, action_rank, stronger  # noqa: F401  (re-exported: their old home)

KINDS = ("xid", "sxid", "fallen_off_bus")
FALLEN_OFF_BUS_CODE = 79

# ``slurm-gpu xid scan --json`` writes these keys first, always (a contract).
JSON_CONTRACT_KEYS = ("kind", "code", "pci", "gpu_instance", "pid", "process", "message", "action", "mnemonic")


@dataclass
class XidEvent:
    kind: str                                # xid | sxid | fallen_off_bus
    code: int                                # the Xid/SXid number; 79 for a fallen-off-the-bus line
    pci: Optional[str]                       # dddd:bb:dd, lowercase (the GPU's, or the NVSwitch's)
    message: str                             # the text after the code (pid/name removed)
    gpu_instance: Optional[int] = None       # MIG GPU-I
    compute_instance: Optional[int] = None   # MIG GPU-CI
    pid: Optional[int] = None
    process: Optional[str] = None
    time: Optional[float] = None             # wall clock (epoch s) of the first line, when the log says
    uptime: Optional[float] = None           # seconds since boot, from "[12345.678901]" or /dev/kmsg
    device: Optional[str] = None             # SXid: nvidia-nvswitchN
    severity: Optional[str] = None           # SXid: Fatal | Non-fatal
    continuation: bool = False               # SXid detail line ("Severity ...", "Data {...}")
    recovery_action: Optional[int] = None    # Xid 154: the new recovery action (0..7)
    nvlink_unit: Optional[str] = None        # Xid 144-150: RLW_REMAP, SAW_MVB, ...
    intrinfo: Optional[int] = None           # Xid 144-150: first word in the parentheses
    error_status: Optional[int] = None       # Xid 144-150: second word in the parentheses
    # Filled in by the catalog, the GPU map and the flood tracker:
    action: str = XID_ACTIONS[-1]            # the strongest until the catalog decides
    action_source: str = ""
    mnemonic: Optional[str] = None
    nvidia_action: Optional[str] = None
    gpu: Optional[int] = None
    uuid: Optional[str] = None
    count: int = 1
    count_new: int = 1                       # occurrences read by this run (the rest: earlier runs)
    first_seen: Optional[float] = None
    last_seen: Optional[float] = None
    last_uptime: Optional[float] = None
    before_boot: bool = False                # its last line was written before the running kernel booted

    def __post_init__(self) -> None:
        if self.first_seen is None:
            self.first_seen = self.time
        if self.last_seen is None:
            self.last_seen = self.time
        if self.last_uptime is None:
            self.last_uptime = self.uptime

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {key: getattr(self, key) for key in JSON_CONTRACT_KEYS}
        for item in fields(self):
            if item.name not in out:
                out[item.name] = getattr(self, item.name)
        out["time_iso"] = iso_time(self.first_seen)
        return out

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "XidEvent":
        known = {item.name for item in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def iso_time(epoch: Optional[float]) -> Optional[str]:
    if epoch is None:
        return None
    return _time.strftime("%Y-%m-%dT%H:%M:%S%z", _time.localtime(epoch))
