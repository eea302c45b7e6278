"""The prolog's and epilog's drain, through the Actions layer (``healthcheck.actions``): the same
decision table and reason format as the health check. The strongest hardware cause
(``records.classify.hardware_cause``) goes first, so it names the drain.

Kernel-log events of the job's window become ``kernel.xid``/``kernel.sxid`` findings (their
action is ``[actions] "kernel.xid"``). A failing Slurm command is one loud line, never an
exception: the prolog still exits non-zero, so the job does not start on the bad hardware.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Dict, List, Optional, Tuple

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
    if not findings and not events:
        return []       # the healthy job's ending: no need to load the Actions layer
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
    or None when nothing was drained (nothing to drain, someone else's reason, Slurm failed, the
    drain budget refused)."""
    return drain_or_refuse(config, backend, node, findings, events)[0]


def drain_or_refuse(config, backend, node: str, findings: List[Finding],
                    events: List[Dict[str, Any]]) -> Tuple[Optional[str], str]:
    """``drain_for`` and the rule that decided: (reason, rule); rule ``drain-budget`` when the
    drain budget refused the drain or undid it (``BUDGET_RULE``)."""
    draining = drain_findings(config, findings, events)
    if not draining:
        return None, "nothing-to-drain"
    from healthcheck.actions import Policy, apply, decide
    from healthcheck.actions.serial import decision_lock_wait_s, deciding_alone
    from healthcheck.slurm import SlurmError

    # From the Slurm read to the applied decision, this node's other hooks wait (no double drain).
    with deciding_alone(config.state_dir, node, decision_lock_wait_s(config)) as unlocked:
        if unlocked:
            print(f"slurm-gpu: {node}: {unlocked}", file=sys.stderr)
        try:
            info, error = backend.node(node), ""
        except SlurmError as exc:
            info, error = None, str(exc)
        decision = decide(node, info, draining, Policy.from_config(config), slurm_error=error)
        refused = _over_budget(config, backend, node, decision)
        if refused:
            print(f"slurm-gpu: {node}: not drained ({BUDGET_RULE}): {refused}; wanted: {decision.reason}",
                  file=sys.stderr)
            return None, BUDGET_RULE
        applied = apply(backend, decision)
        if applied.error or decision.kind in ("blocked", "leave-alone"):
            print(f"slurm-gpu: {node}: not drained ({decision.rule}): {applied.error or decision.why}; "
                  f"wanted: {decision.reason}", file=sys.stderr)
            return None, decision.rule
        if applied.done and _undone_over_budget(config, backend, node, decision):
            return None, BUDGET_RULE
    return (decision.reason if decision.kind in ("drain", "none") else None), decision.rule


# The health check's circuit breaker (healthcheck.health.budget) holds for the prolog's and the
# epilog's drains too: a fault on every node (a bad driver rollout, a broken check) drains at
# most the budget, whichever hook sees it first.
BUDGET_RULE = "drain-budget"


def _budget_policy(config, decision):
    """The health policy when the budget applies to this decision (a new drain), else None."""
    from healthcheck.health.policy import HealthPolicy

    if decision.kind != "drain" or decision.rule != "drain":
        return None
    policy = HealthPolicy.from_config(config)
    return policy if policy.budget_enabled else None


def _over_budget(config, backend, node: str, decision) -> Optional[str]:
    """Why the budget refuses this drain; None when it allows it (or does not apply). Slurm
    not answering refuses too: the health check does the same."""
    from healthcheck.health.budget import over_budget
    from healthcheck.slurm import SlurmError

    policy = _budget_policy(config, decision)
    if policy is None:
        return None
    try:
        return over_budget(backend.nodes(), node, policy, time.time())
    except SlurmError as exc:
        return f"Slurm could not be asked for the drain budget ({exc})"


def _undone_over_budget(config, backend, node: str, decision) -> bool:
    """After our drain: other nodes may have drained at the same moment; the drains beyond the
    budget (latest first) are undone by their own nodes, as the health check does."""
    from healthcheck.health.budget import keeps_its_drain
    from healthcheck.health.run import BUDGET_SETTLE_S
    from healthcheck.slurm import SlurmError
    from healthcheck.watchdog import note

    policy = _budget_policy(config, decision)
    if policy is None:
        return False
    try:
        time.sleep(BUDGET_SETTLE_S)
        if keeps_its_drain(backend.nodes(), node, policy, time.time()):
            return False
        backend.resume(node)
        note("drain", "undone")             # the prolog's watchdog: the job may run after all
    except SlurmError as exc:
        print(f"slurm-gpu: {node}: drain budget not re-checked after the drain: {exc}", file=sys.stderr)
        return False
    print(f"slurm-gpu: {node}: drain undone ({BUDGET_RULE}): another node drained at the same time "
          f"and the budget holds one fewer; wanted: {decision.reason}", file=sys.stderr)
    return True
