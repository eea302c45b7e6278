"""What the config file may hold: ``CONFIG_SCHEMA`` (every key, its type and bounds), the checks
of values no type says (hostlists, reason prefixes, Xid codes, environment names) and the
cross-checks against the check registry and the built-in defaults. Pure: no file is read here.
"""
from __future__ import annotations

import fnmatch
import re
from typing import Any, Dict, List, Optional, Tuple

from ..facts import NVML_DRIVER_FACTS
from ..findings import ACTIONS
from ..xid.xid_actions import XID_ACTIONS
from ..safeio.fsutil import name_problem
from ..schema import Field, Problem

TIERS = ("prolog", "health", "deep")
RESUME_MODES = ("auto", "after_reboot", "never")


def hostlist_problem(expression: str) -> Optional[str]:
    """None when ``expression`` is a valid hostlist (or glob); else what is wrong."""
    if is_glob(expression):
        return None if expression.strip() else "is empty"
    import hostlist

    try:
        hosts = hostlist.expand_hostlist(expression)
    except hostlist.BadHostlist as exc:
        return f"malformed hostlist {expression!r} ({exc})"
    return None if hosts else f"hostlist {expression!r} names no host"


def is_glob(expression: str) -> bool:
    return "*" in expression or "?" in expression


def node_matches(expression: str, node: str) -> bool:
    if is_glob(expression):
        return fnmatch.fnmatchcase(node, expression)
    import hostlist

    return node in hostlist.expand_hostlist(expression)


def _ib_port_problem(value: str) -> Optional[str]:
    hca, sep, port = value.partition(":")
    if not sep or not hca or not port.isdigit():
        return f"{value!r} is not HCA:PORT"
    return None


def _reason_prefix_problem(prefix: str) -> Optional[str]:
    """The prefix alone says a drain reason is ours; it must survive scontrol's record format."""
    if not 1 <= len(prefix) <= 32 or "=" in prefix or not prefix.isprintable() or any(c.isspace() for c in prefix):
        return f"{prefix!r} is not a usable reason prefix"
    return None


def _node_names_problem(table: Dict[str, Any]) -> Optional[str]:
    for name in table:
        problem = name_problem(name)
        if problem:
            return f"node name {name!r} {problem}"
    return None


NODE_SCHEMA: Dict[str, Any] = {
    "match": Field(str, required=True, check=hostlist_problem,
                   doc="a hostlist expression such as gpu[1-3,7] or a glob such as gpu*"),
    "gpus": Field(int, minimum=0, maximum=1024),
    "gpu_model": Field(str),
    "nvlinks_per_gpu": Field(int, minimum=0, maximum=64),
    "nvswitch_fabric": Field(bool),
    "ib_ports": Field(list, item=Field(str, check=_ib_port_problem, doc="HCA:PORT, e.g. mlx5_0:1")),
    "ib_rate_gbps": Field(float, minimum=0, maximum=100000),
    "ib_link_layer": Field(str, choices=("InfiniBand", "Ethernet")),
    "roce_gid_index": Field(int, minimum=0, maximum=65535),
    "power_limit_w": Field(float, minimum=0, maximum=100000),
    "pcie_gen": Field(int, minimum=1, maximum=16),
    "pcie_width": Field(int, minimum=1, maximum=64),
    # Facts an older driver may not give (then they fail nothing) that this hardware must report.
    "nvml_required": Field(list, item=Field(str, choices=NVML_DRIVER_FACTS)),
    # slurm-gpu-taskprolog exports the NCCL settings of the node's fabric on these nodes.
    "nccl_env": Field(bool),
    # This tool judges the node's IMEX domain (imex.domain), where the node is in a multi-node
    # NVLink domain; false: IMEX is someone else's (an orchestrator, the site's own checks).
    "imex_owned": Field(bool),
}

_MAX_WINDOW_S = 366 * 86400.0      # a year: history and flood state span no more
# Every numeric key has both bounds (tests/test_config.py holds the schema to it): a value the
# check accepts never overflows a sleep, a deadline or a float.
_THRESHOLD_MAX = 1e15               # counters and windows (a float is exact to 2**53)
_THRESHOLD = Field(float, minimum=0, maximum=_THRESHOLD_MAX)
_RUN_COUNT_MAX = 1000              # consecutive runs, reboots: a health check runs every few minutes
_ACTION = Field(str, choices=ACTIONS)

_XID_KEY_DOC = 'an Xid code such as "13", or "sxid:20034" for an NVSwitch SXid'
_XID_MAX_ESCALATION_COUNT = 10000


# What a task's environment takes (``[nccl] env``; the TaskProlog holds its own settings to it too).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_value_problem(value: str) -> Optional[str]:
    """Slurm takes everything after ``=`` to the end of the line as the value."""
    if any(ch in value for ch in "\n\r\0"):
        return "holds a line break or NUL"
    return None


def _env_names_problem(table: Dict[str, Any]) -> Optional[str]:
    bad = [key for key in table if not ENV_NAME.fullmatch(key)]
    return f"{', '.join(repr(key) for key in bad)} is not an environment variable name" if bad else None


def _xid_code_keys_problem(table: Dict[str, Any]) -> Optional[str]:
    bad = [key for key in table if not _is_xid_key(key)]
    return f"{', '.join(repr(key) for key in bad)} is not an Xid code" if bad else None


def _is_xid_key(key: str) -> bool:
    digits = key[5:] if key.startswith("sxid:") else key
    return digits.isascii() and digits.isdigit() and len(digits) <= 9


# [xid] escalate = { "13" = { count = 5, window_s = 3600, action = "reset_gpu" } }: this many
# separate occurrences (lines closer than burst_s are one occurrence) of one code on one GPU
# within window_s raise the action.
_XID_ESCALATION: Dict[str, Any] = {
    "count": Field(int, minimum=1, maximum=_XID_MAX_ESCALATION_COUNT, required=True),
    "window_s": Field(float, minimum=1, maximum=_MAX_WINDOW_S, required=True),
    "action": Field(str, choices=XID_ACTIONS, required=True),
    "burst_s": Field(float, minimum=0, maximum=_MAX_WINDOW_S),
}

# slurmd kills a HealthCheckProgram after 60 s; the hooks' own waits (NVML and sysfs probes,
# the kernel log, Slurm's commands) must each end well before it.
HOOK_DEADLINE_S = 60.0
HOOK_TIMEOUT_MAX_S = 30.0
# The prolog's and epilog's whole-run watchdog: Slurm's PrologEpilogTimeout is the site's, and
# unset slurmd waits forever (holding the job, or the node COMPLETING); no hook needs minutes.
JOB_HOOK_DEADLINE_MAX_S = 300.0

CONFIG_SCHEMA: Dict[str, Any] = {
    "paths": {
        "state_dir": Field(str),
        "kernel_log": Field(str, doc='"auto", "kmsg", "journal" or a file path'),
        "sysfs_root": Field(str),
        "proc_root": Field(str, doc="where /proc is (the NVIDIA driver's GPU information files)"),
    },
    "gpu": {
        "backend": Field(str, choices=("nvml", "sim")),
        "probe_timeout_s": Field(float, minimum=0.1, maximum=HOOK_TIMEOUT_MAX_S),
    },
    "sim": {
        "profile": Field(str, doc="a shipped profile's name (h100-healthy) or a profile file's path"),
        "nodes": Field(dict, values=Field(str), check=_node_names_problem,
                       doc="node name (each becomes a directory name) -> shipped profile name or file path"),
    },
    "nodes": Field(list, item=NODE_SCHEMA),
    "thresholds": Field(dict, values=_THRESHOLD),
    "actions": Field(dict, values=_ACTION),
    "tiers": Field(dict, values=Field(list, item=Field(str))),
    "xid": {
        "actions": Field(dict, values=Field(str, choices=XID_ACTIONS), check=_xid_code_keys_problem,
                         doc=_XID_KEY_DOC),
        "flood_window_s": Field(float, minimum=0, maximum=_MAX_WINDOW_S),
        "escalate": Field(dict, values=_XID_ESCALATION, check=_xid_code_keys_problem, doc=_XID_KEY_DOC),
        "rescan_bytes": Field(int, minimum=0, maximum=1 << 30),
        "source_timeout_s": Field(float, minimum=1, maximum=HOOK_TIMEOUT_MAX_S),
        "read_budget_bytes": Field(int, minimum=1024 * 1024, maximum=1 << 34),
        "read_budget_s": Field(float, minimum=0.1, maximum=HOOK_TIMEOUT_MAX_S),
    },
    "drain": {
        "enabled": Field(bool, doc="the master switch: false, and checks still run but nothing is drained or resumed"),
        "reason_prefix": Field(str, check=_reason_prefix_problem,
                               doc="1-32 printable characters without spaces or '=', e.g. gpu-hooks:"),
        "max_reason_len": Field(int, minimum=20, maximum=1024),
    },
    "dcgm": {
        "dcgmi": Field(str),
        "levels": Field(dict, values=Field(int, minimum=1, maximum=4)),
        # dcgmi diag runs in the deep tier (slurm-gpu check), not in a hook: level 3 takes ~15 min.
        "timeout_s": Field(float, minimum=0, maximum=4 * 3600.0),
    },
    "health": {
        "deadline_s": Field(float, minimum=1, maximum=HOOK_DEADLINE_S,
                            check=lambda v: None if v < 60 else "must stay below slurmd's 60 s kill",
                            doc="seconds, below 60"),
        "confirm_runs": Field(int, minimum=1, maximum=_RUN_COUNT_MAX),
        "confirm": Field(dict, values=Field(int, minimum=1, maximum=_RUN_COUNT_MAX)),
        "boot_grace_runs": Field(int, minimum=0, maximum=_RUN_COUNT_MAX),
        "inspect_after_reboots": Field(int, minimum=1, maximum=_RUN_COUNT_MAX),
        "inspect_after_reboots_xid": Field(dict, values=Field(int, minimum=1, maximum=_RUN_COUNT_MAX), check=_xid_code_keys_problem,
                                           doc=_XID_KEY_DOC),
        "resume_default": Field(str, choices=RESUME_MODES),
        "resume": Field(dict, values=Field(str, choices=RESUME_MODES)),
        "resume_xid_action": Field(dict, values=Field(str, choices=RESUME_MODES)),
        "drain_on_probe_timeout": Field(bool),
        "budget_enabled": Field(bool),
        "budget_max_nodes": Field(int, minimum=0, maximum=1 << 20),
        "budget_max_fraction": Field(float, minimum=0, maximum=1, doc="0 to 1"),
        "budget_window_s": Field(float, minimum=0, maximum=_MAX_WINDOW_S),
        "textfile_dir": Field(str, doc="a directory (relative: to the config file's); empty: <state_dir>/health"),
        "syslog": Field(bool),
    },
    "remediate": {
        "enabled": Field(bool),
        "max_reboots": Field(int, minimum=1, maximum=_RUN_COUNT_MAX),
        "max_reboots_xid": Field(dict, values=Field(int, minimum=1, maximum=_RUN_COUNT_MAX), check=_xid_code_keys_problem,
                                 doc=_XID_KEY_DOC),
        "window_s": Field(float, minimum=60, maximum=_MAX_WINDOW_S, doc="seconds, at least 60"),
        "max_rebooting_nodes": Field(int, minimum=0, maximum=1 << 20),
        "gpu_reset": Field(bool),
        "gpu_reset_command": Field(list, item=Field(str), check=lambda v: None if v and v[0] else "must name a program",
                                   doc='an argument list (no shell); "{gpu}" is the GPU to reset'),
        "gpu_reset_timeout_s": Field(float, minimum=1, maximum=HOOK_TIMEOUT_MAX_S,
                                     doc="seconds, within the health check's own deadline"),
        "records_wait_s": Field(float, minimum=0, maximum=_MAX_WINDOW_S, doc="seconds; 0 never waits"),
    },
    "retention": {
        "job_records_days": Field(float, minimum=0, maximum=36500, doc="days; 0 keeps them forever"),
        "evidence_days": Field(float, minimum=0, maximum=36500, doc="days; 0 keeps them forever"),
        "journal_days": Field(float, minimum=0, maximum=36500, doc="days; 0 keeps them forever"),
        "every_s": Field(float, minimum=60, maximum=_MAX_WINDOW_S, doc="seconds between two prunings"),
    },
    "perftest": {
        "ib_write_bw": Field(str, doc="the ib_write_bw command (an absolute path is best)"),
        "duration_s": Field(int, minimum=1, maximum=600),
        "message_bytes": Field(int, minimum=1, maximum=1 << 30),
        "qps": Field(int, minimum=1, maximum=64),
        # The deep tier, not a hook: a run of every pair together.
        "timeout_s": Field(float, minimum=1, maximum=3600.0),
        "server_wait_s": Field(float, minimum=0, maximum=30.0),
        "base_port": Field(int, minimum=1024, maximum=65000),
    },
    "nccl": {
        "socket_ifname": Field(str, check=env_value_problem,
                               doc="NCCL_SOCKET_IFNAME's value, e.g. =ib0 or ^lo,docker; empty: derived"),
        "env": Field(dict, values=Field(str, check=env_value_problem, doc="one line, no NUL"),
                     check=_env_names_problem, doc="environment variable names such as NCCL_IB_TIMEOUT"),
    },
    "slurm": {
        "bin_dir": Field(str, doc="directory of scontrol/sacct; empty: search the usual places"),
        "conf": Field(str, doc="SLURM_CONF for Slurm commands; empty: Slurm's own default"),
        "timeout_s": Field(float, minimum=1, maximum=HOOK_TIMEOUT_MAX_S),
    },
    "summary": {
        "offender_min_events": Field(int, minimum=1, maximum=10 ** 9, doc="fewest hardware endings (or drains) that can flag a node"),
        "offender_ratio": Field(float, minimum=1, maximum=1e6, doc="how many times the fleet's rate flags a node"),
        "offender_max_p": Field(float, minimum=0, maximum=1,
                                doc="largest chance that bad luck flags any node of the fleet"),
        "max_line_bytes": Field(int, minimum=1024, maximum=64_000_000,
                                doc="longest accounting line read; a longer one is skipped and counted"),
        "sacct_timeout_s": Field(float, minimum=1, maximum=86400, doc="how long sacct may take for the whole window"),
    },
    "records": {
        "accounting": Field(bool, doc="also write each classification into the job's AdminComment"),
        "node_entries": Field(str, choices=("evidence", "always")),
        "delivery": Field(str, choices=("background", "inline")),
        "late_evidence_window_s": Field(float, minimum=0, maximum=86400),
        "write_attempts": Field(int, minimum=1, maximum=100),
        "verify_delay_s": Field(float, minimum=0, maximum=HOOK_TIMEOUT_MAX_S, doc="seconds an epilog waits before reading its write back"),
        "verify_jitter_s": Field(float, minimum=0, maximum=HOOK_TIMEOUT_MAX_S),
        "deliver_max_jobs": Field(int, minimum=1, maximum=10000),
        "outbox_backoff_max_s": Field(float, minimum=30, maximum=86400,
                                      doc="longest wait between tries of an undelivered entry"),
        "outbox_expire_s": Field(float, minimum=3600, maximum=90 * 86400,
                                 doc="age at which a queued entry is dropped (said, its record kept)"),
        "gpu_oom_from_job_output": Field(bool, doc="read the tail of a FAILED job's StdErr/StdOut, as the "
                                         "job's user, for a GPU out-of-memory message (GPU_OOM)"),
        "job_output_tail_kib": Field(int, minimum=1, maximum=1024),
        "job_output_timeout_s": Field(float, minimum=0.1, maximum=10),
        "expedite_on_hardware": Field(bool, doc="the node epilog exits 1 after a hardware fault on one of the "
                                      "job's own GPUs (Slurm 25.11+ expedited requeue)"),
        "epilog_deadline_s": Field(float, minimum=1, maximum=JOB_HOOK_DEADLINE_MAX_S,
                                   doc="seconds, below Slurm's PrologEpilogTimeout"),
    },
    "watch": {
        "poll_s": Field(float, minimum=0.05, maximum=60.0),
        "min_interval_s": Field(float, minimum=0, maximum=3600.0),
        "max_cpu": Field(float, minimum=0.01, maximum=1.0, doc="a share of one core, 0.01 to 1"),
        "program": Field(str, doc="an absolute path; empty: slurm-gpu-healthcheck beside slurm-gpu-watch"),
        "nvml_events": Field(bool, doc="no longer used: the watcher follows the kernel log alone (DEPRECATED_KEYS)"),
        "serve_hooks": Field(bool, doc="no longer used: the hooks run in their own process (DEPRECATED_KEYS)"),
        "hook_socket": Field(str, doc="no longer used: the hooks run in their own process (DEPRECATED_KEYS)"),
        "after_boot_s": Field(float, minimum=0, maximum=86400.0,
                              doc="seconds; 0: the watcher does not follow a boot our drain waits for"),
    },
    "prolog": {
        "on_tool_error": Field(str, choices=("pass", "fail")),
        "gpu_devices": Field(str, doc="directory of the nvidiaN device files (GRES index -> NVML index)"),
        "deadline_s": Field(float, minimum=1, maximum=JOB_HOOK_DEADLINE_MAX_S,
                            doc="seconds, below Slurm's PrologEpilogTimeout"),
    },
}


# Keys an older release's config may hold, still accepted: "section.key" -> (the key that now says
# the same, or "" for a key that no longer does anything; what to do instead). A config that sets
# one loads as if it had set the new key (when it does not set that one itself), and `slurm-gpu
# config check` says so in one line per key (docs/configuration.md, "Older keys").
DEPRECATED_KEYS: Dict[str, Tuple[str, str]] = {
    # The hook server was retired (issue 29): Slurm fork-execs every hook, one code path.
    "watch.serve_hooks": ("", "no effect: the hooks always run in their own process; remove it"),
    "watch.hook_socket": ("", "no effect: there is no hook server; remove it"),
    "watch.nvml_events": ("", "nothing: the watcher follows the kernel log alone, which carries every Xid "
                              "(docs/kernel-log.md, 'The watcher and NVML events')"),
    # One "N reboots, then a person" rule (docs/remediation.md): the Xid repeat counted the boots a
    # fault was seen in, the remediation its own reboots; both now stop at [remediate] max_reboots.
    "health.inspect_after_reboots": ("remediate.max_reboots", "set [remediate] max_reboots (the one reboot limit)"),
    "health.inspect_after_reboots_xid": ("remediate.max_reboots_xid",
                                         "set [remediate] max_reboots_xid (the one reboot limit, per Xid)"),
}


def map_deprecated(doc: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Tuple[str, str]]]:
    """``doc`` with each deprecated key it sets carried onto its new key, and (old key, what to do
    instead) for each; the old keys stay (their schema still validates them)."""
    found: List[Tuple[str, str]] = []
    mapped = doc
    for old, (new, instead) in DEPRECATED_KEYS.items():
        section, _, key = old.partition(".")
        if key not in doc.get(section, {}):     # validated: every section is a table
            continue
        found.append((old, instead))
        new_section, _, new_key = new.partition(".")
        if new and new_key not in mapped.get(new_section, {}):
            if mapped is doc:
                mapped = {name: dict(value) if isinstance(value, dict) else value for name, value in doc.items()}
            mapped.setdefault(new_section, {})[new_key] = doc[section][key]
    return mapped, found


def cross_checks(doc: Dict[str, Any], defaults: Dict[str, Any]) -> List[Problem]:
    problems: List[Problem] = []
    tiers = doc.get("tiers", {})
    for name in tiers:
        if name not in TIERS:
            problems.append((f"tiers.{name}", "unknown tier", "one of " + ", ".join(TIERS)))
    problems.extend(_check_id_problems(doc, defaults))
    return problems


def _check_id_problems(doc: Dict[str, Any], defaults: Dict[str, Any]) -> List[Problem]:
    """Unknown check ids in [actions] and [tiers], unknown names in [thresholds]."""
    # Only when a document is validated: a hook loads the compiled config, and the TaskProlog
    # (before every task) never needs the check list.
    from ..checklist import CHECKS, FINDING_IDS

    def known(check_id: str, ids) -> bool:
        return check_id in ids

    problems: List[Problem] = []
    for check_id in doc.get("actions", {}):
        if not known(check_id, FINDING_IDS):
            problems.append((f'actions."{check_id}"', "unknown check id",
                             "one of " + ", ".join(sorted(FINDING_IDS))))
    for tier, ids in doc.get("tiers", {}).items():
        for index, check_id in enumerate(ids):
            if not known(check_id, CHECKS):
                problems.append((f"tiers.{tier}[{index}]", f"unknown check id {check_id!r}",
                                 "one of " + ", ".join(sorted(CHECKS))))
    health = doc.get("health", {})
    for table in ("confirm", "resume"):
        for check_id in health.get(table, {}):
            if not known(check_id, FINDING_IDS) and check_id != "kernel.xid.repeat":
                problems.append((f'health.{table}."{check_id}"', "unknown check id",
                                 "one of " + ", ".join(sorted(FINDING_IDS))))
    for action in health.get("resume_xid_action", {}):
        if action not in XID_ACTIONS:
            problems.append((f"health.resume_xid_action.{action}", "unknown Xid action", "one of " + ", ".join(XID_ACTIONS)))
    names = defaults.get("thresholds", {})
    for name in doc.get("thresholds", {}):
        if name not in names:
            problems.append((f"thresholds.{name}", "unknown threshold", "one of " + ", ".join(sorted(names))))
    return problems
