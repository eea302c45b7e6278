"""What the health check remembers about its node between runs, in
``<state_dir>/health/<node>.json``: the boot it last saw and how many runs since, consecutive
failing runs per cause, the Xids seen per boot, and what it drained the node for (the cause,
how it is resumed, in which boot). A missing or torn file means starting afresh.
"""
from __future__ import annotations

import json
import os
from ..plain import asdict, field, plain
from typing import Any, Dict, List, Optional, Tuple

from ..safeio.fsutil import NewerFormat, atomic_write, path_component, read_state_json

VERSION = 1


def health_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "health")


def state_path(state_dir: str, node: str) -> str:
    return os.path.join(health_dir(state_dir), f"{path_component(node)}.json")


def last_path(state_dir: str, node: str) -> str:
    """The last run's result (``health.outputs`` writes it every run)."""
    return os.path.join(health_dir(state_dir), f"{path_component(node)}.last.json")


@plain
class Drained:
    cause: str                   # DrainReason.cause of our drain
    resume_mode: str             # auto | after_reboot | never
    boot_id: str                 # the boot in which we drained
    at: float
    reason: str = ""
    evidence: List[Dict[str, Any]] = field(default_factory=list)   # the findings we drained for
    by: str = ""                 # the hook that drained: healthcheck | prolog | epilog ("": before it was kept)
    reset_at: Optional[float] = None   # when the remediation reset the drain's GPU (as good as a reboot)


@plain
class NodeState:
    boot_id: str = ""
    runs_in_boot: int = 0
    failing: Dict[str, int] = field(default_factory=dict)
    xid_boots: Dict[str, List[str]] = field(default_factory=dict)
    drained: Optional[Drained] = None
    budget_blocks: int = 0       # drains the budget refused, ever (a counter for the metrics)
    # The boot in which Slurm's view of the node was read and held nothing of ours this state
    # lacks (gate.settles): from then on a quiet run need not ask Slurm (gate.Session._quiet).
    settled_boot: str = ""

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["version"] = VERSION
        return data

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> "NodeState":
        if not data or data.get("version") != VERSION:
            return cls()
        try:
            drained = data.get("drained")
            return cls(boot_id=str(data.get("boot_id", "")), runs_in_boot=int(data.get("runs_in_boot", 0)),
                       failing={str(k): int(v) for k, v in dict(data.get("failing", {})).items()},
                       xid_boots={str(k): [str(b) for b in v] for k, v in dict(data.get("xid_boots", {})).items()},
                       drained=Drained(**drained) if isinstance(drained, dict) else None,
                       budget_blocks=int(data.get("budget_blocks", 0)),
                       settled_boot=str(data.get("settled_boot", "")))
        except (TypeError, ValueError):
            return cls()


def load(state_dir: str, node: str, read_only: bool = False) -> NodeState:
    """``read_only``: a reader that never writes (slurm-gpu-watch) leaves a corrupt file in place.
    A file of a newer format (a rollback) raises ``fsutil.NewerFormat`` (nothing is written over
    it); a read-only reader gets a fresh state."""
    return NodeState.from_json(read_state_json(state_path(state_dir, node), read_only=read_only, newest=VERSION))


def load_kept(state_dir: str, node: str) -> Tuple[NodeState, Optional[str]]:
    """``(state, None)``; or, when a newer version wrote the file (a rollback), a fresh state and
    the line that says so: the caller runs on it and writes nothing over that file."""
    try:
        return load(state_dir, node), None
    except NewerFormat as exc:
        return NodeState(), f"health state {exc.filename}: {exc.strerror}; this run keeps no state"


def save(state_dir: str, node: str, state: NodeState) -> None:
    atomic_write(state_path(state_dir, node), json.dumps(state.to_json(), sort_keys=True) + "\n")


# -- read-only views for slurm-gpu-watch (it reads what the health check kept, never writes) ------

def waits_for_a_reboot(state_dir: str, node: str, boot: str) -> bool:
    """Whether our drain of ``node`` is resumed only after a reboot and was made in another boot
    than ``boot``: the boot it waited for may have come."""
    drained = load(state_dir, node, read_only=True).drained
    return drained is not None and drained.resume_mode == "after_reboot" and drained.boot_id != boot


def last_judgement(state_dir: str, node: str) -> Optional[Tuple[float, str]]:
    """(time, rule) of the health check's last result, or None."""
    data = read_state_json(last_path(state_dir, node), read_only=True)
    try:
        return float(data["time"]), str(data["rule"])
    except (TypeError, ValueError, KeyError):
        return None
