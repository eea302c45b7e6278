"""kernel.xid and kernel.sxid: Xid, fallen-off-the-bus and NVSwitch SXid events, judged by
NVIDIA's catalog as mapped in ``healthcheck/data/xid-action-map.tsv`` and ``[xid]``.

Only events new since the last run are judged: a drain stays in Slurm until an admin resumes
the node, and an event that was already acted on must not drain it again after a GPU reset.
A read that stopped early (its budget, or too many distinct events) is said by a "warn"
finding that drains nothing: the next run reads on from where it stopped.
"""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput


def _findings(inp: CheckInput, check: str) -> List[Finding]:
    if inp.kernel is None or inp.kernel.status != "ok" or not inp.kernel.events:
        return []
    from ..xid.event_findings import xid_findings

    gpus = inp.nvml.gpus if inp.nvml_ok() else ()
    found = [f for f in xid_findings(inp.kernel.events, gpus, actions=inp.actions) if f.check == check]
    return [f for f in found if f.gpu is None or inp.in_scope(f.gpu)]


def kernel_xid(inp: CheckInput) -> List[Finding]:
    return _findings(inp, "kernel.xid") + _capped(inp)


def _capped(inp: CheckInput) -> List[Finding]:
    if inp.kernel is None or inp.kernel.status != "ok" or not inp.kernel.capped:
        return []
    finding = inp.finding("kernel.xid", "warn", f"kernel log {inp.kernel.source}: {inp.kernel.capped}",
                          evidence={"capped": inp.kernel.capped, "source": inp.kernel.source})
    finding.action = "none"       # reading less is not the node's fault; what was read is judged
    return [finding]


def kernel_sxid(inp: CheckInput) -> List[Finding]:
    return _findings(inp, "kernel.sxid")
