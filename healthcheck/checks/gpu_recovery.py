"""gpu.recovery_action: the driver itself says the GPU needs a reset or the node a reboot.

NVML's GPU recovery action (field 230, driver R570+) is what the driver wants done before the
GPU is trusted again; Xid 154 in the kernel log announces each change, but the field is the
current answer (DCGM's health watch does not report it). A driver that does not know the field
leaves the fact unknown: nothing is judged. What each value means for us is the "recovery" rows
of ``healthcheck/data/xid-action-map.tsv`` (the same rows that judge Xid 154).
"""
from __future__ import annotations

from typing import List

from ..facts import GPU_RECOVERY_ACTIONS
from ..findings import Finding
from .base import CheckInput


def recovery_action(inp: CheckInput) -> List[Finding]:
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        value = gpu.recovery_action
        if not value:      # None: the driver cannot say; 0: nothing to do
            continue
        from ..xid.catalog import action_map     # only when there is something to name
        from ..xid.xid_actions import strongest

        mapping = action_map().get("recovery", {})
        name = GPU_RECOVERY_ACTIONS.get(value, f"unknown ({value})")
        mapped = mapping.get(str(value))
        why = mapped.why if mapped is not None else "a recovery action this tool does not know"
        ours = mapped.action if mapped is not None else strongest()      # unknown: never ignored
        findings.append(inp.finding(
            "gpu.recovery_action", "fail",
            f"{gpu.subject()}: the driver asks for recovery action {name} ({why})",
            gpu=gpu, evidence={"recovery_action": name, "recovery_action_value": value, "xid_action": ours}))
    return findings
