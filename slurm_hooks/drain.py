"""The prolog's and epilog's drain, through the Actions layer (``healthcheck.actions``): the same
decision table and reason format as the health check. The strongest hardware cause
(``records.classify.hardware_cause``) goes first, so it names the drain.

Kernel-log events of the job's window become ``kernel.xid``/``kernel.sxid`` findings (their
action is ``[actions] "kernel.xid"``). A failing Slurm command is one loud line, never an
exception: the prolog still exits non-zero, so the job does not start on the bad hardware.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

from healthcheck.findings import Finding


def event_finding(config, item: Dict[str, Any]) -> Finding:
    """A job window's Xid/SXid (``evidence.event_evidence``) as the health check would judge it:
    the one rule of ``xid.event_findings.judge`` (data: ``healthcheck/data/xid-actions.tsv``)."""
    from healthcheck.xid.event_findings import judge

    check = "kernel.sxid" if item.get("event") == "sxid" else "kernel.xid"
    what = f" ({item['mnemonic']})" if item.get("mnemonic") else ""
    where = f"GPU {item['gpu']}" if item.get("gpu") is not None else "the node"
    xid_action = str(item.get("action") or "")
    status, action = judge(xid_action, check, config.section("actions"))
    return Finding(check=check, status=status, action=action,
                   message=f"Xid {item.get('code')}{what} on {where} during a job", gpu=item.get("gpu"),
                   uuid=item.get("uuid"), evidence={"code": item.get("code"), "xid_action": xid_action})


def drain_findings(config, findings: List[Finding], events: List[Dict[str, Any]]) -> List[Finding]:
    """The findings that ask for a drain, the strongest hardware cause first."""
    if not findings and not events:
        return []       # the healthy job's ending: no need to load the Actions layer
    from healthcheck.actions.cause import is_drain_finding
    from healthcheck.records.classify import evidence_class, hardware_cause

    from .evidence import finding_evidence

    candidates = list(findings) + [event_finding(config, e) for e in events if evidence_class(e)]
    draining = [f for f in candidates if is_drain_finding(f)]
    items = [finding_evidence(f) if f.check not in ("kernel.xid", "kernel.sxid") else
             {"kind": "xid", "code": f.evidence.get("code"), "gpu": f.gpu,
              "action": f.evidence.get("xid_action"), "event": "sxid" if f.check == "kernel.sxid" else None}
             for f in draining]
    best = hardware_cause(items)
    if best is not None:
        first = draining[items.index(best[1])]
        draining.remove(first)
        draining.insert(0, first)
    return draining


def drain_for(config, backend, node: str, findings: List[Finding], events: List[Dict[str, Any]],
              by: str = "epilog", sources=None) -> Optional[str]:
    """Drain ``node`` when the findings (and the job window's Xids) ask for it; the reason set,
    or None when nothing was drained (nothing to drain, someone else's reason, Slurm failed, the
    drain budget refused)."""
    return drain_or_refuse(config, backend, node, findings, events, by=by, sources=sources)[0]


def drain_or_refuse(config, backend, node: str, findings: List[Finding], events: List[Dict[str, Any]],
                    by: str = "prolog", sources=None) -> Tuple[Optional[str], str]:
    """``drain_for`` and the rule that decided: (reason, rule); rule ``drain-budget`` when the
    drain budget refused the drain or undid it (``gate.BUDGET_RULE``). The health check's circuit
    breaker holds for the prolog's and the epilog's drains too: a fault on every node (a bad
    driver rollout, a broken check) drains at most the budget, whichever hook sees it first.
    Through the drain gate
    (``healthcheck.actions.gate``): the lock, ownership, the budget and its undo, and the drain
    record the health check and ``slurm-gpu drained`` read (with the boot of ``sources``)."""
    draining = drain_findings(config, findings, events)
    if not draining:
        return None, "nothing-to-drain"
    from healthcheck.actions.gate import Request, read_boot_id, submit

    boot_id = read_boot_id(sources.boot_id_path) if sources is not None else "unknown"
    outcome = submit(config, backend, Request("drain", node, by, findings=tuple(draining), boot_id=boot_id))
    for line in outcome.notes:
        print(f"slurm-gpu: {node}: {line}", file=sys.stderr)
    decision = outcome.decision
    if outcome.applied.error and "no answer within" in outcome.applied.error:
        # Cut by the run's time left while scontrol ran: Slurm may have taken the drain (the next
        # run finds it and records it: gate.adopted); the job is refused either way.
        print(f"slurm-gpu: {node}: drain asked, Slurm did not answer ({decision.rule}): {outcome.applied.error}; "
              f"it may have taken: {decision.reason}", file=sys.stderr)
        return None, decision.rule
    if outcome.applied.error or decision.kind in ("blocked", "leave-alone"):
        print(f"slurm-gpu: {node}: not drained ({decision.rule}): {outcome.applied.error or decision.why}; "
              f"wanted: {decision.reason}", file=sys.stderr)
        return None, decision.rule
    return (decision.reason if decision.kind in ("drain", "none") else None), decision.rule

