"""probe.timeout and probe.error: when a probe itself did not answer, that is the finding.

Raised on every tier (not listed in [tiers]); a hung NVML is the classic sign of a GPU
stuck in the driver, so its default action is to drain.
"""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput

# A GPU that hangs is one broken GPU only when every sibling answered within this share of the
# deadline: the hung one then had the rest of it alone.
LONE_HANG_ANSWERED_WITHIN = 0.5


def _unanswered(finding: Finding) -> Finding:
    """The probe did not answer: a fact on the finding (``findings.unseen`` decides on it)."""
    finding.unanswered = True
    return finding


def probe_findings(inp: CheckInput) -> List[Finding]:
    findings: List[Finding] = []
    nvml = inp.nvml
    if nvml is not None:
        limit = nvml.timeout_s or 0
        evidence = {"timeout_s": limit, "elapsed_s": round(nvml.elapsed_s or 0.0, 3)}
        if nvml.status == "timeout":
            findings.append(_unanswered(inp.finding("probe.timeout", "error",
                                                    f"NVML did not answer within {limit:g} s", evidence=evidence)))
        elif nvml.status == "crashed":
            findings.append(_unanswered(inp.finding("probe.error", "error",
                                                    f"NVML probe failed: {nvml.message or 'no answer'}",
                                                    evidence={"error": nvml.message})))
        # One GPU that does not answer while the driver and its siblings do is a broken GPU; when
        # none answers, the driver itself hangs (ambiguous: see findings.without_timeout_drains).
        # Siblings that answered only in the deadline's second half say the host was too slow to
        # finish (a starved node, hundreds of hooks at once), not that one GPU hangs: ambiguous too.
        answered = [gpu.index for gpu in nvml.gpus if gpu.state != "hang"]
        late = nvml.last_answer_s
        early = late is not None and late <= limit * LONE_HANG_ANSWERED_WITHIN
        for gpu in inp.gpus_in_scope():
            if gpu.state == "hang":
                if answered and early:
                    alone = dict(evidence, answered_gpus=len(answered), last_answer_s=late)
                    told = f" while {len(answered)} other GPU(s) did"
                elif answered:
                    alone = dict(evidence, answered_late_gpus=len(answered), last_answer_s=late)
                    told = (f"; {len(answered)} other GPU(s) answered only late"
                            + (f" (after {late:g} s)" if late is not None else "") + ": a slow host, not one GPU")
                else:
                    alone, told = evidence, ""
                findings.append(_unanswered(inp.finding(
                    "probe.timeout", "error",
                    f"{gpu.subject()} did not answer NVML within {limit:g} s" + told,
                    gpu=gpu, evidence=alone)))
    ib = inp.ib
    if ib is not None:
        if ib.status == "timeout":
            findings.append(_unanswered(inp.finding(
                "probe.timeout", "error",
                f"InfiniBand sysfs ({ib.sysfs_root}) did not answer within {ib.timeout_s or 0:g} s",
                evidence={"timeout_s": ib.timeout_s})))
        elif ib.status == "error":
            findings.append(_unanswered(inp.finding("probe.error", "error", f"InfiniBand probe failed: {ib.message}",
                                                    evidence={"error": ib.message})))
    kernel = inp.kernel
    if kernel is not None and kernel.status == "error":
        findings.append(inp.finding("probe.error", "error", f"kernel log unreadable: {kernel.message}",
                                    evidence={"source": kernel.source}))
    dcgm = inp.dcgm
    if dcgm is not None and dcgm.status == "timeout":
        findings.append(_unanswered(inp.finding("probe.timeout", "error", dcgm.message,
                                                evidence={"timeout_s": dcgm.timeout_s, "level": dcgm.level})))
    return findings
