"""Pure bookkeeping across runs: which drain causes are confirmed (K consecutive failing runs,
not counting flapping checks during the grace runs after a boot), and which Xids came back on
the same GPU after reboots (an inspection drain).

Nothing here reads or writes; ``state.py`` keeps the numbers between runs.
"""
from __future__ import annotations

from ..plain import field, plain
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..actions.cause import Cause
from ..actions.decision import REPEAT_CHECK
from ..drain_reason import DrainReason
from .policy import HealthPolicy

MAX_BOOTS_KEPT = 16


@plain
class Tally:
    confirmed: List[Cause] = field(default_factory=list)
    pending: List[Tuple[Cause, int, int]] = field(default_factory=list)    # (cause, failing runs, needed)
    failing: Dict[str, int] = field(default_factory=dict)                   # cause -> consecutive failing runs
    xid_boots: Dict[str, List[str]] = field(default_factory=dict)


def xid_key(cause: Cause) -> Optional[str]:
    """The same Xid on the same GPU: by UUID (an index can change across reboots), else index."""
    if cause.finding.check != "kernel.xid" or cause.reason.xid is None:
        return None
    gpu = cause.finding.uuid or (f"gpu{cause.finding.gpu}" if cause.finding.gpu is not None else "node")
    return f"{gpu} xid:{cause.reason.xid}"


def tally(causes: Sequence[Cause], failing_before: Mapping[str, int], xid_boots_before: Mapping[str, List[str]],
          boot_id: str, in_grace: bool, policy: HealthPolicy) -> Tally:
    result = Tally(xid_boots={key: list(boots) for key, boots in xid_boots_before.items()})
    for cause in causes:
        needed = policy.confirm(cause.finding.check)
        if needed > 1 and in_grace:
            count = 0                         # links may still be training after a boot
        else:
            count = int(failing_before.get(cause.key, 0)) + 1
        result.failing[cause.key] = count
        if count < needed:
            result.pending.append((cause, count, needed))
            continue
        key = xid_key(cause)
        if key is not None:
            boots = result.xid_boots.setdefault(key, [])
            if boot_id not in boots:
                boots.append(boot_id)
                del boots[:-MAX_BOOTS_KEPT]
            reboots = len(boots) - 1
            if reboots >= policy.inspect_after(cause.reason.xid):
                cause = inspection(cause, reboots)
        result.confirmed.append(cause)
    return result


def inspection(cause: Cause, reboots: int) -> Cause:
    """The same Xid on the same GPU after ``reboots`` reboots: a drain for a person to inspect."""
    xid = cause.reason.xid
    reason = DrainReason(check=REPEAT_CHECK, subject=cause.reason.subject,
                         keys={"xid": str(xid), "reboots": str(reboots)},
                         summary=f"Xid {xid} on {cause.reason.subject} again after {reboots} reboots: "
                                 "inspect the GPU")
    return Cause(reason, cause.finding, "never")
