"""Typed sections of the config: read once from the loaded config (the built-in defaults merged
with the site's file, validated), so code reads attributes, not string keys. No defaults here:
each lives only in ``healthcheck/data/defaults.toml``."""
from __future__ import annotations

from typing import Any, Mapping, Tuple

from ..plain import plain

_CASTS = {"bool": bool, "int": int, "float": float, "str": str}


def _same_names(cls: Any, section: Mapping[str, Any]) -> Any:
    """A section whose keys are ``cls``'s fields, one for one: each cast to its annotated type."""
    return cls(**{name: _CASTS[cls.__annotations__[name]](section[name]) for name in cls.__plain__[0]})


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
    records_wait_s: float

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
                   gpu_reset_timeout_s=float(section["gpu_reset_timeout_s"]),
                   records_wait_s=float(section["records_wait_s"]))


@plain(frozen=True)
class WatchSettings:
    """``[watch]`` (slurm-gpu-watch)."""

    poll_s: float
    min_interval_s: float
    max_cpu: float
    program: str
    after_boot_s: float

    @classmethod
    def from_config(cls, config: Any) -> "WatchSettings":
        return _same_names(cls, config.section("watch"))


@plain(frozen=True)
class DrainSettings:
    """``[drain]``."""

    enabled: bool                       # the master switch: False, and nothing is changed
    reason_prefix: str
    max_reason_len: int

    @classmethod
    def from_config(cls, config: Any) -> "DrainSettings":
        return _same_names(cls, config.section("drain"))


@plain(frozen=True)
class Budget:
    """The drain budget, ``[health] budget_*`` (a circuit breaker, ``actions/budget.py``)."""

    enabled: bool
    max_nodes: int
    max_fraction: float
    window_s: float

    @classmethod
    def from_config(cls, config: Any) -> "Budget":
        return config.typed(HealthSettings).budget


@plain(frozen=True)
class HealthSettings:
    """``[health]`` (slurm-gpu-healthcheck; its drain budget and resume modes serve the hooks too)."""

    deadline_s: float
    confirm_runs: int
    confirm_by_check: Mapping[str, int]
    boot_grace_runs: int
    resume_default: str                 # auto | after_reboot | never
    resume_by_check: Mapping[str, str]
    resume_by_xid_action: Mapping[str, str]
    drain_on_probe_timeout: bool
    budget: Budget
    textfile_dir: str                   # as the file gives it (relative: to the config file)
    syslog: bool

    @classmethod
    def from_config(cls, config: Any) -> "HealthSettings":
        section = config.section("health")
        return cls(deadline_s=float(section["deadline_s"]), confirm_runs=int(section["confirm_runs"]),
                   confirm_by_check={str(k): int(v) for k, v in section.get("confirm", {}).items()},
                   boot_grace_runs=int(section["boot_grace_runs"]), resume_default=str(section["resume_default"]),
                   resume_by_check=dict(section.get("resume", {})),
                   resume_by_xid_action=dict(section.get("resume_xid_action", {})),
                   drain_on_probe_timeout=bool(section["drain_on_probe_timeout"]),
                   budget=Budget(enabled=bool(section["budget_enabled"]), max_nodes=int(section["budget_max_nodes"]),
                                 max_fraction=float(section["budget_max_fraction"]),
                                 window_s=float(section["budget_window_s"])),
                   textfile_dir=str(section["textfile_dir"]), syslog=bool(section["syslog"]))


@plain(frozen=True)
class RecordsSettings:
    """``[records]``: how a job's ending is recorded and delivered to accounting."""

    accounting: bool
    node_entries: str                   # evidence | always
    delivery: str                       # background | inline
    late_evidence_window_s: float
    write_attempts: int
    verify_delay_s: float
    verify_jitter_s: float
    deliver_max_jobs: int
    outbox_backoff_max_s: float
    outbox_expire_s: float
    gpu_oom_from_job_output: bool
    job_output_tail_kib: int
    job_output_timeout_s: float
    epilog_deadline_s: float
    expedite_on_hardware: bool

    @classmethod
    def from_config(cls, config: Any) -> "RecordsSettings":
        return _same_names(cls, config.section("records"))


@plain(frozen=True)
class Retention:
    """``[retention]`` (days; 0 keeps forever): the state dir's pruning, ``health/retention.py``."""

    job_records_days: float
    evidence_days: float
    journal_days: float
    every_s: float

    @classmethod
    def from_config(cls, config: Any) -> "Retention":
        return _same_names(cls, config.section("retention"))


@plain(frozen=True)
class PrologSettings:
    """``[prolog]``."""

    on_tool_error: str                  # pass | fail
    gpu_devices: str
    deadline_s: float

    @classmethod
    def from_config(cls, config: Any) -> "PrologSettings":
        return _same_names(cls, config.section("prolog"))


@plain(frozen=True)
class SlurmSettings:
    """``[slurm]``: where Slurm's commands are and how long one may take."""

    bin_dir: str
    conf: str
    timeout_s: float

    @classmethod
    def from_config(cls, config: Any) -> "SlurmSettings":
        return _same_names(cls, config.section("slurm"))


@plain(frozen=True)
class OffenderRules:
    """``[summary] offender_*``: when ``slurm-gpu summary`` flags a node as a repeat offender."""

    min_events: int
    ratio: float
    max_p: float

    @classmethod
    def from_config(cls, config: Any) -> "OffenderRules":
        return config.typed(SummarySettings).offenders


@plain(frozen=True)
class SummarySettings:
    """``[summary]`` (slurm-gpu summary)."""

    offenders: OffenderRules
    sacct_timeout_s: float
    max_line_bytes: int

    @classmethod
    def from_config(cls, config: Any) -> "SummarySettings":
        section = config.section("summary")
        return cls(offenders=OffenderRules(min_events=int(section["offender_min_events"]),
                                           ratio=float(section["offender_ratio"]),
                                           max_p=float(section["offender_max_p"])),
                   sacct_timeout_s=float(section["sacct_timeout_s"]), max_line_bytes=int(section["max_line_bytes"]))


@plain(frozen=True)
class NcclSettings:
    """``[nccl]`` (slurm-gpu-taskprolog)."""

    socket_ifname: str
    env: Mapping[str, str]

    @classmethod
    def from_config(cls, config: Any) -> "NcclSettings":
        section = config.section("nccl")
        return cls(socket_ifname=str(section["socket_ifname"]),
                   env={str(k): str(v) for k, v in section.get("env", {}).items()})


# [xid.escalate] rules are the admin's own tables: a rule that leaves burst_s out gets this one.
ESCALATION_BURST_S = 60.0


@plain(frozen=True)
class EscalationRule:
    """One ``[xid.escalate]`` rule: ``count`` occurrences within ``window_s`` on one GPU take ``action``."""

    count: int
    window_s: float
    action: str
    burst_s: float                      # lines this close together are one occurrence

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "EscalationRule":
        return cls(int(table["count"]), float(table["window_s"]), str(table["action"]),
                   float(table.get("burst_s", ESCALATION_BURST_S)))


@plain(frozen=True)
class XidSettings:
    """``[xid]`` (the kernel-log reads)."""

    flood_window_s: float
    rescan_bytes: int
    source_timeout_s: float
    read_budget_bytes: int
    read_budget_s: float
    overrides: Mapping[str, str]                # [xid.actions]
    escalate: Mapping[str, EscalationRule]      # [xid.escalate]

    @classmethod
    def from_config(cls, config: Any = None) -> "XidSettings":
        """From a loaded config, or (None) the built-in defaults alone."""
        if config is None:
            from . import Config

            config = Config.builtin()
        section = config.section("xid")
        return cls(flood_window_s=float(section["flood_window_s"]), rescan_bytes=int(section["rescan_bytes"]),
                   source_timeout_s=float(section["source_timeout_s"]),
                   read_budget_bytes=int(section["read_budget_bytes"]), read_budget_s=float(section["read_budget_s"]),
                   overrides=dict(section.get("actions", {})),
                   escalate={code: EscalationRule.from_table(rule)
                             for code, rule in section.get("escalate", {}).items()})


@plain(frozen=True)
class PathsSettings:
    """``[paths]`` as the file gives them (``Config.resolve``: relative to the config file)."""

    state_dir: str
    kernel_log: str                     # auto | kmsg | journal | a file
    sysfs_root: str
    proc_root: str

    @classmethod
    def from_config(cls, config: Any) -> "PathsSettings":
        return _same_names(cls, config.section("paths"))


@plain(frozen=True)
class GpuSettings:
    """``[gpu]``."""

    backend: str                        # nvml | sim
    probe_timeout_s: float

    @classmethod
    def from_config(cls, config: Any) -> "GpuSettings":
        return _same_names(cls, config.section("gpu"))


@plain(frozen=True)
class DcgmSettings:
    """``[dcgm]`` (dcgm.diag, deep tier)."""

    dcgmi: str
    timeout_s: float
    levels: Mapping[str, int]           # tier -> dcgmi diag level

    @classmethod
    def from_config(cls, config: Any) -> "DcgmSettings":
        section = config.section("dcgm")
        return cls(dcgmi=str(section["dcgmi"]), timeout_s=float(section["timeout_s"]),
                   levels={str(k): int(v) for k, v in section.get("levels", {}).items()})


@plain(frozen=True)
class PerftestSettings:
    """``[perftest]`` (ib.bandwidth, deep tier: ib_write_bw in loopback)."""

    ib_write_bw: str
    duration_s: int
    message_bytes: int
    qps: int
    timeout_s: float
    server_wait_s: float
    base_port: int

    @classmethod
    def from_config(cls, config: Any) -> "PerftestSettings":
        return _same_names(cls, config.section("perftest"))
