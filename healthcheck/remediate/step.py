"""One remediation run inside the drain gate's session (the node's lock held), after the health
check's judgement: read the ledger and Slurm, take the next step (``plan.next_step``), hand its
decision to the gate (``Request.decide``), count what was done in the ledger. A refused or failed
GPU reset becomes a reboot in the same run; a reboot waits for its turn within ``[remediate]
max_rebooting_nodes`` (``actions.budget.settle``, a claim in our reason as the act)."""
from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple

from ..actions import budget
from ..actions.decision import Decision
from ..actions.gate import SLURM_UNREACHABLE, Applied, Outcome, Request, Session, apply, keep
from ..actions import kept, ledger as ledgers
from ..actions.gpu_reset import reset_argv, reset_target, resolved
from ..config.settings import RemediatePolicy
from ..drain_reason import format_reason, parse_reason
from ..plain import replace
from ..slurm.backend import NodeInfo, SlurmError, drain_argv, reboot_argv
from .plan import (CLAIM_KEY, CLAIM_VALUE, INSPECT_KEY, Situation, Step, inspect_reason, next_step,
                   reason_with, reboot_turn, rebooting, within)

# The remediation asked nothing because it cannot count (``uncounted``).
UNCOUNTED_RULE = "remediate-uncounted"


def remediate(door: Session, boot_id: str, now: Optional[float] = None, programs_dir: Optional[str] = None,
              busy_gpus: Sequence[int] = ()) -> Optional[Outcome]:
    """The remediation's step for our drain; None when ``[remediate]`` is off or nothing of ours is
    drained. ``programs_dir``: a simulated node's programs (its ``nvidia-smi``); ``busy_gpus``: the
    GPUs (NVML indexes) the run saw a process on."""
    rpolicy = door.config.typed(RemediatePolicy)
    if not rpolicy.enabled or door.state.drained is None:
        return None
    now = time.time() if now is None else now
    try:
        with ledgers.held(door.state_dir, door.node) as ledger:
            return _remediate(door, rpolicy, ledger, boot_id, now, programs_dir, busy_gpus)
    except (OSError, ValueError) as exc:
        return uncounted(door, None, ledgers.ledger_path(door.state_dir, door.node), exc)


def uncounted(door: Session, info: Optional[NodeInfo], path: str, exc: BaseException) -> Outcome:
    """The remediation stopped because it cannot count (the ledger cannot be read or written:
    its path a directory, a full or read-only disk): nothing is asked (no reboot, no GPU reset),
    and the run's notes say so in one line, every run, until it can. A count that cannot be
    written down before the act would let a lemon be rebooted for ever."""
    why = f"the remediation ledger {path} cannot be used ({getattr(exc, 'strerror', None) or exc})"
    ours = parse_reason(info.reason, door.policy.reason_prefix) if info is not None and info.reason else None
    decision = Decision("none", door.node, UNCOUNTED_RULE, f"{why}: it cannot count, so it asks nothing",
                        reason=(info.reason or None) if info is not None else None, cause=ours)
    return Outcome(Request("remediate", door.node, "healthcheck"), decision, Applied(decision, None, done=False),
                   info, notes=[f"remediation stopped: {why}; no reboot and no GPU reset until it can count "
                                "(fix or remove that path)"], asked=info is not None)


def _written(door: Session, ledger) -> Optional[BaseException]:
    """The ledger saved (atomically, fsync'd); the error when it could not be."""
    try:
        ledgers.save(door.state_dir, door.node, ledger)
    except (OSError, ValueError) as exc:
        return exc
    return None


def _remediate(door: Session, rpolicy: RemediatePolicy, ledger, boot_id: str, now: float,
               programs_dir: Optional[str], busy_gpus: Sequence[int]) -> Optional[Outcome]:
    record = door.state.drained
    path = ledgers.ledger_path(door.state_dir, door.node)
    try:
        info = door.backend.node(door.node)
    except SlurmError as exc:
        door.notes.append(f"remediation: Slurm could not be asked ({exc})")
        return None
    ours = parse_reason(info.reason, door.policy.reason_prefix) if info.reason else None
    sign = ledgers.signature_of(record)
    situation = situation_of(record, info, ours, ledger, sign, boot_id, now, rpolicy, busy_gpus)
    step = next_step(situation, rpolicy)
    said: List[str] = []
    if step.kind == "reset-gpu":
        subject = record.cause.split(" ")[1] if " " in record.cause else ""
        target = reset_target(record.evidence or (), subject)
        command = resolved(reset_argv(rpolicy.gpu_reset_command, target), programs_dir) if target else None
        ledger.note_reset(sign, record.cause, boot_id, now)     # tried once per boot, counted either way
        problem = _written(door, ledger)                        # written down before it runs
        if problem is not None:
            return uncounted(door, info, path, problem)
        reset = _submit(door, situation, step, boot_id, now, command, rpolicy.gpu_reset_timeout_s)
        if reset.applied.done:
            return reset
        # Refused or failed: a reboot instead (within the budget), this run.
        said.append(f"remediation: GPU reset not done ({reset.applied.error or reset.decision.why}); "
                    "a reboot instead")
        situation = replace(situation, resets=situation.resets + 1, asked="")
        step = next_step(situation, rpolicy)
    if step.kind == "reboot" and rpolicy.records_wait_s > 0:
        left, said_records = _records_first(door)
        if said_records:
            said.append(said_records)
        situation = replace(situation, undelivered=left, drained_for_s=max(0.0, now - record.at))
        step = next_step(situation, rpolicy)
    undo = None
    if step.kind == "reboot":
        # Counted before it is asked: a ledger that cannot be written stops the loop here, before
        # a turn is claimed; a reboot not asked after all (not our turn, Slurm refused) is taken
        # back from the count below.
        undo = ledger.to_json()
        before = ledger.asked
        ledger.note_reboot(sign, record.cause, boot_id, now)
        # In flight only once Slurm took it (below): a run killed while scontrol reboot ran has
        # counted the reboot (one too many at worst) and the next run asks again unless Slurm
        # shows it, instead of waiting in this boot for a reboot that may never come.
        ledger.asked = before
        problem = _written(door, ledger)
        if problem is not None:
            return uncounted(door, info, path, problem)
    if step.kind == "reboot" and rpolicy.max_rebooting_nodes > 0:
        try:
            situation = replace(situation, rebooting_elsewhere=len(rebooting(door.backend.nodes(), door.node)))
            step = next_step(situation, rpolicy)
            if step.kind == "reboot" and not _my_turn(door, info, ours, rpolicy):
                step = Step("wait-budget", "reboot-budget", "another node's turn within [remediate] max_rebooting_nodes")
        except SlurmError as exc:
            step = Step("none", "slurm-unreachable", f"Slurm could not be asked for the reboot budget ({exc})")
    not_kept = _keep_reboot(door, info, sign, now, rpolicy.window_s) if step.kind == "reboot" else None
    kept_in_slurm = step.kind == "reboot" and not_kept is None
    outcome = _submit(door, situation, step, boot_id, now)
    outcome.notes[:0] = said
    if not_kept is not None:
        outcome.notes.append(not_kept)
    asked = outcome.applied.done and outcome.decision.kind == "reboot"
    if undo is not None and not asked:                      # no reboot after all: not counted, here or in Slurm
        ledger = ledgers.Ledger.from_json(undo)
        if kept_in_slurm:
            _keep(door, info.extra, "remediate-keep-undo", "no reboot after all: the count kept goes back")
    elif outcome.applied.done and outcome.decision.kind == "drain":
        ledger.note_inspect(sign, record.cause, now)
    if asked:
        ledger.asked = ledgers.Asked("reboot", sign, boot_id, now)
    if undo is not None or outcome.applied.done and outcome.decision.kind == "drain":
        problem = _written(door, ledger)
        if problem is not None:
            outcome.notes.append(f"remediation: the ledger {path} not saved "
                                 f"({getattr(problem, 'strerror', None) or problem})")
    return outcome


# Jobs delivered per remediation run: the run stays well within the health check's deadline
# (a write and its check take about a second each); the rest go out in the next runs.
RECORDS_PER_RUN = 8


def _records_first(door: Session) -> Tuple[int, Optional[str]]:
    """The node's queued records, delivered before a reboot (at most ``RECORDS_PER_RUN`` jobs, the
    queue's lock waited for briefly): (jobs still queued, one line when some are)."""
    from ..records.outbox import DeliverySettings, deliver, pending
    from ..slurm.job_accounting import SlurmAccounting

    report = deliver(door.state_dir, SlurmAccounting(door.backend),
                     replace(DeliverySettings.from_config(door.config), max_jobs_per_run=RECORDS_PER_RUN, lock_wait_s=2.0))
    left = len(pending(door.state_dir))
    if not left:
        return 0, None
    why = f": {report.error}" if report.error else ""
    return left, f"remediation: {left} job record(s) not yet in accounting before the reboot{why}"


def _keep(door: Session, extra: str, rule: str, why: str) -> Optional[str]:
    """The node's Extra set to ``extra`` through the gate's edge; a failure as one line."""
    done = keep(door.backend, door.node, extra, rule, why, dry_run=door.dry_run)
    return None if done.done or done.dry_run else f"remediation: reboot count not kept in Slurm ({done.error})"


def _keep_reboot(door: Session, info: NodeInfo, sign: str, now: float, window_s: float) -> Optional[str]:
    """Before the reboot is asked: its count kept with the node in Slurm (``actions/kept.py``),
    where a stateless node finds it after the boot. Not kept (Slurm refused): one line, and the
    reboot goes ahead on the local count."""
    return _keep(door, kept.noting_reboot(info.extra, sign, now, window_s), "remediate-keep",
                 "the reboot counted with the node in Slurm (Extra), where it outlives the boot")


def _submit(door: Session, situation: Situation, step: Step, boot_id: str, now: float,
            reset_command=None, reset_timeout_s: float = 0.0) -> Outcome:
    """The step through the gate: it reads Slurm under the lock and applies ``step_decision``."""
    return door.submit(Request("remediate", door.node, "healthcheck", boot_id=boot_id, now=now, remedy=(situation, step),
                               decide=lambda info, error: step_decision(door, info, error, situation, step,
                                                                        reset_command, reset_timeout_s)))


def step_decision(door: Session, info: Optional[NodeInfo], slurm_error: str, situation: Situation, step: Step,
                  reset_command=None, reset_timeout_s: float = 0.0) -> Decision:
    """The step as the gate's decision (pure): a reboot asked of Slurm, the drain's GPU reset,
    our reason turned into an inspection, or nothing now."""
    node, prefix, width = door.node, door.policy.reason_prefix, door.policy.max_reason_len
    if info is None:
        return Decision("none", node, SLURM_UNREACHABLE, f"Slurm could not be asked ({slurm_error or 'no answer'})")
    ours = parse_reason(info.reason, prefix) if info.reason else None
    rule = f"remediate-{step.rule}"
    if step.kind == "reboot" and ours is not None:
        text = format_reason(reason_with(ours, {CLAIM_KEY: ""}), prefix, width)
        return Decision("reboot", node, rule, step.why, reason=text, cause=ours, scontrol=reboot_argv(node, text))
    if step.kind == "reset-gpu" and ours is not None:
        if not reset_command:
            return Decision("none", node, "remediate-reset-refused",
                            "no GPU reset command to run ([remediate] gpu_reset_command not found)",
                            reason=info.reason or None, cause=ours)
        return Decision("reset", node, rule, step.why, reason=info.reason or None, cause=ours,
                        command=tuple(reset_command), timeout_s=reset_timeout_s)
    if step.kind == "inspect" and ours is not None:
        text = format_reason(inspect_reason(ours, situation.reboots), prefix, width)
        return Decision("drain", node, rule, step.why, reason=text, cause=ours, scontrol=drain_argv(node, text))
    return Decision("none", node, rule, step.why, reason=info.reason or None, cause=ours)


def _my_turn(door: Session, info: NodeInfo, ours, rpolicy: RemediatePolicy) -> bool:
    """The reboot budget without a race (``budget.settle``): claim a turn in our reason
    (``next:reboot``), let every node that decides at this moment claim too, read them all, and
    keep the turn only within ``max_rebooting_nodes`` (``plan.reboot_turn``); else the claim is
    taken back."""
    if ours is None:
        return False
    node, prefix, width = door.node, door.policy.reason_prefix, door.policy.max_reason_len

    def reason(claim: str) -> Decision:
        text = format_reason(reason_with(ours, {CLAIM_KEY: claim}), prefix, width)
        return Decision("drain", node, "remediate-claim" if claim else "remediate-unclaim",
                        "a turn to reboot" if claim else "not our turn", reason=text, cause=ours,
                        scontrol=drain_argv(node, text))

    claim = reason(CLAIM_VALUE)
    if claim.reason != info.reason:
        apply(door.backend, claim)
    return budget.settle(door.backend.nodes,
                         lambda nodes: reboot_turn(nodes, node, rpolicy.max_rebooting_nodes, prefix),
                         lambda: apply(door.backend, reason("")))


def situation_of(record, info: NodeInfo, ours, ledger, sign: str, boot_id: str, now: float,
                 rpolicy: RemediatePolicy, busy_gpus: Sequence[int] = ()) -> Situation:
    """What the remediation decision looks at (``plan.Situation``), from the drain record, Slurm's
    node, our reason on it and the ledger."""
    entry = ledger.entries.get(sign)
    # The reboots counted here, or in Slurm (a stateless node starts each boot with no ledger):
    # the larger count holds.
    local = len(within(entry.reboots, now, rpolicy.window_s)) if entry else 0
    slurm = len(within(kept.times_for(info.extra, sign), now, rpolicy.window_s))
    asked = ledger.asked_in(boot_id) if ledger.asked is not None and ledger.asked.signature == sign else ""
    return Situation(
        ours=ours is not None, resume_mode=record.resume_mode, flags=tuple(info.flags),
        idle=info.drained and info.base == "IDLE" and not info.has("COMPLETING"),
        inspecting=ours is not None and INSPECT_KEY in ours.keys, asked=asked,
        reboots=max(local, slurm),
        resets=entry.resets.get(boot_id, 0) if entry else 0,
        gpu_scoped=ours is not None and ours.subject.startswith("gpu"),
        gpu_busy=ours is not None and ours.subject in {f"gpu{index}" for index in busy_gpus},
        reboot_only=reboot_only(ours),
        xid=str(ours.xid) if ours is not None and ours.xid is not None else "")


def reboot_only(ours) -> bool:
    """Whether our reason's cause asks for a reboot itself: a ``gpu.recovery_action`` drain whose
    recovery action (``action:<name>``) maps to our ``reboot`` (xid-action-map.tsv "recovery" rows:
    Node Reboot, System Reboot); a GPU reset is not what the driver asked for."""
    if ours is None or ours.check != "gpu.recovery_action":
        return False
    from ..facts import GPU_RECOVERY_ACTIONS
    from ..xid.catalog import action_map

    values = {name: value for value, name in GPU_RECOVERY_ACTIONS.items()}
    value = values.get(ours.keys.get("action", ""))
    mapped = action_map().get("recovery", {}).get(str(value)) if value is not None else None
    return mapped is not None and mapped.action == "reboot"
