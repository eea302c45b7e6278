"""The interface between this project and Slurm."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol


class SlurmError(Exception):
    """A Slurm command failed or could not be run; the message is one line."""


@dataclass
class NodeInfo:
    name: str
    state: str                              # e.g. "IDLE", "MIXED+DRAIN", "DOWN*"
    reason: str = ""
    reason_user: str = ""
    raw: Dict[str, str] = field(default_factory=dict)

    @property
    def flags(self) -> List[str]:
        return self.state.rstrip("*").split("+")

    @property
    def drained(self) -> bool:
        return any(flag in ("DRAIN", "DRAINED", "DRAINING") for flag in self.flags)

    @property
    def down(self) -> bool:
        return "DOWN" in self.flags


@dataclass
class JobInfo:
    job_id: str
    fields: Dict[str, str]

    def get(self, key: str, default: str = "") -> str:
        return self.fields.get(key, default)


class SlurmBackend(Protocol):
    def node(self, name: str) -> NodeInfo: ...
    def nodes(self) -> List[NodeInfo]: ...
    def drain(self, name: str, reason: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def job(self, job_id: str) -> Optional[JobInfo]: ...
    def set_admin_comment(self, job_id: str, text: str) -> None: ...
    def accounting(self, job_ids: List[str], fields: List[str],
                   every_incarnation: bool = False) -> List[Dict[str, str]]: ...
    def expand_hostlist(self, expression: str) -> List[str]: ...
