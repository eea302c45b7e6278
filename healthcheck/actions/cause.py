"""What a drain finding is a cause of: the ``DrainReason`` our drain would carry for it.

Which evidence number goes into the reason as its key (``dbe:2``, ``xid:79``) is data:
``REASON_KEYS`` below, per check id.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

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


def drain_causes(findings: Iterable[Finding]) -> List[DrainReason]:
    """One reason per distinct cause among the drain findings, in the findings' order."""
    out: List[DrainReason] = []
    seen = set()
    for finding in findings:
        if is_drain_finding(finding):
            reason = reason_for(finding)
            if reason.cause not in seen:
                seen.add(reason.cause)
                out.append(reason)
    return out


@plain
class Cause:
    """One drain cause of this run: its reason, the finding it came from, how it is resumed."""
    reason: DrainReason
    finding: Finding
    resume_mode: str = "auto"

    @property
    def key(self) -> str:
        return self.reason.cause


def causes_of(findings: Sequence[Finding], policy) -> List[Cause]:
    """The drain findings' causes, one per distinct cause, each with its resume mode (``policy``:
    ``decision.Policy``)."""
    out: List[Cause] = []
    seen = set()
    for finding in findings:
        if not is_drain_finding(finding):
            continue
        reason = reason_for(finding)
        if reason.cause in seen:
            continue
        seen.add(reason.cause)
        xid_action = str(finding.evidence.get("xid_action", "")) if finding.check.startswith("kernel.") else ""
        out.append(Cause(reason, finding, policy.resume_mode(finding.check, xid_action)))
    return out


def first(causes: List[DrainReason]) -> Optional[DrainReason]:
    return causes[0] if causes else None
