"""The health check's settings, read once from ``[health]`` (and ``[drain]``) of the config."""
from __future__ import annotations

from ..plain import field, plain
from typing import Any, Dict, Mapping

from ..actions.decision import Policy

# A drain for a repeated Xid (the same Xid on the same GPU after N reboots) is this cause's
# check id; it is never resumed automatically.
REPEAT_CHECK = "kernel.xid.repeat"


@plain(frozen=True)
class HealthPolicy:
    deadline_s: float = 45.0
    confirm_runs: int = 2
    confirm_by_check: Mapping[str, int] = field(default_factory=dict)
    boot_grace_runs: int = 1
    inspect_after_reboots: int = 2
    inspect_after_reboots_by_xid: Mapping[str, int] = field(default_factory=dict)
    resume_default: str = "auto"
    resume_by_check: Mapping[str, str] = field(default_factory=dict)
    resume_by_xid_action: Mapping[str, str] = field(default_factory=dict)
    budget_enabled: bool = True
    budget_max_nodes: int = 10
    budget_max_fraction: float = 0.1
    budget_window_s: float = 3600.0
    drain_on_probe_timeout: bool = False
    textfile_dir: str = ""
    syslog: bool = True
    drain: Policy = field(default_factory=Policy)

    def confirm(self, check: str) -> int:
        return max(1, int(self.confirm_by_check.get(check, self.confirm_runs)))

    def inspect_after(self, xid: Any) -> int:
        return int(self.inspect_after_reboots_by_xid.get(str(xid), self.inspect_after_reboots))

    def resume_mode(self, check: str, xid_action: str = "") -> str:
        if check == REPEAT_CHECK:
            return "never"
        if xid_action and xid_action in self.resume_by_xid_action:
            return self.resume_by_xid_action[xid_action]
        return self.resume_by_check.get(check, self.resume_default)

    @classmethod
    def from_config(cls, config) -> "HealthPolicy":
        section: Dict[str, Any] = config.section("health")
        return cls(
            deadline_s=float(section["deadline_s"]),
            confirm_runs=int(section["confirm_runs"]),
            confirm_by_check=dict(section.get("confirm", {})),
            boot_grace_runs=int(section["boot_grace_runs"]),
            inspect_after_reboots=int(section["inspect_after_reboots"]),
            inspect_after_reboots_by_xid={str(k): int(v) for k, v in section.get("inspect_after_reboots_xid", {}).items()},
            resume_default=str(section["resume_default"]),
            resume_by_check=dict(section.get("resume", {})),
            resume_by_xid_action=dict(section.get("resume_xid_action", {})),
            budget_enabled=bool(section["budget_enabled"]),
            budget_max_nodes=int(section["budget_max_nodes"]),
            budget_max_fraction=float(section["budget_max_fraction"]),
            budget_window_s=float(section["budget_window_s"]),
            drain_on_probe_timeout=bool(section["drain_on_probe_timeout"]),
            textfile_dir=config.resolve(str(section["textfile_dir"])) if section.get("textfile_dir") else "",
            syslog=bool(section.get("syslog", True)),
            drain=Policy.from_config(config),
        )
