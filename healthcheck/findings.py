"""The one shape every check returns: a Finding, and how a set of them sums up."""
from __future__ import annotations

from .plain import asdict, field, plain
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

STATUSES = ("ok", "warn", "fail", "error")          # worst last
ACTIONS = ("none", "warn", "drain")                  # strongest last
DEFAULT_ACTION = "warn"                              # a finding's action when [actions] names none

# ``slurm-gpu check`` exit status per overall status (a contract).
EXIT_CODES = {"ok": 0, "warn": 1, "fail": 2, "error": 3}


@plain
class Finding:
    check: str                       # check id, e.g. "gpu.ecc.uncorrectable"
    status: str                      # ok | warn | fail | error
    action: str                      # none | warn | drain (from config per check)
    message: str                     # one line an admin understands
    gpu: Optional[int] = None        # NVML index
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None
    hca: Optional[str] = None
    port: Optional[int] = None
    evidence: Dict[str, Any] = field(default_factory=dict)
    # A fact, not a message: the probe that should have looked at the hardware (NVML, the IB
    # sysfs tree, dcgmi) did not answer (timed out, crashed, failed), so no check of it passed.
    unanswered: bool = False

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def action_for(actions: Mapping[str, str], check: str) -> str:
    """What ``[actions]`` asks for when ``check`` finds something."""
    return actions.get(check, DEFAULT_ACTION)


def _highest(values: Iterable[str], order: Tuple[str, ...]) -> str:
    return max(values, key=order.index, default=order[0])


def worst_status(findings: Iterable[Finding]) -> str:
    return _highest((finding.status for finding in findings), STATUSES)


def strongest_action(findings: Iterable[Finding]) -> str:
    return _highest((finding.action for finding in findings), ACTIONS)


def lone_gpu_hang(finding: Finding) -> bool:
    """A ``probe.timeout`` of one GPU while other GPUs answered the same probe: a broken GPU,
    not a slow or hung driver (``evidence.answered_gpus``, set by ``checks.probe_health``)."""
    return finding.check == "probe.timeout" and finding.gpu is not None and bool(finding.evidence.get("answered_gpus"))


def without_timeout_drains(findings: Iterable[Finding], drain_on_timeout: bool) -> None:
    """A probe that did not answer (``probe.timeout``) asks for a drain only when the admin said a
    hung driver is a node fault (``[health] drain_on_probe_timeout``); otherwise its action is
    ``warn``. One GPU that hangs while its siblings answer is not a hung driver but a broken GPU
    (``lone_gpu_hang``): it keeps its drain whatever that setting. Every hook applies this one
    rule, so the prolog, the epilog and the health check never disagree over a timeout (one
    draining what the next resumes)."""
    if drain_on_timeout:
        return
    for finding in findings:
        if finding.check == "probe.timeout" and finding.action == "drain" and not lone_gpu_hang(finding):
            finding.action = "warn"


def unseen(findings: Iterable[Finding]) -> bool:
    """The run could not look at the hardware: a probe did not answer (``Finding.unanswered``:
    it timed out, or the NVML or InfiniBand probe failed). No check passed then, so nothing may be
    resumed on the strength of it (an unreadable kernel log hides no state: Xids are events,
    judged when the log is read again, so its finding is not ``unanswered``)."""
    return any(f.unanswered for f in findings)
