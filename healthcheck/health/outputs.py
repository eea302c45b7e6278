"""What a health-check run leaves behind for people and monitoring: the last result as JSON,
an evidence record per node when it drained, resumed, was blocked or recorded a fault, a line in
syslog, and a Prometheus textfile for node_exporter's textfile collector. All written
atomically (or appended line by line) under the state dir; none is ever a reason to fail.
"""
from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

from ..findings import STATUSES
from ..safeio.fsutil import append_line, atomic_write, ensure_dir, path_component
from ..hooklib.runlog import rotate_if_full
from .state import health_dir

EVIDENCE_MAX_BYTES = 1 << 20
TEXTFILE_MODE = 0o644          # node_exporter runs as its own user
STATUS_VALUE = {status: index for index, status in enumerate(STATUSES)}


def last_path(state_dir: str, node: str) -> str:
    return os.path.join(health_dir(state_dir), f"{path_component(node)}.last.json")


def evidence_path(state_dir: str, node: str) -> str:
    return os.path.join(health_dir(state_dir), f"{path_component(node)}.evidence.jsonl")


def textfile_path(directory: str, node: str) -> str:
    return os.path.join(directory, f"slurm_gpu_health_{path_component(node)}.prom")


def log_line(run) -> Optional[str]:
    """One line for syslog and stderr, or None for a quiet healthy run."""
    decision = run.decision
    remedy = _remedy_said(run)
    if decision.kind == "none" and not run.tally.confirmed and not run.tally.pending and not run.notes \
            and not remedy:
        return None
    head = f"{run.node}: {decision.kind}"
    if run.dry_run:
        head += " (dry run)"
    text = f"{head} [{decision.rule}] {decision.why}"
    if run.applied.error:
        text += f"; scontrol failed: {run.applied.error}"
    if run.tally.pending:
        text += "; waiting for confirmation: " + ", ".join(f"{c.key} {n}/{k}" for c, n, k in run.tally.pending)
    for note in run.notes:
        text += f"; {note}"
    if remedy:
        text += f"; {remedy}"
    return " ".join(text.split())


# Remediation steps worth a line even when nothing changed ([remediate]; the others are quiet).
_REMEDY_SAID = ("remediate-reboot-budget", "remediate-reset-refused")


def _remedy_said(run) -> str:
    """The remediation's step for the log: a reboot asked, an inspection, a budget wait."""
    outcome = getattr(run, "remediation", None)
    if outcome is None or (not outcome.decision.changes_slurm and outcome.decision.rule not in _REMEDY_SAID):
        return ""
    kind = "inspect" if outcome.decision.kind == "drain" else outcome.decision.kind
    text = f"remediation: {kind} [{outcome.decision.rule}] {outcome.decision.why}"
    if outcome.applied.error:
        text += f" (scontrol failed: {outcome.applied.error})"
    return text


def to_syslog(line: str, serious: bool) -> None:
    import syslog

    try:
        syslog.openlog("slurm-gpu-healthcheck", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING if serious else syslog.LOG_INFO, line)
        syslog.closelog()
    except OSError:
        pass


def evidence_wanted(run) -> bool:
    remedy = getattr(run, "remediation", None)
    return run.decision.kind in ("drain", "resume", "blocked") or bool(run.tally.confirmed) or \
        (remedy is not None and remedy.applied.done)


def write_all(run, state_dir: str, textfile_dir: str, use_syslog: bool) -> List[str]:
    """Write every output; returns what could not be written (one line each)."""
    problems: List[str] = []
    doc = run.to_json()
    try:
        ensure_dir(health_dir(state_dir))
        # Outputs every run rewrites: atomic, not fsynced (a crash loses one run's copy, never the state).
        atomic_write(last_path(state_dir, run.node), json.dumps(doc, sort_keys=True) + "\n", durable=False)
        if evidence_wanted(run):
            path = evidence_path(state_dir, run.node)
            rotate_if_full(path, EVIDENCE_MAX_BYTES)
            append_line(path, json.dumps(doc, sort_keys=True))
    except OSError as exc:
        problems.append(f"health record not written: {exc.strerror or exc}")
    try:
        directory = textfile_dir or health_dir(state_dir)
        ensure_dir(directory)
        atomic_write(textfile_path(directory, run.node), prometheus(run), mode=TEXTFILE_MODE, durable=False)
    except OSError as exc:
        problems.append(f"metrics textfile not written: {exc.strerror or exc}")
    line = log_line(run)
    if line is not None:
        serious = run.decision.kind in ("drain", "blocked") or run.applied.error is not None
        if use_syslog and not run.dry_run:
            to_syslog(line, serious)
        print(f"slurm-gpu-healthcheck: {line}", file=sys.stderr)
    return problems


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus(run) -> str:
    node = _label(run.node)
    worst = {}
    for finding in run.report.findings:
        current = worst.get(finding.check, "ok")
        if STATUS_VALUE[finding.status] > STATUS_VALUE[current]:
            worst[finding.check] = finding.status
    lines = [
        "# HELP slurm_gpu_health_check_status Worst status per check in the last run (0 ok, 1 warn, 2 fail, 3 error).",
        "# TYPE slurm_gpu_health_check_status gauge",
    ]
    for check in sorted(set(run.checks) | set(worst)):
        lines.append(f'slurm_gpu_health_check_status{{node="{node}",check="{_label(check)}"}} '
                     f"{STATUS_VALUE[worst.get(check, 'ok')]}")
    lines += ["# HELP slurm_gpu_health_findings Findings that are not ok in the last run, by status.",
              "# TYPE slurm_gpu_health_findings gauge"]
    for status in STATUSES[1:]:
        count = sum(1 for f in run.report.findings if f.status == status)
        lines.append(f'slurm_gpu_health_findings{{node="{node}",status="{status}"}} {count}')
    lines += ["# HELP slurm_gpu_health_decision The last run's decision (1 for the one taken).",
              "# TYPE slurm_gpu_health_decision gauge"]
    for kind in ("none", "drain", "resume", "blocked", "leave-alone"):
        lines.append(f'slurm_gpu_health_decision{{node="{node}",decision="{kind}"}} '
                     f"{1 if run.decision.kind == kind else 0}")
    blocks = run.state.budget_blocks if run.state is not None else 0
    lines += ["# HELP slurm_gpu_health_budget_blocks_total Drains the drain budget refused.",
              "# TYPE slurm_gpu_health_budget_blocks_total counter",
              f'slurm_gpu_health_budget_blocks_total{{node="{node}"}} {blocks}',
              "# HELP slurm_gpu_health_pending_causes Drain causes waiting for confirmation.",
              "# TYPE slurm_gpu_health_pending_causes gauge",
              f'slurm_gpu_health_pending_causes{{node="{node}"}} {len(run.tally.pending)}',
              "# HELP slurm_gpu_health_last_run_timestamp_seconds When the last run started.",
              "# TYPE slurm_gpu_health_last_run_timestamp_seconds gauge",
              f'slurm_gpu_health_last_run_timestamp_seconds{{node="{node}"}} {run.started:.3f}',
              "# HELP slurm_gpu_health_run_duration_seconds How long the last run took.",
              "# TYPE slurm_gpu_health_run_duration_seconds gauge",
              f'slurm_gpu_health_run_duration_seconds{{node="{node}"}} {run.duration_s:.3f}']
    lines += _remediation_metrics(run, node)
    return "\n".join(lines) + "\n"


def _remediation_metrics(run, node: str) -> List[str]:
    """The remediation's step and the reboots spent on this drain's fault ([remediate]); nothing
    on a run that had no drain of ours to remedy."""
    outcome = getattr(run, "remediation", None)
    remedy = outcome.request.remedy if outcome is not None else None
    if remedy is None:
        return []
    from ..remediate.plan import STEPS

    situation, step = remedy
    lines = ["# HELP slurm_gpu_health_remediation_step The remediation's step in the last run (1 for the one taken).",
             "# TYPE slurm_gpu_health_remediation_step gauge"]
    lines += [f'slurm_gpu_health_remediation_step{{node="{node}",step="{kind}"}} {1 if step.kind == kind else 0}'
              for kind in STEPS]
    lines += ["# HELP slurm_gpu_health_remediation_reboots Reboots spent on the drained fault within [remediate] window_s.",
              "# TYPE slurm_gpu_health_remediation_reboots gauge",
              f'slurm_gpu_health_remediation_reboots{{node="{node}"}} {situation.reboots}']
    return lines
