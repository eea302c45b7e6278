"""What to do next for a node this tool drained: the remediation decision, pure.

A drain whose resume mode is ``after_reboot`` can end without a person: once the node is idle,
reset the failing GPU (where ``[remediate] gpu_reset`` allows it) or ask Slurm to reboot the
node (``scontrol reboot ASAP``, our drain kept through it), counted per fault signature (the GPU's UUID
and the cause) so that a fault that comes back after every boot (a lemon) stops after
``max_reboots`` within ``window_s``: then the node is drained for inspection and left alone.
A cluster-wide budget keeps at most ``max_rebooting_nodes`` nodes rebooting at once.

``next_step`` is a table (``RULES``): the first rule whose test holds decides. No I/O, no clock:
the caller passes what it read (Slurm's node, the ledger, the findings) as ``Situation``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..actions.decision import GAVE_UP_KEY
from ..config.settings import RemediatePolicy
from ..plain import plain

# What remediation does next (``drained --json``'s ``next``):
#   none          nothing for remediation to do (off, not our drain, not a reboot-type drain)
#   wait-idle     jobs still run on the draining node
#   wait-reboot   a reboot (or reset) was asked and has not happened yet; Slurm's to finish
#   slurm-owns    Slurm is busy with the node (DOWN, not responding, rebooting): never fought over
#   reset-gpu     reset the failing GPU now
#   reboot        ask Slurm to reboot the node now
#   wait-budget   as many nodes as the budget allows are rebooting: ask again later
#   wait-records  job records not yet in accounting: delivered before the reboot ([remediate] records_wait_s)
#   inspect       the fault came back after max_reboots: drain for inspection, leave it alone
#   inspecting    drained for inspection already: a person must look
STEPS = ("none", "wait-idle", "wait-reboot", "slurm-owns", "reset-gpu", "reboot", "wait-budget", "inspect",
         "inspecting", "wait-records")

# Slurm's node flags that say Slurm itself is busy with the node (a reboot it runs, a node that
# did not come back within ResumeTimeout and is DOWN, one that does not answer).
SLURM_OWNS_FLAGS = ("DOWN", "NOT_RESPONDING", "REBOOT_ISSUED", "POWERING_DOWN", "POWERED_DOWN", "POWERING_UP",
                    "FAIL", "MAINTENANCE")
# A reboot Slurm was asked for and has not done yet (ASAP: it waits for the jobs to end).
REBOOT_PENDING_FLAGS = ("REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT")


@plain(frozen=True)
class Situation:
    """What one decision looks at (all read by the caller)."""
    ours: bool                          # the node is drained with our reason
    resume_mode: str                    # of our drain: auto | after_reboot | never
    flags: Tuple[str, ...] = ()         # Slurm's node state and flags (NodeInfo.flags)
    idle: bool = False                  # drained, no job left on it (IDLE+DRAIN, not MIXED/ALLOCATED)
    inspecting: bool = False            # our drain already says "inspect"
    asked: str = ""                     # "reboot" / "reset": asked in this boot, not yet done
    reboots: int = 0                    # reboots spent on this fault signature within the window
    resets: int = 0                     # GPU resets tried for it in this boot
    gpu_scoped: bool = False            # the cause is one GPU (a reset could clear it)
    gpu_busy: bool = False              # a process holds that GPU (no reset then)
    reboot_only: bool = False           # the cause itself asks for a reboot (the driver's recovery
                                        # action Node/System Reboot): no GPU reset first
    rebooting_elsewhere: int = 0        # other nodes rebooting now (Slurm's flags, cluster-wide)
    xid: str = ""                       # the cause's Xid code, if any (max_reboots_xid)
    undelivered: int = 0                # jobs whose records are not in accounting yet (the outbox)
    drained_for_s: float = 0.0          # since our drain


@plain(frozen=True)
class Step:
    kind: str
    rule: str
    why: str


Rule = Tuple[str, Callable[[Situation, RemediatePolicy], bool], str, str]

# (rule, test, step, why) — the first rule whose test holds decides.
RULES: Sequence[Rule] = (
    ("remediate-off", lambda s, p: not p.enabled, "none", "[remediate] enabled = false"),
    ("not-ours", lambda s, p: not s.ours, "none", "not drained by this tool"),
    ("inspecting", lambda s, p: s.inspecting, "inspecting",
     "drained for inspection after its reboots: a person must look (slurm-gpu resume)"),
    ("not-after-reboot", lambda s, p: s.resume_mode != "after_reboot", "none",
     "this cause is not one a reboot clears (resume mode is not after_reboot)"),
    ("reboot-pending", lambda s, p: _any(s.flags, REBOOT_PENDING_FLAGS) or s.asked == "reboot", "wait-reboot",
     "a reboot was asked; Slurm reboots the node, the first clean check of the new boot resumes it"),
    ("slurm-owns", lambda s, p: _any(s.flags, SLURM_OWNS_FLAGS), "slurm-owns",
     "Slurm is busy with the node (down, not responding, rebooting, powering): never fought over"),
    ("wait-idle", lambda s, p: not s.idle, "wait-idle", "jobs still run on the draining node"),
    ("reboots-spent", lambda s, p: s.reboots >= p.reboots_allowed(s.xid), "inspect",
     "the fault came back after every reboot allowed ([remediate] max_reboots): drain for inspection"),
    ("reset-first", lambda s, p: p.gpu_reset and s.gpu_scoped and not s.gpu_busy and not s.reboot_only
     and s.resets == 0 and s.asked != "reset", "reset-gpu", "a GPU reset may clear it ([remediate] gpu_reset); a reboot if it does not"),
    ("records-first", lambda s, p: s.undelivered > 0 and s.drained_for_s < p.records_wait_s, "wait-records",
     "job records not yet in accounting: delivered before the reboot wipes a stateless node's outbox "
     "([remediate] records_wait_s)"),
    ("reboot-budget", lambda s, p: p.max_rebooting_nodes > 0 and s.rebooting_elsewhere >= p.max_rebooting_nodes,
     "wait-budget", "as many nodes as [remediate] max_rebooting_nodes allows are rebooting"),
    ("reboot", lambda s, p: True, "reboot", "idle, drained for a cause a reboot clears, reboots left"),
)


def _any(flags: Sequence[str], wanted: Sequence[str]) -> bool:
    return any(flag in wanted for flag in flags)


def next_step(situation: Situation, policy: RemediatePolicy) -> Step:
    for rule, test, kind, why in RULES:
        if test(situation, policy):
            return Step(kind, rule, why)
    raise AssertionError("the last rule always holds")


def within(times: Sequence[float], now: float, window_s: float) -> List[float]:
    """The times (reboots asked) inside the window ending now."""
    return [t for t in times if now - t < window_s]


def rebooting(nodes: Sequence[Any], this: str) -> List[str]:
    """Other nodes Slurm is rebooting now (a reboot asked and not finished), cluster-wide:
    what the reboot budget counts. ``nodes`` are NodeInfo."""
    return sorted(n.name for n in nodes if n.name != this and n.has(*REBOOT_PENDING_FLAGS))


# Our reason's keys that remediation adds: the node is drained for inspection after N reboots
# (``reboots:2``; the summary then starts with "inspect"), or claims a turn to reboot within the
# cluster-wide budget (``next:reboot``, for the few seconds until the others' claims are seen).
INSPECT_KEY = GAVE_UP_KEY
CLAIM_KEY, CLAIM_VALUE = "next", "reboot"


def reason_with(reason: Any, keys: Mapping[str, str], summary: Optional[str] = None) -> Any:
    """A DrainReason with ``keys`` added (an empty value removes the key), the summary replaced
    when given."""
    from ..plain import replace as _replace     # DrainReason is @plain

    merged = {k: v for k, v in dict(reason.keys, **keys).items() if v}
    return _replace(reason, keys=merged, summary=reason.summary if summary is None else summary)


def inspect_reason(reason: Any, reboots: int) -> Any:
    """Our reason once remediation gives up: ``... reboots:2; inspect: <what it was>``."""
    summary = reason.summary[len("inspect: "):] if reason.summary.startswith("inspect: ") else reason.summary
    return reason_with(reason, {INSPECT_KEY: str(reboots), CLAIM_KEY: ""},
                       f"inspect: back after {reboots} reboot{'s' if reboots != 1 else ''}: {summary}")


def claiming(reason: Any) -> bool:
    return reason is not None and reason.keys.get(CLAIM_KEY) == CLAIM_VALUE


def reboot_turn(nodes: Sequence[Any], this: str, limit: int, prefix: str) -> bool:
    """Whether ``this`` node may reboot now: the nodes Slurm reboots already come first, then the
    nodes whose reason of ours claims a turn (``next:reboot``), by name; the first ``limit`` get
    one. Every claimant reads the same nodes after the same settle time, so they agree."""
    from ..drain_reason import parse_reason

    if limit <= 0:
        return True
    busy = rebooting(nodes, this)
    claims = sorted(n.name for n in nodes if not n.has(*REBOOT_PENDING_FLAGS)
                    and claiming(parse_reason(n.reason, prefix) if n.reason else None))
    order = busy + [name for name in claims if name not in busy]
    if this not in order:
        order.append(this)
    return order.index(this) < limit
