"""The drain gate: the one module of the product through which Slurm's node state changes.

Every hook (health check, prolog, epilog) and ``slurm-gpu resume`` hand the gate a ``Request``
(who asks, for which node, what was found) and get an ``Outcome`` back. In between, the gate
alone does, in this order, under the node's decision lock (``serial.deciding_alone``):

1. read what the health state remembers of our drain (cause, resume mode, boot: the *record*);
2. read the node from Slurm (``backend.node``; no answer: ``slurm-unreachable-fault``, no change),
   except on a health check's quiet run (``Session._quiet``: nothing to act on, no drain of ours
   on record this boot), which asks Slurm nothing;
3. decide (pure: ``decision.decide`` for a drain or a judged run, ``_admin_resume`` for the CLI):
   ownership (a reason that is not ours is never overwritten nor resumed), Slurm busy with the
   node, the resume mode and the reboot since the drain;
4. the drain budget for a new drain (``budget``; Slurm not answering the budget query is
   ``slurm-unreachable-fault`` too: one name for Slurm not answering);
5. apply: the one call that changes Slurm (``EDGES``), said to the watchdog before and after;
6. after a new drain, the budget's settle (``budget.settle``): our drain undone, through ``apply``,
   when concurrent drains put it beyond the budget (``drain-budget``);
7. the record: a drain applied by any hook records its cause, resume mode, boot and evidence, so
   the health check knows it (the reboot-aware resume) and ``slurm-gpu drained`` shows it; a
   resume forgets it.

Slurm's failures come back in the outcome as one line, never as an exception.

Adding an action (the remediation's reboot: ``scontrol reboot ASAP reason=...``)
is one kind in ``decision.CHANGING_KINDS`` and one edge in ``EDGES``; it then gets the lock, the
record, the control-plane faults and the watchdog notes from here. The remediation
(``healthcheck/remediate/step.py``) decides its step itself and hands it in (``Request.decide``).
"""
from __future__ import annotations

import contextlib
import time
from ..plain import field, plain, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..config.settings import RemediatePolicy
from ..findings import Finding
from ..slurm.backend import NodeInfo, SlurmBackend, SlurmError, extra_argv, resume_argv
from ..hooklib.watchdog import note
from . import budget, state as node_state
from .cause import causes_of
from .decision import GAVE_UP_KEY, Decision, Policy, decide

# One name for "Slurm could not answer", whether the node query or the drain budget's query.
SLURM_UNREACHABLE = "slurm-unreachable-fault"
# The drain budget refused a new drain, or undid one a concurrent drain put beyond it.
BUDGET_RULE = "drain-budget"
# The line that says a drain's episode could not be noted in the remediation ledger.
LEDGER_NOT_SAVED = "remediation ledger not saved"
# Rules after which the drain record is forgotten: the node is someone else's now.
FOREIGN_RULES = ("foreign-reason", "foreign-out-of-service")


@plain(frozen=True)
class Request:
    """What a caller asks of the gate for one node.

    intent: ``judge`` (the health check: drain or resume, as the findings say), ``drain`` (the
    prolog and epilog: drain when a finding asks for it, never resume), ``resume`` (an admin's
    ``slurm-gpu resume``: resume our drain when no finding drains; ``force``: any drain),
    ``remediate`` (the remediation's step: ``decide`` gives it from the node as the gate read it)."""
    intent: str
    node: str
    by: str                                        # healthcheck | prolog | epilog | cli
    findings: Tuple[Finding, ...] = ()
    causes: Optional[Tuple[Any, ...]] = None       # health.streaks.Cause, confirmed; None: every drain finding's
    pending: bool = False                          # drain findings still waiting for confirmation
    unseen: bool = False                           # a probe did not answer (findings.unseen)
    boot_id: str = "unknown"                       # the running boot (``read_boot_id``)
    force: bool = False                            # resume: also a drain that is not ours
    now: Optional[float] = None
    # remediate: (plan.Situation, plan.Step) as the session read them under the node's lock
    remedy: Optional[Tuple[Any, Any]] = None
    # remediate: (the node as the gate read it or None, Slurm's error) -> the decision
    decide: Optional[Callable[[Optional[NodeInfo], str], Decision]] = None


@plain
class Applied:
    decision: Decision
    argv: Optional[List[str]]        # ["scontrol", "update", ...] run (or, dry run, that would run)
    done: bool                       # Slurm was changed
    dry_run: bool = False
    error: Optional[str] = None      # one line: why the change failed

    @property
    def settled(self) -> bool:
        """Nothing is left to do for this decision: applied, or nothing to apply."""
        return self.error is None and (self.done or not self.decision.acts)


@plain
class Outcome:
    request: Request
    decision: Decision
    applied: Applied
    info: Optional[NodeInfo]                       # the node as Slurm showed it (None: no answer)
    notes: List[str] = field(default_factory=list)     # lines for the log (lock, budget, undo)
    budget_blocked: bool = False                   # the budget refused or undid the drain
    asked: bool = True                             # Slurm was asked (a quiet health-check run does not ask)


# -- the edge ----------------------------------------------------------------------------------------

def _drain(backend: SlurmBackend, decision: Decision) -> None:
    backend.drain(decision.node, decision.reason or "")


def _resume(backend: SlurmBackend, decision: Decision) -> None:
    backend.resume(decision.node)


def _reboot(backend: SlurmBackend, decision: Decision) -> None:
    backend.reboot(decision.node, decision.reason or "")


def _keep(backend: SlurmBackend, decision: Decision) -> None:
    backend.set_extra(decision.node, decision.reason or "")


def _reset(backend: SlurmBackend, decision: Decision) -> None:
    from .gpu_reset import run_reset

    run_reset(decision.command or (), decision.timeout_s or 0)


# Decision kind -> the backend call that changes Slurm (or, reset, the node's GPU). The only
# calls of the backend's writing node functions in the product (tests/test_gate_only.py holds it).
EDGES: Dict[str, Callable[[SlurmBackend, Decision], None]] = {"drain": _drain, "resume": _resume,
                                                              "reboot": _reboot, "reset": _reset, "keep": _keep}




def apply(backend: SlurmBackend, decision: Decision, dry_run: bool = False) -> Applied:
    """Run the scontrol call the decision names (``dry_run``: only say what would run); Slurm's
    failure comes back as ``Applied.error``, never raised: the caller logs it and, because
    nothing was applied, does not commit what it read (the next run decides again)."""
    argv = ["scontrol", *decision.scontrol] if decision.scontrol else None
    if decision.command:
        argv = list(decision.command)
    if not decision.acts:
        return Applied(decision, argv, done=False, dry_run=dry_run)
    if dry_run:
        return Applied(decision, argv, done=False, dry_run=True)
    # Said before the call: a watchdog that fires while scontrol runs cannot know whether Slurm
    # took the change, and the hook's exit must assume it did (healthcheck.hooklib.watchdog).
    note(decision.kind, "applying")
    failures: Tuple[type, ...] = (SlurmError,)
    if decision.kind == "reset":
        from .gpu_reset import ResetError       # only when a reset runs: the hooks' path stays lean
        failures = (SlurmError, ResetError)
    try:
        EDGES[decision.kind](backend, decision)
    except failures as exc:
        note(decision.kind, "failed")
        return Applied(decision, argv, done=False, error=str(exc))
    note(decision.kind, "applied")
    return Applied(decision, argv, done=True)


# -- boot bookkeeping ----------------------------------------------------------------------------------

def read_boot_id(path: str) -> str:
    """The running boot's id (``/proc/sys/kernel/random/boot_id``, the simulator's file), or
    "unknown"."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(128).strip() or "unknown"
    except OSError:
        return "unknown"


# -- deciding ----------------------------------------------------------------------------------------

def blocked(decision: Decision, rule: str, why: str) -> Decision:
    return Decision("blocked", decision.node, rule, why, reason=decision.reason, cause=decision.cause,
                    scontrol=decision.scontrol)


def drain_policy(policy: Policy, record) -> Policy:
    """The decision's policy, with the recorded drain's own resume mode for its cause."""
    return replace(policy, resume_by_cause={record.cause: record.resume_mode} if record is not None else {})


def causes_for(request: Request, policy: Policy) -> List[Any]:
    """The request's drain causes (``cause.Cause``: reason, finding, resume mode)."""
    return list(request.causes) if request.causes is not None else causes_of(request.findings, policy)


def _judge(request: Request, info: Optional[NodeInfo], slurm_error: str, policy, record,
           causes: List[Any]) -> Decision:
    # A reset of the drain's GPU since the drain counts as its reboot. With no record (a stateless
    # node's first run of a boot), Slurm knows: the node booted after our reason was set.
    rebooted = (record.boot_id != request.boot_id or record.reset_at is not None) if record is not None \
        else booted_since_reason(info)
    decision = decide(request.node, info, request.findings, drain_policy(policy, record), slurm_error=slurm_error,
                      rebooted_since_drain=rebooted, causes=[cause.reason for cause in causes],
                      pending=request.pending, unseen=request.unseen)
    if request.intent == "drain" and decision.kind == "resume":       # a drain request never resumes
        return Decision("none", request.node, "healthy", "no drain finding", reason=decision.reason)
    return decision


def settles(outcome: Outcome) -> bool:
    """Whether this outcome read Slurm's view and found nothing the health state lacks: Slurm
    answered, was not busy with the node, and no reason of ours is on it unless the state
    records that drain. Until a run settles, the runs of a boot ask Slurm (``Session._quiet``)."""
    if not outcome.asked:
        return True
    if outcome.info is None or outcome.decision.rule == "slurm-busy":
        return False
    return outcome.decision.cause is None or outcome.decision.kind == "drain"


def keep(backend: SlurmBackend, node: str, extra: str, rule: str, why: str, dry_run: bool = False) -> Applied:
    """The node's Extra set to ``extra`` (ours merged in by ``kept.py``), through ``apply``."""
    return apply(backend, Decision("keep", node, rule, why, reason=extra, scontrol=extra_argv(node, extra)),
                 dry_run=dry_run)


def booted_since_reason(info: Optional[NodeInfo]) -> Optional[bool]:
    """Whether the node booted after its reason was set (Slurm's BootTime and the reason's time;
    None when Slurm did not say both)."""
    if info is None or info.boot_epoch is None or info.reason_epoch is None:
        return None
    return info.boot_epoch > info.reason_epoch


def _admin_resume(request: Request, info: Optional[NodeInfo], slurm_error: str, policy, record,
                  causes: List[Any]) -> Decision:
    """``slurm-gpu resume``: an admin's explicit resume of one node, after its checks ran."""
    from ..drain_reason import is_ours, parse_reason

    node = request.node
    if info is None:
        return Decision("blocked", node, SLURM_UNREACHABLE, f"Slurm could not be asked ({slurm_error or 'no answer'})")
    prefix = policy.reason_prefix
    ours = parse_reason(info.reason, prefix) if info.reason else None
    if not (info.drained or info.down or info.has("FAIL")):
        return Decision("none", node, "in-service", f"{info.state}, not drained: nothing to resume")
    if info.reason and not is_ours(info.reason, prefix) and not request.force:
        return Decision("leave-alone", node, "foreign-reason",
                        f"drained by {info.reason_user or 'someone else'} ({info.reason!r}), not by this tool: "
                        "refusing without --force", reason=info.reason)
    if causes:
        return Decision("none", node, "resume-unhealthy",
                        f"still unhealthy ({len(causes)} finding(s) that drain): not resumed",
                        reason=info.reason or None, cause=ours)
    if request.unseen:
        return Decision("none", node, "resume-wait-unseen",
                        "a probe did not answer, so no check passed: not resumed", reason=info.reason or None,
                        cause=ours)
    return Decision("resume", node, "admin-resume", f"every check passes; was: {info.reason or info.state}",
                    reason=info.reason or None, cause=ours, scontrol=resume_argv(node))


# intent -> the pure decision for it.
DECIDERS: Dict[str, Callable[..., Decision]] = {
    "judge": _judge, "drain": _judge, "resume": _admin_resume,
    "remediate": lambda request, info, slurm_error, *_: request.decide(info, slurm_error)}


# -- the session: the node's lock held from reading Slurm to the saved record -------------------------

class Session:
    """One node's gate, its decision lock held (``session``). ``state`` is the health state read
    under the lock; ``submit`` decides and applies one request and keeps the drain record in
    ``state``; ``save`` writes it (never in a dry run)."""

    def __init__(self, config, backend: SlurmBackend, node: str, state_dir: str, policy, dry_run: bool,
                 unlocked: Optional[str]):
        self.config, self.backend, self.node = config, backend, node
        self.state_dir, self.policy, self.dry_run = state_dir, policy, dry_run
        self.budget = config.typed(budget.Budget)
        self.notes: List[str] = [unlocked] if unlocked else []
        # A newer version's state (a rollback): decided on afresh, never written over (``save``).
        self.state, self.newer = node_state.load_kept(state_dir, node)
        if self.newer:
            self.notes.append(self.newer)

    def submit(self, request: Request) -> Outcome:
        now = time.time() if request.now is None else request.now
        record = before = self.state.drained
        causes = causes_for(request, self.policy)
        if self._quiet(request, causes):
            decision = Decision("none", request.node, "healthy", "no drain finding and no drain of ours on record "
                                "this boot: Slurm not asked")
            return Outcome(request, decision, Applied(decision, None, done=False), None, notes=list(self.notes),
                           asked=False)
        try:
            info: Optional[NodeInfo] = self.backend.node(request.node)
            slurm_error = ""
        except SlurmError as exc:
            info, slurm_error = None, str(exc)
        decision = DECIDERS[request.intent](request, info, slurm_error, self.policy, record, causes)
        outcome = Outcome(request, decision, Applied(decision, None, done=False), info, notes=list(self.notes))
        self._within_budget(outcome, now)
        outcome.applied = apply(self.backend, outcome.decision, dry_run=self.dry_run)
        if outcome.applied.done and outcome.decision.rule == "drain" and not self.dry_run:
            self._undo_beyond_budget(outcome)
        self._record(outcome, info, causes, now)
        self._episodes(outcome, before, now)
        return outcome

    def _quiet(self, request: Request, causes: List[Any]) -> bool:
        """A health check's run with nothing to act on: no cause confirmed or being confirmed,
        and a health state of this boot that holds no drain of ours. Every drain of ours goes
        through this gate and is recorded, so Slurm's view could change nothing: it is not asked
        (at 256 nodes that is one controller RPC per node and health-check interval saved). The
        first run of a boot, or one with no state (a stateless node's), asks and learns; so does
        every run until one reads Slurm's view with nothing of ours in it the state lacks
        (``settles``): a node still rebooting, or a drain of ours found with no record (a
        stateless node after its boot), is asked about again."""
        return (request.intent == "judge" and not causes and not request.pending and self.state.drained is None
                and bool(request.boot_id) and self.state.settled_boot == request.boot_id)

    # -- remediation ([remediate], healthcheck/remediate/) --------------------------------------------
    def _episodes(self, outcome: Outcome, before, now: float) -> None:
        """The ledger's episode times (drained, back in service) when our drain starts or ends;
        nothing is read or written on a run that changes neither."""
        after = self.state.drained
        if outcome.request.intent == "resume" and outcome.applied.done and not self.dry_run:
            self._forget_kept(outcome, before)
        if self.dry_run or outcome.request.intent == "remediate" or (before is None and after is None):
            return
        # The same drain kept: nothing to note. A drain that replaced another record in the same run
        # (a new cause; or a record whose drain someone else ended outside the gate, then a new
        # fault) starts its own episode: its reboots and its back-in-service time are counted there.
        if before is not None and after is not None and before.cause == after.cause:
            return
        from . import ledger as ledgers     # only on a drain's start or end: a quiet run loads none of it

        try:
            with ledgers.changing(self.state_dir, self.node) as ledger:
                if after is not None:
                    ledger.note_drain(ledgers.signature_of(after), after.cause, now,
                                      reopen_within_s=self.config.typed(RemediatePolicy).window_s)
                else:
                    ledger.note_resumed(now)
                    if outcome.request.intent == "resume" and outcome.applied.done:
                        ledger.forget(ledgers.signature_of(before))     # an admin looked: the count starts again
        except (OSError, ValueError) as exc:
            outcome.notes.append(f"{LEDGER_NOT_SAVED}: {getattr(exc, 'strerror', None) or exc}")

    def _forget_kept(self, outcome: Outcome, before) -> None:
        """An admin's resume: the reboot count kept in Slurm for the drain's signature goes too
        (every count of ours when no record says which: a stateless node's)."""
        from . import kept, ledger as ledgers

        info = outcome.info
        if info is None or not kept.reboots_kept(info.extra):
            return
        extra = kept.forgetting(info.extra, [ledgers.signature_of(before)] if before is not None else [])
        if extra == info.extra:
            return
        done = keep(self.backend, self.node, extra, "admin-resume-forget",
                    "an admin looked: the reboot count kept in Slurm starts again")
        if not done.done:
            outcome.notes.append(f"reboot count kept in Slurm not cleared: {done.error}")

    def save(self, state=None) -> Optional[str]:
        """Write the health state (``state``, else the session's); a problem as one line."""
        if state is not None:
            self.state = state
        if self.dry_run or self.newer:
            return None
        try:
            node_state.save(self.state_dir, self.node, self.state)
        except (OSError, ValueError) as exc:
            return f"health state not saved: {getattr(exc, 'strerror', None) or exc}"
        return None

    # -- the budget --------------------------------------------------------------------------------
    def _within_budget(self, outcome: Outcome, now: float) -> None:
        decision = outcome.decision
        if not (decision.kind == "drain" and decision.rule == "drain" and self.budget.enabled):
            return
        try:
            why = budget.over_budget(self.backend.nodes(), decision.node, self.budget, self.policy.reason_prefix, now)
        except SlurmError as exc:
            outcome.decision = blocked(decision, SLURM_UNREACHABLE,
                                       f"Slurm could not be asked for the drain budget ({exc}); not draining "
                                       f"for {decision.cause.cause} now, the next run retries")
            return
        if why:
            outcome.budget_blocked = True
            outcome.decision = blocked(decision, BUDGET_RULE, f"{why}: not draining for {decision.cause.cause}")

    def _undo_beyond_budget(self, outcome: Outcome) -> None:
        """After our drain: other nodes may have drained at the same moment; the drains beyond
        the budget (latest first) are undone by their own nodes, through ``apply``."""
        decision = outcome.decision
        undo = Decision("resume", decision.node, BUDGET_RULE, "drain budget spent by a concurrent drain",
                        reason=decision.reason, cause=decision.cause, scontrol=resume_argv(decision.node))
        undone: List[Applied] = []
        try:
            if budget.settle(self.backend.nodes,
                             lambda nodes: budget.keeps_its_drain(nodes, decision.node, self.budget,
                                                                  self.policy.reason_prefix, time.time()),
                             lambda: undone.append(apply(self.backend, undo))):
                return
        except SlurmError as exc:
            outcome.notes.append(f"drain budget not re-checked after the drain: {exc}")
            return
        if undone[0].error is not None:
            outcome.notes.append(f"drain budget: our drain beyond it not undone: {undone[0].error}")
            return
        note("drain", "undone")             # the prolog's watchdog: the job may run after all
        outcome.budget_blocked = True
        outcome.notes.append(f"drain undone ({BUDGET_RULE}): another node drained at the same time and the "
                             f"budget holds one fewer; wanted: {decision.reason}")
        outcome.decision = blocked(decision, BUDGET_RULE, "drain budget spent by a concurrent drain; undone")
        outcome.applied = Applied(outcome.decision, outcome.applied.argv, done=False)

    # -- the record --------------------------------------------------------------------------------
    def _record(self, outcome: Outcome, info: Optional[NodeInfo], causes: List[Any], now: float) -> None:
        decision, request = outcome.decision, outcome.request
        if request.intent == "remediate":
            if outcome.applied.done and decision.kind == "drain" and self.state.drained is not None:
                # drained for inspection: the same drain, never resumed by itself now
                self.state.drained = replace(self.state.drained, resume_mode="never", reason=decision.reason or "")
            elif outcome.applied.done and decision.kind == "reset" and self.state.drained is not None:
                # the GPU was reset: for this drain as good as a reboot (it resumes once healthy)
                self.state.drained = replace(self.state.drained, reset_at=now)
            return
        if outcome.applied.done and decision.kind == "drain":
            mode = next((c.resume_mode for c in causes if c.key == decision.cause.cause), None)
            if mode is None:
                mode = self.policy.resume_mode(decision.cause.check or "", cause=decision.cause.cause)
            self.state.drained = node_state.Drained(
                cause=decision.cause.cause, resume_mode=mode, boot_id=request.boot_id, at=now,
                reason=decision.reason or "", evidence=[c.finding.to_json() for c in causes], by=request.by)
        elif outcome.applied.done and decision.kind == "resume":
            if request.intent == "resume":
                _forget_inspection(self.state, info, self.policy.reason_prefix)
            self.state.drained = None
        elif info is not None and self.state.drained is None and decision.rule == "drained-same-cause":
            self.state.drained = adopted(request, info, decision, causes, self.policy, now)
        elif info is not None and not (info.drained or info.down):
            self.state.drained = None            # resumed by someone (an admin, slurm-gpu resume)
        elif info is not None and decision.rule in FOREIGN_RULES:
            self.state.drained = None            # someone else's now


def adopted(request: Request, info: NodeInfo, decision: Decision, causes: List[Any], policy, now: float):
    """The record of a drain of ours found in Slurm with no record of it here (a stateless node
    after its reboot, the fault still there): what remediation and the resume need, rebuilt from
    Slurm. Made in another boot when the node booted since the reason was set."""
    cause = decision.cause.cause
    mode = "never" if GAVE_UP_KEY in decision.cause.keys else \
        next((c.resume_mode for c in causes if c.key == cause), None) or policy.resume_mode(decision.cause.check or "",
                                                                                             cause=cause)
    boot = "" if booted_since_reason(info) else request.boot_id
    return node_state.Drained(cause=cause, resume_mode=mode, boot_id=boot, at=info.reason_epoch or now,
                              reason=info.reason, evidence=[c.finding.to_json() for c in causes if c.key == cause],
                              by=request.by)


def _forget_inspection(state, info: Optional[NodeInfo], prefix: str) -> None:
    """An admin resumed the node: the Xid reboot count of its cause goes (someone looked at the
    GPU), and the failing runs."""
    from ..drain_reason import parse_reason

    parsed = parse_reason(info.reason, prefix) if info is not None and info.reason else None
    if parsed is not None and parsed.xid is not None:
        state.xid_boots = {key: boots for key, boots in state.xid_boots.items()
                           if not key.endswith(f" xid:{parsed.xid}")}
    state.failing = {}


@contextlib.contextmanager
def session(config, backend: SlurmBackend, node: str, state_dir: Optional[str] = None, policy=None,
            dry_run: bool = False) -> Iterator[Session]:
    """The node's gate with its decision lock held (none in a dry run: nothing changes). A lock
    that cannot be had is a note, and the gate decides anyway: a drain is never lost for it."""
    from .serial import decision_lock_wait_s, deciding_alone

    policy = config.typed(Policy) if policy is None else policy
    state_dir = config.state_dir if state_dir is None else state_dir
    lock = contextlib.nullcontext() if dry_run else deciding_alone(state_dir, node, decision_lock_wait_s(config))
    with lock as unlocked:
        yield Session(config, backend, node, state_dir, policy, dry_run, unlocked)


def submit(config, backend: SlurmBackend, request: Request, state_dir: Optional[str] = None,
           dry_run: bool = False) -> Outcome:
    """One request through the gate, its record saved: what the prolog, the epilog and
    ``slurm-gpu resume`` call."""
    with session(config, backend, request.node, state_dir=state_dir, dry_run=dry_run) as gate:
        outcome = gate.submit(request)
        problem = gate.save()
        if problem:
            outcome.notes.append(problem)
    return outcome


__all__: Sequence[str] = ("Request", "Outcome", "Applied", "Session", "session", "submit", "apply",
                          "read_boot_id", "SLURM_UNREACHABLE", "BUDGET_RULE", "EDGES", "DECIDERS")
