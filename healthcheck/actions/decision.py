"""What to do with a node, decided from what Slurm says about it and what the checks found.

Pure: no I/O, no clock. ``decide`` walks ``RULES`` top to bottom and the first rule whose
condition holds decides; ``MASTER_SWITCH`` then turns a drain or resume into ``blocked`` when
actions are off (NHC's rule: checks still run and report, nothing is changed).

Kinds:
  none        nothing to do (healthy, or already drained by us for this cause)
  drain       drain the node with ``reason`` (new, or our reason updated for a new cause)
  resume      resume a node we drained, now healthy
  blocked     we would drain or resume, but must not now (actions off, Slurm unreachable)
  leave-alone the node is someone else's business (their reason, or Slurm is busy with it)

The rules follow NHC's node-mark-offline/online: never overwrite a reason that is not ours;
never resume a node down or drained for someone else's reason; leave alone nodes Slurm is
handling; never re-drain a node we drained for the same cause.
"""
from __future__ import annotations

from ..plain import field, plain
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..config.settings import DrainSettings, HealthSettings
from ..drain_reason import DrainReason, format_reason, is_ours, parse_reason
from ..findings import Finding
from ..slurm.backend import NodeInfo, drain_argv, resume_argv
from .cause import drain_causes

KINDS = ("none", "drain", "resume", "reboot", "reset", "keep", "blocked", "leave-alone")
# The kinds that change Slurm (each has its edge in ``gate.EDGES``); reboot: the remediation's
# ``scontrol reboot ASAP reason=<ours>`` (healthcheck/remediate/plan.py); keep: the node's Extra
# with the remediation's reboot count merged in (``reason``: the whole field; actions/kept.py).
CHANGING_KINDS = ("drain", "resume", "reboot", "keep")
# The kinds that change the node itself, not Slurm (their edges in ``gate.EDGES`` too): reset,
# the remediation's GPU reset (``command``: healthcheck/actions/gpu_reset.py).
NODE_KINDS = ("reset",)
RESUME_MODES = ("auto", "after_reboot", "never")

# Flags of a node Slurm itself is busy with (Slurm 22.05 spelling in ``scontrol show node -o``;
# sinfo's "*" is read as NOT_RESPONDING): a reboot, power saving, a maintenance reservation,
# a node that does not answer, an admin's FAIL. Nothing of ours is applied to them.
SLURM_BUSY_FLAGS = ("REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_DOWN", "POWERED_DOWN", "POWERING_UP",
                    "POWER_DOWN", "POWER_UP", "MAINTENANCE", "NOT_RESPONDING", "FAIL", "FUTURE", "UNKNOWN")


# A drain for a repeated Xid (the same Xid on the same GPU after the reboots allowed) has this
# check id; it is never resumed automatically (RESUME_MODE_RULES).
REPEAT_CHECK = "kernel.xid.repeat"
# A reason of ours with this key says the reboots allowed were spent (``reboots:2``: remediation's
# inspection drain, a repeated Xid): a person looks, whatever the cause's resume mode. Read from
# the reason, so a node that kept no state (a stateless image) knows it too.
GAVE_UP_KEY = "reboots"


@plain(frozen=True)
class Policy:
    """What our drains look like and how they end: ``[drain]`` and ``[health]``'s resume modes."""
    enabled: bool                                # the master switch: False, and nothing is changed
    reason_prefix: str
    max_reason_len: int
    resume_default: str                          # auto | after_reboot | never
    resume_by_check: Mapping[str, str]
    resume_by_xid_action: Mapping[str, str]
    resume_by_cause: Mapping[str, str] = field(default_factory=dict)   # DrainReason.cause -> mode (as recorded)

    def resume_mode(self, check: str, xid_action: str = "", cause: str = "") -> str:
        """How a drain ends once every check passes: the first row of ``RESUME_MODE_RULES`` that
        gives a mode."""
        for _, mode in RESUME_MODE_RULES:
            found = mode(self, check, xid_action, cause)
            if found:
                return found
        raise AssertionError("the last row always gives a mode")

    @classmethod
    def from_config(cls, config) -> "Policy":
        drain, health = config.typed(DrainSettings), config.typed(HealthSettings)
        return cls(enabled=drain.enabled, reason_prefix=drain.reason_prefix, max_reason_len=drain.max_reason_len,
                   resume_default=health.resume_default, resume_by_check=health.resume_by_check,
                   resume_by_xid_action=health.resume_by_xid_action)


# The one table of resume modes, first row that gives one wins: (row, mode or "").
RESUME_MODE_RULES: Tuple[Tuple[str, Callable[[Policy, str, str, str], str]], ...] = (
    # our drain as recorded keeps the mode it was made with (a config changed since does not move it)
    ("recorded", lambda p, check, action, cause: p.resume_by_cause.get(cause, "")),
    # the same Xid back after the reboots allowed: a person looks, whatever [health.resume] says
    ("repeat", lambda p, check, action, cause: "never" if check == REPEAT_CHECK else ""),
    # a kernel-log finding by its Xid action ([health.resume_xid_action])
    ("xid-action", lambda p, check, action, cause: p.resume_by_xid_action.get(action, "") if action else ""),
    ("check", lambda p, check, action, cause: p.resume_by_check.get(check, "")),       # [health.resume]
    ("default", lambda p, check, action, cause: p.resume_default),                     # [health] resume_default
)


@plain
class Decision:
    kind: str
    node: str
    rule: str                                    # the row of RULES that decided
    why: str                                     # one line for the log
    reason: Optional[str] = None                 # drain: the reason to set; else the node's current one
    cause: Optional[DrainReason] = None          # drain: the cause; resume: the cause we drained for
    scontrol: Optional[Tuple[str, ...]] = None   # the scontrol arguments drain/resume runs (blocked: would run)
    command: Optional[Tuple[str, ...]] = None    # reset: the whole argument list it runs (program resolved)
    timeout_s: Optional[float] = None            # reset: its deadline

    @property
    def changes_slurm(self) -> bool:
        return self.kind in CHANGING_KINDS

    @property
    def acts(self) -> bool:
        """An edge runs for it: Slurm changed, or the node itself (a GPU reset)."""
        return self.kind in CHANGING_KINDS or self.kind in NODE_KINDS


@plain(frozen=True)
class Situation:
    """Everything a rule may look at."""
    node_name: str
    node: Optional[NodeInfo]                     # None: Slurm could not be asked
    causes: Tuple[DrainReason, ...]              # the drain causes found now, strongest first
    policy: Policy
    slurm_error: str = ""                        # why Slurm could not be asked
    rebooted_since_drain: Optional[bool] = None  # None: not known
    pending: bool = False                        # drain findings still waiting for confirmation
    unseen: bool = False                         # a probe failed: the hardware could not be looked at

    @property
    def wanted(self) -> bool:
        return bool(self.causes)

    @property
    def reason(self) -> str:
        return self.node.reason if self.node is not None else ""

    @property
    def ours(self) -> Optional[DrainReason]:
        return parse_reason(self.reason, self.policy.reason_prefix) if self.reason else None

    @property
    def foreign_reason(self) -> bool:
        return bool(self.reason) and not is_ours(self.reason, self.policy.reason_prefix)

    @property
    def out_of_service(self) -> bool:
        return self.node is not None and (self.node.drained or self.node.down)

    @property
    def same_cause(self) -> bool:
        ours = self.ours
        return ours is not None and ours.check is not None and ours.cause in {c.cause for c in self.causes}

    def busy_flags(self) -> List[str]:
        return [flag for flag in (self.node.flags if self.node else []) if flag in SLURM_BUSY_FLAGS]


@plain(frozen=True)
class Rule:
    name: str
    when: Callable[[Situation], bool]
    then: Callable[[Situation], Decision]


# -- outcomes --------------------------------------------------------------------------------------

def _none(rule: str, why: Callable[[Situation], str]) -> Callable[[Situation], Decision]:
    return lambda s: Decision("none", s.node_name, rule, why(s), reason=s.reason or None, cause=s.ours)


def _leave(rule: str, why: Callable[[Situation], str]) -> Callable[[Situation], Decision]:
    return lambda s: Decision("leave-alone", s.node_name, rule, why(s), reason=s.reason or None, cause=s.ours)


def _drain(rule: str, why: Callable[[Situation], str]) -> Callable[[Situation], Decision]:
    def then(s: Situation) -> Decision:
        cause = s.causes[0]
        text = format_reason(cause, s.policy.reason_prefix, s.policy.max_reason_len)
        return Decision("drain", s.node_name, rule, why(s), reason=text, cause=cause,
                        scontrol=drain_argv(s.node_name, text))
    return then


def _resume(rule: str, why: Callable[[Situation], str]) -> Callable[[Situation], Decision]:
    return lambda s: Decision("resume", s.node_name, rule, why(s), reason=s.reason, cause=s.ours,
                              scontrol=resume_argv(s.node_name))


def _set_by(s: Situation) -> str:
    user = s.node.reason_user if s.node is not None else ""
    return f" by {user}" if user else ""


def _cause_text(cause: Optional[DrainReason]) -> str:
    return cause.cause if cause is not None and cause.check else "an older reason of ours"


def _blocked_unreachable(s: Situation) -> Decision:
    cause = s.causes[0]
    text = format_reason(cause, s.policy.reason_prefix, s.policy.max_reason_len)
    return Decision("blocked", s.node_name, "slurm-unreachable-fault",
                    f"Slurm could not be asked ({s.slurm_error or 'no answer'}); not draining for "
                    f"{cause.cause} now, the next run retries", reason=text, cause=cause,
                    scontrol=drain_argv(s.node_name, text))


def _resume_mode(s: Situation) -> str:
    ours = s.ours
    if ours is None or GAVE_UP_KEY in ours.keys:
        return "never"
    return s.policy.resume_mode(ours.check or "", cause=ours.cause)


# -- the table ---------------------------------------------------------------------------------------

RULES: Tuple[Rule, ...] = (
    Rule("slurm-unreachable-fault",
         lambda s: s.node is None and s.wanted, _blocked_unreachable),
    Rule("slurm-unreachable-healthy",
         lambda s: s.node is None,
         _none("slurm-unreachable-healthy", lambda s: "no drain finding; Slurm could not be asked "
                                                       f"({s.slurm_error or 'no answer'})")),
    Rule("slurm-busy",
         lambda s: bool(s.busy_flags()),
         _leave("slurm-busy", lambda s: f"Slurm is handling the node ({'+'.join(s.busy_flags())}); "
                                        "nothing of ours is applied")),
    Rule("foreign-reason",
         lambda s: s.foreign_reason,
         _leave("foreign-reason", lambda s: f"reason {s.reason!r} was set{_set_by(s)}, not by this tool: "
                                            "it is never overwritten nor resumed")),
    Rule("foreign-out-of-service",
         lambda s: s.out_of_service and s.ours is None,
         _leave("foreign-out-of-service", lambda s: f"the node is {s.node.state} without a reason of ours: "
                                                    "someone else's, left alone")),
    Rule("drained-same-cause",
         lambda s: s.wanted and s.node.drained and s.same_cause,
         _none("drained-same-cause", lambda s: f"already drained by us for {s.ours.cause}")),
    Rule("drained-new-cause",
         lambda s: s.wanted and s.node.drained and s.ours is not None,
         _drain("drained-new-cause", lambda s: f"drained by us for {_cause_text(s.ours)}, which is gone; "
                                               f"the reason now names {s.causes[0].cause}")),
    Rule("drain",
         lambda s: s.wanted and not s.node.drained,
         _drain("drain", lambda s: f"{s.causes[0].cause}: "
                                   f"{len(s.causes)} cause(s) to drain for")),
    Rule("resume-wait-completing",
         lambda s: s.out_of_service and s.node.has("COMPLETING"),
         _leave("resume-wait-completing", lambda s: "healthy, but a job is completing: resume on a later run")),
    Rule("resume-wait-pending",
         lambda s: s.out_of_service and s.pending,
         _none("resume-wait-pending", lambda s: "no confirmed cause, but a drain finding is still being "
                                                "confirmed: not resumed yet")),
    Rule("resume-never",
         lambda s: s.out_of_service and _resume_mode(s) == "never",
         _none("resume-never", lambda s: f"drained by us for {_cause_text(s.ours)}, which needs an admin: "
                                         "not resumed automatically (slurm-gpu resume)")),
    Rule("resume-wait-reboot",
         lambda s: s.out_of_service and _resume_mode(s) == "after_reboot" and not s.rebooted_since_drain,
         _none("resume-wait-reboot", lambda s: f"healthy, but {_cause_text(s.ours)} is resumed only after "
                                               "a reboot since the drain")),
    Rule("resume-wait-unseen",
         lambda s: s.out_of_service and s.unseen,
         _none("resume-wait-unseen", lambda s: f"drained by us for {_cause_text(s.ours)}; a probe did not "
                                               "answer, so no check passed: not resumed now")),
    Rule("resume",
         lambda s: s.out_of_service,
         _resume("resume", lambda s: f"every check passes; drained by us for {_cause_text(s.ours)}")),
    Rule("healthy",
         lambda s: True,
         _none("healthy", lambda s: "no drain finding")),
)


def _master_switch(decision: Decision, policy: Policy) -> Decision:
    """NHC's master switch: with actions off, a drain or resume becomes ``blocked``."""
    if policy.enabled or not decision.changes_slurm:
        return decision
    return Decision("blocked", decision.node, "actions-off",
                    f"actions are off ([drain] enabled = false); would {decision.kind}: {decision.why}",
                    reason=decision.reason, cause=decision.cause, scontrol=decision.scontrol)


def decide(node_name: str, node: Optional[NodeInfo], findings: Sequence[Finding], policy: Policy,
           slurm_error: str = "", rebooted_since_drain: Optional[bool] = None,
           causes: Optional[Sequence[DrainReason]] = None, pending: bool = False,
           unseen: bool = False) -> Decision:
    """The decision for one node. ``node`` is None when Slurm could not be asked (``slurm_error``
    says why); ``rebooted_since_drain`` matters to causes resumed only after a reboot.
    ``causes`` (default: every drain finding's) are the causes to drain for, e.g. only those
    confirmed over several runs; ``pending`` says other drain findings wait for confirmation;
    ``unseen`` says a probe failed, so the hardware could not be looked at (never a resume then)."""
    wanted = tuple(causes) if causes is not None else tuple(drain_causes(findings))
    situation = Situation(node_name=node_name, node=node, causes=wanted, policy=policy, slurm_error=slurm_error,
                          rebooted_since_drain=rebooted_since_drain, pending=pending, unseen=unseen)
    return _master_switch(rule_for(situation).then(situation), policy)


def rule_for(situation: Situation) -> Rule:
    for rule in RULES:
        if rule.when(situation):
            return rule
    raise AssertionError("the last rule always holds")


def rule_names() -> List[str]:
    return [rule.name for rule in RULES] + ["actions-off"]


def as_dict(decision: Decision) -> Dict[str, object]:
    return {"node": decision.node, "decision": decision.kind, "rule": decision.rule, "why": decision.why,
            "reason": decision.reason, "scontrol": list(decision.scontrol) if decision.scontrol else None}
