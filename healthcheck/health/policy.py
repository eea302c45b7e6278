"""The health check's settings, read once from ``[health]`` (and ``[drain]``, ``[remediate]``) of the
config."""
from __future__ import annotations

from typing import Any, Mapping

from ..actions.decision import Policy
from ..config.settings import HealthSettings, RemediatePolicy
from ..plain import plain


@plain(frozen=True)
class HealthPolicy:
    """``[health]`` as the health check uses it, with the one "N reboots, then a person" rule of
    ``[remediate]`` and the drain policy."""
    deadline_s: float
    confirm_runs: int
    confirm_by_check: Mapping[str, int]
    boot_grace_runs: int
    # the one "N reboots, then a person" rule ([remediate] max_reboots, per Xid max_reboots_xid)
    max_reboots: int
    max_reboots_by_xid: Mapping[str, int]
    drain_on_probe_timeout: bool
    textfile_dir: str                   # resolved; empty: <state_dir>/health
    syslog: bool
    drain: Policy

    def confirm(self, check: str) -> int:
        return max(1, int(self.confirm_by_check.get(check, self.confirm_runs)))

    def inspect_after(self, xid: Any) -> int:
        return int(self.max_reboots_by_xid.get(str(xid), self.max_reboots))

    @classmethod
    def from_config(cls, config) -> "HealthPolicy":
        health, reboots = config.typed(HealthSettings), config.typed(RemediatePolicy)
        return cls(deadline_s=health.deadline_s, confirm_runs=health.confirm_runs,
                   confirm_by_check=health.confirm_by_check, boot_grace_runs=health.boot_grace_runs,
                   max_reboots=reboots.max_reboots, max_reboots_by_xid=reboots.max_reboots_by_xid,
                   drain_on_probe_timeout=health.drain_on_probe_timeout,
                   textfile_dir=config.resolve(health.textfile_dir) if health.textfile_dir else "",
                   syslog=health.syslog, drain=config.typed(Policy))
