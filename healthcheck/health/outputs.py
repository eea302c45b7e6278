"""What a health-check run leaves behind for people and monitoring: the last result as JSON,
an evidence record per node when it drained, resumed, was blocked or recorded a fault, a line in
syslog, and a Prometheus textfile for node_exporter's textfile collector. All written
atomically (or appended line by line) under the state dir; none is ever a reason to fail.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from ..findings import STATUSES
from ..safeio.fsutil import append_line, atomic_write, ensure_dir, path_component
from ..safeio.textfile import Family, exposition, number, publish
from ..hooklib.runlog import rotate_if_full
from ..actions.state import health_dir, last_path

EVIDENCE_MAX_BYTES = 1 << 20
STATUS_VALUE = {status: index for index, status in enumerate(STATUSES)}


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
    if outcome is None or (not outcome.decision.acts and outcome.decision.rule not in _REMEDY_SAID):
        return ""
    kind = "inspect" if outcome.decision.kind == "drain" else outcome.decision.kind
    text = f"remediation: {kind} [{outcome.decision.rule}] {outcome.decision.why}"
    if outcome.applied.error:
        failed = "the GPU reset" if outcome.decision.kind == "reset" else "scontrol"
        text += f" ({failed} failed: {outcome.applied.error})"
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
        problems += write_textfile(run, textfile_dir or health_dir(state_dir), explicit=bool(textfile_dir))
    except OSError as exc:
        problems.append(f"metrics textfile not written: {exc.strerror or exc}")
    line = log_line(run)
    if line is not None:
        serious = run.decision.kind in ("drain", "blocked") or run.applied.error is not None
        if use_syslog and not run.dry_run:
            to_syslog(line, serious)
        print(f"slurm-gpu-healthcheck: {line}", file=sys.stderr)
    return problems


def write_textfile(run, directory: str, explicit: bool = True) -> List[str]:
    """The textfile, atomically, mode 0644 whatever the umask, in a directory node_exporter can
    traverse (``safeio.textfile.publish``, the watcher's writer too)."""
    return publish(directory, os.path.basename(textfile_path(directory, run.node)), prometheus(run), explicit)


# -- the metrics ----------------------------------------------------------------------------------
# Each family is one function of the finished run; METRICS lists them in the order written. A new
# family (the remediation state, say) is one more function appended here, its name listed in
# docs/healthcheck.md (a test holds the two together) and, when it should be watched, a panel in
# etc/grafana/slurm-gpu-hooks.json.

# The decision metric's values are the --json contract's (a drain scontrol refused is "blocked").
DECISIONS = ("none", "drain", "resume", "blocked")
# Why a drain or resume was not applied, by the rule that blocked it (a failed scontrol: the run's error).
BLOCKED_BY = {"drain-budget": "budget", "slurm-unreachable-fault": "slurm-unreachable",
              "actions-off": "actions-off"}
BLOCKERS = ("budget", "slurm-unreachable", "actions-off", "scontrol-failed", "other")


def blocked_by(run) -> Optional[str]:
    """What kept the run's drain or resume from Slurm (None: nothing was blocked)."""
    if run.contract_decision != "blocked":
        return None
    if run.decision.kind == "blocked":
        return BLOCKED_BY.get(run.decision.rule, "scontrol-failed" if run.applied.error else "other")
    return "scontrol-failed"


def _check_status(run) -> Family:
    worst: Dict[str, str] = {}
    for finding in run.report.findings:
        current = worst.get(finding.check, "ok")
        if STATUS_VALUE[finding.status] > STATUS_VALUE[current]:
            worst[finding.check] = finding.status
    return Family("slurm_gpu_health_check_status", "gauge",
                  "Worst status per check in the last run (0 ok, 1 warn, 2 fail, 3 error).",
                  [({"check": check}, STATUS_VALUE[worst.get(check, "ok")])
                   for check in sorted(set(run.checks) | set(worst))])


def _findings(run) -> Family:
    return Family("slurm_gpu_health_findings", "gauge", "Findings that are not ok in the last run, by status.",
                  [({"status": status}, sum(1 for f in run.report.findings if f.status == status))
                   for status in STATUSES[1:]])


def _one_hot(label: str, taken, choices):
    """A sample per choice, 1 for the one taken (none when nothing was): alerts match on the label."""
    return [({label: choice}, 1 if taken == choice else 0) for choice in choices]


def _decision(run) -> Family:
    taken = run.contract_decision
    return Family("slurm_gpu_health_decision", "gauge",
                  "The last run's decision, as --json says it (1 for the one taken; a drain Slurm did not "
                  "take is blocked).",
                  _one_hot("decision", taken, DECISIONS))


def _left_alone(run) -> Family:
    return Family("slurm_gpu_health_left_alone", "gauge",
                  "1 when the last run left the node alone: drained or down for someone else's reason, "
                  "or Slurm is busy with it.",
                  [({}, 1 if run.decision.kind == "leave-alone" else 0)])


def _drained(run) -> Family:
    cause = getattr(run, "drained_by_us", None)
    return Family("slurm_gpu_health_drained", "gauge",
                  "1 while Slurm holds the node drained or down with this tool's reason, for that cause "
                  "(as Slurm said in the last run); 0, without a cause, when it does not.",
                  [({"cause": cause}, 1) if cause else ({}, 0)])


def _blocked(run) -> Family:
    by = blocked_by(run)
    return Family("slurm_gpu_health_blocked", "gauge",
                  "1 for what kept the last run's drain or resume from Slurm: the drain budget, Slurm "
                  "unreachable, actions off ([drain] enabled = false), or scontrol failed.",
                  _one_hot("by", by, BLOCKERS))


def _slurm_up(run) -> Family:
    return Family("slurm_gpu_health_slurm_up", "gauge",
                  "1 when the last run could ask Slurm about the node, 0 when Slurm did not answer.",
                  [({}, 1 if getattr(run, "slurm_reachable", True) else 0)])


def _budget_blocks(run) -> Family:
    blocks = run.state.budget_blocks if run.state is not None else 0
    return Family("slurm_gpu_health_budget_blocks_total", "counter", "Drains the drain budget refused.",
                  [({}, blocks)])


def _pending(run) -> Family:
    return Family("slurm_gpu_health_pending_causes", "gauge", "Drain causes waiting for confirmation.",
                  [({}, len(run.tally.pending))])


def _last_run(run) -> Family:
    return Family("slurm_gpu_health_last_run_timestamp_seconds", "gauge", "When the last run started.",
                  [({}, round(run.started, 3))])


def _duration(run) -> Family:
    return Family("slurm_gpu_health_run_duration_seconds", "gauge", "How long the last run took.",
                  [({}, round(run.duration_s, 3))])


def _queue(run):
    """The records' outbox on this host (``outbox_stats.QueueStats``); an empty one when not read."""
    from ..records.outbox_stats import QueueStats

    return getattr(run, "outbox", None) or QueueStats()


def _outbox_entries(run) -> Family:
    return Family("slurm_gpu_health_outbox_entries", "gauge",
                  "Job records' AdminComment entries queued on this host, not yet in accounting.",
                  [({}, _queue(run).entries)])


def _outbox_oldest_age(run) -> Family:
    return Family("slurm_gpu_health_outbox_oldest_age_seconds", "gauge",
                  "How long the oldest queued entry has waited for accounting (0 with none queued).",
                  [({}, round(_queue(run).oldest_age_s, 3))])


def _delivery_failures(run) -> Family:
    return Family("slurm_gpu_health_delivery_failures_total", "counter",
                  "Deliveries of a job's entries to accounting that failed or were given up, on this host.",
                  [({}, _queue(run).failures)])


def _totals(run):
    """What remediation did on this node, ever (``remedy_totals.RemedyTotals``)."""
    from ..actions.remedy_totals import RemedyTotals

    return getattr(run, "remedy_totals", None) or RemedyTotals()


def _remediation_reboots_asked(run) -> Family:
    return Family("slurm_gpu_health_remediation_reboots_asked_total", "counter",
                  "Reboots the remediation asked Slurm for on this node.", [({}, _totals(run).reboots)])


def _remediation_gpu_resets(run) -> Family:
    return Family("slurm_gpu_health_remediation_gpu_resets_total", "counter",
                  "GPU resets the remediation tried on this node.", [({}, _totals(run).resets)])


def _remediation_inspections(run) -> Family:
    return Family("slurm_gpu_health_remediation_inspections_total", "counter",
                  "Drains the remediation handed to a person (it gave up: inspection).",
                  [({}, _totals(run).inspections)])


def _back_in_service(run) -> Family:
    from ..actions.remedy_totals import BACK_IN_SERVICE_BUCKETS

    totals = _totals(run)
    bounds = [number(bound) for bound in BACK_IN_SERVICE_BUCKETS] + ["+Inf"]
    cumulative = [sum(totals.back_in_service[:index + 1]) for index in range(len(bounds))]
    return Family("slurm_gpu_health_remediation_back_in_service_seconds", "histogram",
                  "From a drain of ours to the node back in service, each time it came back.",
                  [({"le": bound}, count) for bound, count in zip(bounds, cumulative)],
                  observed=(round(totals.back_in_service_sum, 3), cumulative[-1]))


def _remedy(run):
    """(situation, step) of the run's remediation ([remediate]); None without a drain of ours to remedy."""
    outcome = getattr(run, "remediation", None)
    return outcome.request.remedy if outcome is not None else None


# Written only on a run that had a drain of ours to remedy ([remediate]).
REMEDIATION_FAMILIES = ("slurm_gpu_health_remediation_step", "slurm_gpu_health_remediation_reboots")


def _remediation_step(run) -> Optional[Family]:
    remedy = _remedy(run)
    if remedy is None:
        return None
    from ..remediate.plan import STEPS

    _, step = remedy
    return Family(REMEDIATION_FAMILIES[0], "gauge", "The remediation's step in the last run (1 for the one taken).",
                  [({"step": kind}, 1 if step.kind == kind else 0) for kind in STEPS])


def _remediation_reboots(run) -> Optional[Family]:
    remedy = _remedy(run)
    if remedy is None:
        return None
    situation, _ = remedy
    return Family(REMEDIATION_FAMILIES[1], "gauge", "Reboots spent on the drained fault within [remediate] window_s.",
                  [({}, situation.reboots)])


# A metric is a function of the finished run: its family, or None when this run writes none.
METRICS: List[Callable[[Any], Optional[Family]]] = [
    _check_status, _findings, _decision, _left_alone, _drained, _blocked, _slurm_up, _budget_blocks, _pending,
    _last_run, _duration, _outbox_entries, _outbox_oldest_age, _delivery_failures, _remediation_reboots_asked,
    _remediation_gpu_resets, _remediation_inspections, _back_in_service, _remediation_step, _remediation_reboots,
]


def families(run) -> List[Family]:
    return [family for family in (metric(run) for metric in METRICS) if family is not None]


def prometheus(run) -> str:
    return exposition(families(run), run.node)
