"""The prolog's and epilog's drain, through the Actions layer (``healthcheck.actions``): the same
decision table and reason format as the health check. The strongest hardware cause
(``records.classify.hardware_cause``) goes first, so it names the drain.

Kernel-log events of the job's window become ``kernel.xid``/``kernel.sxid`` findings (their
action is ``[actions] "kernel.xid"``). A failing Slurm command is one loud line, never an
exception: the prolog still exits non-zero, so the job does not start on the bad hardware.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

from healthcheck.findings import Finding


def event_finding(config, item: Dict[str, Any]) -> Finding:
    check = "kernel.sxid" if item.get("event") == "sxid" else "kernel.xid"
    what = f" ({item['mnemonic']})" if item.get("mnemonic") else ""
    where = f"GPU {item['gpu']}" if item.get("gpu") is not None else "the node"
    return Finding(check=check, status="fail", action=config.action(check),
                   message=f"Xid {item.get('code')}{what} on {where} during a job", gpu=item.get("gpu"),
                   evidence={"code": item.get("code")})


def drain_findings(config, findings: List[Finding], events: List[Dict[str, Any]]) -> List[Finding]:
    """The findings that ask for a drain, the strongest hardware cause first."""
    from healthcheck.actions.cause import is_drain_finding
    from healthcheck.records.classify import evidence_class, hardware_cause

    from .evidence import finding_evidence

    candidates = list(findings) + [event_finding(config, e) for e in events if evidence_class(e)]
    draining = [f for f in candidates if is_drain_finding(f)]
    items = [finding_evidence(f) if f.check not in ("kernel.xid", "kernel.sxid") else
             {"kind": "xid", "code": f.evidence.get("code"), "gpu": f.gpu,
              "action": "reset_gpu", "event": "sxid" if f.check == "kernel.sxid" else None}
             for f in draining]
    best = hardware_cause(items)
    if best is not None:
        first = draining[items.index(best[1])]
        draining.remove(first)
        draining.insert(0, first)
    return draining


def drain_for(config, backend, node: str, findings: List[Finding], events: List[Dict[str, Any]]) -> Optional[str]:
    """Drain ``node`` when the findings (and the job window's Xids) ask for it; the reason set,
    or None when nothing was drained (nothing to drain, someone else's reason, Slurm failed)."""
    from healthcheck.actions import Policy, apply, decide
    from healthcheck.slurm import SlurmError

    draining = drain_findings(config, findings, events)
    if not draining:
        return None
    try:
        info, error = backend.node(node), ""
    except SlurmError as exc:
        info, error = None, str(exc)
    decision = decide(node, info, draining, Policy.from_config(config), slurm_error=error)
    applied = apply(backend, decision)
    if applied.error or decision.kind in ("blocked", "leave-alone"):
        print(f"slurm-gpu: {node}: not drained ({decision.rule}): {applied.error or decision.why}; "
              f"wanted: {decision.reason}", file=sys.stderr)
        return None
    return decision.reason if decision.kind in ("drain", "none") else None
