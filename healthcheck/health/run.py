"""One health-check run, composed: checks -> causes confirmed over runs -> one Slurm query ->
decision -> drain budget -> apply -> state saved -> kernel-log cursor and counters committed ->
outputs -> post-decision steps.

Read, act, then commit: what the run read from the kernel log is committed only when the
decision is settled (applied, nothing to apply, or recorded for a node that is not ours to
change). Slurm unreachable, a failed scontrol or a spent budget leave it uncommitted, so the
next run judges the same events again.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional

from ..actions.apply import Applied, apply
from ..actions.decision import Decision, decide
from ..actions.serial import decision_lock_wait_s, deciding_alone
from ..config import Config
from ..findings import unseen, without_timeout_drains
from ..runner import Report, run_checks
from ..slurm.backend import NodeInfo, SlurmBackend, SlurmError
from ..sources import NodeSources
from . import state as node_state
from .budget import keeps_its_drain, over_budget
from .policy import REPEAT_CHECK, HealthPolicy
from .tally import Tally, causes_of, tally

TIER = "health"
CONSUMER = "hook"
# Nodes decide their drains at the same moment (slurmd fires every node's health check on one
# interval), each after one query that cannot see the others' drains yet. The re-check after our
# drain waits this long first, so every concurrent drain is visible to every node and all of them
# rank the drains alike; otherwise two nodes each see only themselves and both keep their drains.
BUDGET_SETTLE_S = 2.0


@dataclass
class HealthRun:
    node: str
    report: Report
    decision: Decision
    applied: Applied
    tally: Tally
    boot_id: str
    in_grace: bool
    dry_run: bool
    started: float
    duration_s: float = 0.0
    committed: bool = False
    notes: List[str] = field(default_factory=list)      # extra log lines (budget, undone drains)
    state: Optional[node_state.NodeState] = None
    checks: List[str] = field(default_factory=list)     # the tier's check ids (for per-check metrics)

    @property
    def contract_decision(self) -> str:
        """``decision`` of the --json contract: none | drain | resume | blocked."""
        kind = self.decision.kind
        if kind == "leave-alone":
            return "none"
        if kind in ("drain", "resume") and self.dry_run:
            return kind
        if kind in ("drain", "resume") and not self.applied.done:
            return "blocked"
        return kind

    def to_json(self) -> Dict[str, Any]:
        scontrol = self.applied.argv if self.decision.changes_slurm or self.decision.kind == "blocked" else None
        return {
            "node": self.node,
            "decision": self.contract_decision,
            "reason": self.decision.reason,
            "scontrol": scontrol,
            "findings": [finding.to_json() for finding in self.report.findings],
            # beyond the contract
            "rule": self.decision.rule,
            "why": self.decision.why,
            "detail": self.decision.kind,
            "error": self.applied.error,
            "dry_run": self.dry_run,
            "status": self.report.status,
            "pending": [{"cause": cause.key, "failing_runs": count, "needed": needed}
                        for cause, count, needed in self.tally.pending],
            "boot_id": self.boot_id,
            "boot_grace": self.in_grace,
            "committed": self.committed,
            "notes": self.notes,
            "time": self.started,
            "duration_ms": int(self.duration_s * 1000),
        }


# Steps run after the decision is applied and the run committed, each with the finished run.
# A step's failure is logged and never changes the decision.
PostStep = Callable[["HealthRun", Config], Any]


def _late_evidence(run: "HealthRun", config: Config) -> Any:
    """Amend the class of jobs that just ended on this node with what this run found failing."""
    from ..records.late import amend_from_health_run

    return amend_from_health_run(run, config)


POST_DECISION_STEPS: List[PostStep] = [_late_evidence]


def read_boot_id(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(128).strip() or "unknown"
    except OSError:
        return "unknown"


def _drain_policy(policy: HealthPolicy, previous: node_state.NodeState):
    by_cause = {previous.drained.cause: previous.drained.resume_mode} if previous.drained else {}
    by_check = dict(policy.resume_by_check)
    by_check[REPEAT_CHECK] = "never"
    return replace(policy.drain, resume_default=policy.resume_default, resume_by_check=by_check,
                   resume_by_cause=by_cause)


def _blocked(decision: Decision, rule: str, why: str) -> Decision:
    return Decision("blocked", decision.node, rule, why, reason=decision.reason, cause=decision.cause,
                    scontrol=decision.scontrol)


def run_health(config: Config, node: str, backend: SlurmBackend, sources: NodeSources,
               dry_run: bool = False, now: Optional[float] = None) -> HealthRun:
    started = time.time() if now is None else now
    clock = time.monotonic()
    policy = HealthPolicy.from_config(config)
    boot = read_boot_id(sources.boot_id_path)
    previous = node_state.load(sources.state_dir, node)
    runs_in_boot = previous.runs_in_boot + 1 if previous.boot_id == boot else 1
    in_grace = runs_in_boot <= policy.boot_grace_runs

    report = run_checks(config, node, TIER, sources=sources, now=started, consumer=CONSUMER)
    without_timeout_drains(report.findings, policy.drain_on_probe_timeout)
    counted = tally(causes_of(report.findings, policy), previous.failing, previous.xid_boots, boot, in_grace, policy)

    notes: List[str] = []
    # From the Slurm read to the applied decision, this node's other hooks wait (no double drain).
    serial = contextlib.nullcontext() if dry_run else deciding_alone(sources.state_dir, node, decision_lock_wait_s(config))
    with serial as unlocked:
        if unlocked:
            notes.append(unlocked)
        # The one Slurm query of a healthy run: this node.
        try:
            info: Optional[NodeInfo] = backend.node(node)
            slurm_error = ""
        except SlurmError as exc:
            info, slurm_error = None, str(exc)
        rebooted = (previous.drained.boot_id != boot) if previous.drained else None
        decision = decide(node, info, report.findings, _drain_policy(policy, previous), slurm_error=slurm_error,
                          rebooted_since_drain=rebooted, causes=[cause.reason for cause in counted.confirmed],
                          pending=bool(counted.pending), unseen=unseen(report.findings))
        budget_blocked = False
        if decision.kind == "drain" and decision.rule == "drain" and policy.budget_enabled:
            try:
                why = over_budget(backend.nodes(), node, policy, started)
            except SlurmError as exc:
                why = None
                decision = _blocked(decision, "slurm-unreachable-fault",
                                    f"Slurm could not be asked for the drain budget ({exc}); not draining now")
            if why:
                budget_blocked = True
                decision = _blocked(decision, "drain-budget", f"{why}: not draining for {decision.cause.cause}")

        applied = apply(backend, decision, dry_run=dry_run)
        if applied.done and decision.rule == "drain" and policy.budget_enabled:
            try:
                time.sleep(BUDGET_SETTLE_S)
                if not keeps_its_drain(backend.nodes(), node, policy, time.time()):
                    backend.resume(node)
                    budget_blocked = True
                    notes.append("another node drained at the same time and the budget holds one fewer: "
                                 "this drain was undone")
                    decision = _blocked(decision, "drain-budget", "drain budget spent by a concurrent drain; undone")
                    applied = Applied(decision, applied.argv, done=False)
            except SlurmError as exc:
                notes.append(f"drain budget not re-checked after the drain: {exc}")

    result = HealthRun(node=node, report=report, decision=decision, applied=applied, tally=counted, boot_id=boot,
                       in_grace=in_grace, dry_run=dry_run, started=started, notes=notes,
                       checks=list(config.tier(TIER)))
    if not dry_run:
        result.state = _next_state(previous, result, info, boot, runs_in_boot, budget_blocked, policy)
        node_state.save(sources.state_dir, node, result.state)
        if _settled(result):
            report.add(report.commit())
            result.committed = True
    result.duration_s = time.monotonic() - clock
    return result


def _settled(run: HealthRun) -> bool:
    """Whether what the run read may be committed: the decision was applied, or there was
    nothing to apply, or it was recorded for a node that is not ours to change."""
    if run.applied.error is not None:
        return False
    if run.decision.kind == "blocked":
        return run.decision.rule == "actions-off"
    return True


def _next_state(previous: node_state.NodeState, run: HealthRun, info: Optional[NodeInfo], boot: str,
                runs_in_boot: int, budget_blocked: bool, policy: HealthPolicy) -> node_state.NodeState:
    drained = previous.drained
    decision = run.decision
    if run.applied.done and decision.kind == "drain":
        mode = next((c.resume_mode for c in run.tally.confirmed if c.key == decision.cause.cause), "auto")
        findings = [c.finding.to_json() for c in run.tally.confirmed]
        drained = node_state.Drained(cause=decision.cause.cause, resume_mode=mode, boot_id=boot, at=run.started,
                                     reason=decision.reason or "", evidence=findings)
    elif run.applied.done and decision.kind == "resume":
        drained = None
    elif info is not None and not (info.drained or info.down):
        drained = None                       # resumed by someone (an admin, slurm-gpu resume)
    elif info is not None and decision.rule in ("foreign-reason", "foreign-out-of-service"):
        drained = None                       # someone else's now
    return node_state.NodeState(boot_id=boot, runs_in_boot=runs_in_boot, failing=run.tally.failing,
                                xid_boots=run.tally.xid_boots, drained=drained,
                                budget_blocks=previous.budget_blocks + (1 if budget_blocked else 0))
