"""What a drain finding is a cause of: the ``DrainReason`` our drain would carry for it.

Which evidence number goes into the reason as its key (``dbe:2``, ``xid:79``) is data:
``REASON_KEYS`` below, per check id.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

from ..drain_reason import DrainReason
from ..findings import Finding
from ..plain import plain

# check id -> ((key in the reason, evidence field), ...)
REASON_KEYS: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "kernel.xid": (("xid", "code"),),
    "kernel.sxid": (("sxid", "code"),),
    "gpu.ecc.uncorrectable": (("dbe", "volatile_uncorrected"),),
    "gpu.ecc.correctable_rate": (("sbe", "growth"),),
    "gpu.remap.failed": (("uncorrectable_rows", "uncorrectable"),),
    "gpu.recovery_action": (("action", "recovery_action"),),
}


# Checks whose findings carry an Xid action (``xid_action``: our action for an Xid, or for the
# driver's recovery action through the same "recovery" rows): their drain's resume mode is that
# action's ([health.resume_xid_action]) before the check's own ([health.resume]).
XID_ACTION_CHECKS = ("gpu.recovery_action",)


def _by_xid_action(check: str) -> bool:
    return check.startswith("kernel.") or check in XID_ACTION_CHECKS


def is_drain_finding(finding: Finding) -> bool:
    """A finding that asks for a drain: not ok, and its check's action is drain."""
    return finding.action == "drain" and finding.status != "ok"


def subject(finding: Finding) -> str:
    if finding.gpu is not None:
        return f"gpu{finding.gpu}"
    if finding.hca:
        return f"{finding.hca}:{finding.port}" if finding.port is not None else finding.hca
    return "node"


def reason_for(finding: Finding) -> DrainReason:
    keys: Dict[str, str] = {}
    for key, field in REASON_KEYS.get(finding.check, ()):
        value = finding.evidence.get(field)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool) and str(value) != "":
            keys[key] = str(value)
    return DrainReason(check=finding.check, subject=subject(finding), keys=keys, summary=finding.message)


@plain
class Cause:
    """One drain cause of this run: its reason, the finding it came from, how it is resumed."""
    reason: DrainReason
    finding: Finding
    resume_mode: str = "auto"

    @property
    def key(self) -> str:
        return self.reason.cause


def causes_of(findings: Iterable[Finding], policy=None) -> List[Cause]:
    """The drain findings' causes, one per distinct cause in the findings' order, each with its
    resume mode (``policy``: ``decision.Policy``; None: "auto")."""
    out: List[Cause] = []
    seen = set()
    for finding in findings:
        if not is_drain_finding(finding):
            continue
        reason = reason_for(finding)
        if reason.cause in seen:
            continue
        seen.add(reason.cause)
        xid_action = str(finding.evidence.get("xid_action", "")) if _by_xid_action(finding.check) else ""
        out.append(Cause(reason, finding, policy.resume_mode(finding.check, xid_action) if policy else "auto"))
    return out


def drain_causes(findings: Iterable[Finding]) -> List[DrainReason]:
    return [cause.reason for cause in causes_of(findings)]

