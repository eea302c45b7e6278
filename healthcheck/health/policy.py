"""The health check's settings, read once from ``[health]`` (and ``[drain]``, ``[remediate]``) of the
config."""
from __future__ import annotations

from ..plain import field, plain
from typing import Any, Dict, Mapping

from ..actions.decision import Policy


@plain(frozen=True)
class HealthPolicy:
    deadline_s: float = 45.0
    confirm_runs: int = 2
    confirm_by_check: Mapping[str, int] = field(default_factory=dict)
    boot_grace_runs: int = 1
    # the one "N reboots, then a person" rule ([remediate] max_reboots, per Xid max_reboots_xid)
    max_reboots: int = 2
    max_reboots_by_xid: Mapping[str, int] = field(default_factory=dict)
    drain_on_probe_timeout: bool = False
    textfile_dir: str = ""
    syslog: bool = True
    drain: Policy = field(default_factory=Policy)

    def confirm(self, check: str) -> int:
        return max(1, int(self.confirm_by_check.get(check, self.confirm_runs)))

    def inspect_after(self, xid: Any) -> int:
        return int(self.max_reboots_by_xid.get(str(xid), self.max_reboots))

    @classmethod
    def from_config(cls, config) -> "HealthPolicy":
        section: Dict[str, Any] = config.section("health")
        reboots: Dict[str, Any] = config.section("remediate")
        return cls(
            deadline_s=float(section["deadline_s"]),
            confirm_runs=int(section["confirm_runs"]),
            confirm_by_check=dict(section.get("confirm", {})),
            boot_grace_runs=int(section["boot_grace_runs"]),
            max_reboots=int(reboots["max_reboots"]),
            max_reboots_by_xid={str(k): int(v) for k, v in reboots.get("max_reboots_xid", {}).items()},
            drain_on_probe_timeout=bool(section["drain_on_probe_timeout"]),
            textfile_dir=config.resolve(str(section["textfile_dir"])) if section.get("textfile_dir") else "",
            syslog=bool(section.get("syslog", True)),
            drain=Policy.from_config(config),
        )
