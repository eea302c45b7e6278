"""One health-check run, composed: checks -> causes confirmed over runs -> one Slurm query (none
on a quiet run: ``gate.Session._quiet``) -> decision -> drain budget -> apply -> state saved -> kernel-log cursor and counters committed ->
outputs -> post-decision steps.

Read, act, then commit: what the run read from the kernel log is committed only when the
decision is settled (applied, nothing to apply, or recorded for a node that is not ours to
change). Slurm unreachable, a failed scontrol, a spent budget or Slurm busy with the node leave it
uncommitted, so the
next run judges the same events again.
"""
from __future__ import annotations

import time
from ..plain import field, plain
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..actions.apply import Applied
from ..actions.decision import Decision
from ..config import Config
from ..config.settings import RemediatePolicy
from ..drain_reason import parse_reason
from ..findings import unseen, without_timeout_drains
from ..runner import Probes, Report, run_checks
from ..slurm.backend import SlurmBackend
from ..sources import NodeSources
from ..actions import state as node_state
from ..actions.cause import causes_of
from .policy import HealthPolicy
from .streaks import Tally, tally

TIER = "health"
CONSUMER = "hook"


@plain
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
    remediation: Optional[Any] = None                   # gate.Outcome of the remediation's step ([remediate])
    slurm_reachable: bool = True                        # the run's Slurm query answered (or none was needed)
    drained_by_us: Optional[str] = None                 # the cause Slurm holds the node drained for, ours
    outbox: Optional[Any] = None                        # outbox_stats.QueueStats: the records' queue on this host
    remedy_totals: Optional[Any] = None                 # remedy_totals.RemedyTotals: remediation on this node, ever

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
            "v": 1,                      # the document's format version (keys are only added within one)
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
            "remediation": None if self.remediation is None else {
                "step": self.remediation.decision.kind, "rule": self.remediation.decision.rule,
                "why": self.remediation.decision.why, "done": self.remediation.applied.done,
                "scontrol": self.remediation.applied.argv if self.remediation.decision.changes_slurm else None,
                "error": self.remediation.applied.error,
                # the GPU reset's argument list (step "reset"), as run
                "command": self.remediation.applied.argv if self.remediation.decision.kind == "reset" else None},
        }


# Steps run after the decision is applied and the run committed, each with the finished run.
# A step's failure is logged and never changes the decision.
PostStep = Callable[["HealthRun", Config], Any]


def _late_evidence(run: "HealthRun", config: Config) -> Any:
    """Amend the class of jobs that just ended on this node with what this run found failing."""
    from ..records.late import amend_from_health_run

    return amend_from_health_run(run, config)


def _retention(run: "HealthRun", config: Config) -> Any:
    """Prune the state dir by age ([retention]), at most once per every_s."""
    from .retention import Retention, maybe_prune

    return maybe_prune(config.state_dir, config.typed(Retention))


POST_DECISION_STEPS: List[PostStep] = [_late_evidence, _retention]


def run_health(config: Config, node: str, backend: SlurmBackend, sources: NodeSources,
               dry_run: bool = False, now: Optional[float] = None, probes: Optional[Probes] = None) -> HealthRun:
    """One run; ``probes``: the tier's probes, already started (``runner.start_probes``)."""
    from ..actions import gate

    started = time.time() if now is None else now
    clock = time.monotonic()
    policy = config.typed(HealthPolicy)
    boot = gate.read_boot_id(sources.boot_id_path)

    from ..remediate import health_reads

    report = run_checks(config, node, TIER, sources=sources, now=started, consumer=CONSUMER, probes=probes,
                        extra_reads=health_reads(config))
    without_timeout_drains(report.findings, policy.drain_on_probe_timeout)
    causes = causes_of(report.findings, policy.drain)

    # The drain gate: from the Slurm read to the saved state, this node's other hooks wait (no
    # double drain), and the drain record is the one they keep (whoever drained).
    with gate.session(config, backend, node, state_dir=sources.state_dir, policy=policy.drain, dry_run=dry_run) as door:
        # Counted from the state as it is under the lock (a newer version's: the gate says so):
        # the watcher's run and slurmd's can overlap, and what the other saved while this one
        # probed (an Xid's boot, a failing streak) is counted on, never written over.
        previous = door.state
        runs_in_boot = previous.runs_in_boot + 1 if previous.boot_id == boot else 1
        in_grace = runs_in_boot <= policy.boot_grace_runs
        counted = tally(causes, previous.failing, previous.xid_boots, boot, in_grace, policy)
        request = gate.Request("judge", node, "healthcheck", findings=tuple(report.findings),
                               causes=tuple(counted.confirmed), pending=bool(counted.pending),
                               unseen=unseen(report.findings), boot_id=boot, now=started)
        outcome = door.submit(request)
        remedy = None
        if not dry_run and door.state.drained is not None and config.typed(RemediatePolicy).enabled:
            from ..remediate.step import remediate      # only then: a quiet run loads none of it

            # The judgement saved before the remediation acts (a GPU reset, Slurm's reboot: the
            # run's longest steps): a watchdog striking there loses no drain of ours.
            problem = door.save(_state_after(outcome, door, counted, previous, boot, runs_in_boot))
            if problem:
                raise OSError(problem)
            remedy = remediate(door, boot, started, programs_dir=sources.programs_dir, busy_gpus=_busy_gpus(report))
        result = HealthRun(node=node, report=report, decision=outcome.decision, applied=outcome.applied,
                           tally=counted, boot_id=boot, in_grace=in_grace, dry_run=dry_run, started=started,
                           notes=_notes(outcome.notes, remedy), checks=list(config.tier(TIER)),
                           remediation=remedy, slurm_reachable=outcome.info is not None or not outcome.asked,
                           drained_by_us=_drained_by_us(outcome, door.state.drained, policy))
        if not dry_run:
            result.state = _state_after(outcome, door, counted, previous, boot, runs_in_boot)
            problem = door.save(result.state)
            if problem:
                raise OSError(problem)
    if not dry_run and _settled(result):
        report.add(report.commit())
        result.committed = True
    # What the metrics say of this host's records and this node's remediation: a listing and a small read.
    from ..actions.remedy_totals import read_totals
    from ..records.outbox_stats import queue_stats

    result.outbox = queue_stats(sources.state_dir, now=started)
    result.remedy_totals = read_totals(sources.state_dir, node)
    result.duration_s = time.monotonic() - clock
    return result


def _state_after(outcome, door, counted: Tally, previous, boot: str, runs_in_boot: int) -> "node_state.NodeState":
    """The health state this run leaves: its tally, the drain record as the gate keeps it."""
    from ..actions import gate

    return node_state.NodeState(
        boot_id=boot, runs_in_boot=runs_in_boot, failing=counted.failing, xid_boots=counted.xid_boots,
        drained=door.state.drained, budget_blocks=previous.budget_blocks + (1 if outcome.budget_blocked else 0),
        settled_boot=boot if gate.settles(outcome) and (outcome.asked or previous.settled_boot == boot) else "")


def _notes(judged: List[str], remedy) -> List[str]:
    """The run's notes: the judgement's, then the remediation's. A remediation that stopped for
    want of a ledger says so in one line, which stands for the judgement's own line about that
    ledger (the drain's episode not noted): the admin is told once per run."""
    if remedy is None:
        return list(judged)
    from ..actions.gate import LEDGER_NOT_SAVED
    from ..remediate.step import UNCOUNTED_RULE

    if remedy.decision.rule == UNCOUNTED_RULE:
        judged = [line for line in judged if not line.startswith(LEDGER_NOT_SAVED)]
    return list(judged) + list(remedy.notes)


def _busy_gpus(report) -> Tuple[int, ...]:
    """The GPUs (NVML indexes) this run saw a process on: no GPU reset for them."""
    nvml = report.facts.nvml
    return tuple(gpu.index for gpu in (nvml.gpus if nvml is not None else ()) if gpu.processes)


def _drained_by_us(outcome, record: Optional[node_state.Drained], policy: HealthPolicy) -> Optional[str]:
    """The cause this tool's reason names while Slurm holds the node drained or down after this
    run (a prolog's drain included); None when it does not. Slurm unreachable: the drain record's."""
    info, decision, applied = outcome.info, outcome.decision, outcome.applied
    if applied.done and decision.kind == "drain" and decision.cause is not None:
        return decision.cause.cause
    if applied.done and decision.kind == "resume":
        return None
    if info is None:
        return record.cause if record else None
    ours = parse_reason(info.reason, policy.drain.reason_prefix) if (info.drained or info.down) else None
    if ours is None:
        return None
    return ours.cause if ours.check else "unknown"


def _settled(run: HealthRun) -> bool:
    """Whether what the run read may be committed: the decision was applied, or there was
    nothing to apply, or it was recorded for a node that is not ours to change. A node Slurm is
    handling (NOT_RESPONDING while a rebooted slurmd registers, POWERING_UP, ...) is not judged
    now: what the run read stays uncommitted, so an Xid seen then drains the node once Slurm is
    done with it instead of being lost."""
    if run.applied.error is not None:
        return False
    if run.decision.rule == "slurm-busy":
        return False
    if run.decision.kind == "blocked":
        return run.decision.rule == "actions-off"
    return True
