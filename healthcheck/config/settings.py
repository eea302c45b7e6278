"""Typed sections of the config: read once from the loaded config (the built-in defaults merged
with the site's file, validated), so code reads attributes, not string keys. No defaults here:
each lives only in ``healthcheck/data/defaults.toml``."""
from __future__ import annotations

from typing import Any, Mapping, Tuple

from ..plain import plain


@plain(frozen=True)
class RemediatePolicy:
    """``[remediate]``."""

    enabled: bool
    max_reboots: int                    # the one "N reboots, then a person" rule (per Xid: max_reboots_by_xid)
    max_reboots_by_xid: Mapping[str, int]
    window_s: float
    max_rebooting_nodes: int
    gpu_reset: bool
    gpu_reset_command: Tuple[str, ...]
    gpu_reset_timeout_s: float

    def reboots_allowed(self, xid: str = "") -> int:
        return int(self.max_reboots_by_xid.get(xid, self.max_reboots)) if xid else self.max_reboots

    @classmethod
    def from_config(cls, config: Any) -> "RemediatePolicy":
        section = config.section("remediate")
        return cls(enabled=bool(section["enabled"]), max_reboots=int(section["max_reboots"]),
                   max_reboots_by_xid={str(k): int(v) for k, v in section.get("max_reboots_xid", {}).items()},
                   window_s=float(section["window_s"]), max_rebooting_nodes=int(section["max_rebooting_nodes"]),
                   gpu_reset=bool(section["gpu_reset"]),
                   gpu_reset_command=tuple(str(arg) for arg in section["gpu_reset_command"]),
                   gpu_reset_timeout_s=float(section["gpu_reset_timeout_s"]))



@plain
class WatchSettings:
    """``[watch]`` (slurm-gpu-watch)."""

    poll_s: float
    min_interval_s: float
    max_cpu: float
    program: str
    after_boot_s: float

    @classmethod
    def from_config(cls, config: Any) -> "WatchSettings":
        section = config.section("watch")
        return cls(poll_s=float(section["poll_s"]), min_interval_s=float(section["min_interval_s"]),
                   max_cpu=float(section["max_cpu"]), program=str(section["program"]),
                   after_boot_s=float(section["after_boot_s"]))
