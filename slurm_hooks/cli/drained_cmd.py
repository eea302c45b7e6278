"""``slurm-gpu drained [--all] [--json]`` and ``slurm-gpu resume HOSTLIST [--force]``: the admin's
review of drained nodes, and the way back into service that re-checks each node first and
resumes it through the drain gate (``healthcheck.actions.gate``)."""
from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List, Optional

import click

from healthcheck.actions.cause import is_drain_finding
from healthcheck.drain_reason import is_ours, parse_reason
from healthcheck.slurm.backend import NodeInfo, SlurmError

from .common import config_option, fail, load_config, versioned
from ..summary.text import terminal_safe

RECOMMENDED = {
    "auto": "none: it resumes by itself once every check passes",
    "after_reboot": "reboot the node; it resumes by itself once every check passes after the reboot",
    "never": "inspect the hardware; then `slurm-gpu resume {node}` (it re-runs the checks first)",
}


def _backend(config):
    from healthcheck.slurm import backend_from_config

    return backend_from_config(config)


def _iso(epoch: Optional[float]) -> Optional[str]:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(epoch)) if epoch else None


def remediation_state(node: NodeInfo, record, parsed, state_dir: str, policy) -> Dict[str, Any]:
    """``reboots`` (spent on this drain's fault signature within [remediate] window_s) and ``next``
    (the remediation's next step, ``healthcheck/remediate/plan.py``), from the ledger alone."""
    import time as _time

    from healthcheck.actions import ledger as ledgers
    from healthcheck.remediate.plan import next_step
    from healthcheck.remediate.step import situation_of

    ledger = ledgers.load(state_dir, node.name)
    situation = situation_of(record, node, parsed, ledger, ledgers.signature_of(record), "", _time.time(), policy)
    return {"reboots": situation.reboots, "next": next_step(situation, policy).kind}


def row(node: NodeInfo, prefix: str, state_dir: str, remediate=None) -> Dict[str, Any]:
    from healthcheck.actions import state as node_state

    ours = is_ours(node.reason, prefix)
    evidence: Optional[List[Dict[str, Any]]] = None
    recommended = None
    cause = None
    drained_by = None
    remedy: Dict[str, Any] = {"reboots": None, "next": None}
    if ours:
        parsed = parse_reason(node.reason, prefix)
        cause = parsed.cause if parsed is not None and parsed.check else None
        record = node_state.load(state_dir, node.name).drained
        if record is not None and (cause is None or record.cause == cause):
            evidence = record.evidence
            recommended = RECOMMENDED.get(record.resume_mode, "").format(node=node.name) or None
            drained_by = record.by or None
            if remediate is not None:
                remedy = remediation_state(node, record, parsed, state_dir, remediate)
    elif node.reason:
        recommended = f"not drained by this tool: ask {node.reason_user or 'whoever set it'}"
    return {"node": node.name, "state": node.state, "reason": node.reason or None, "ours": ours,
            "set_by": node.reason_user or None, "since": _iso(node.reason_epoch), "since_epoch": node.reason_epoch,
            "cause": cause, "evidence": evidence, "recommended": recommended, "drained_by": drained_by, **remedy}


@click.command()
@config_option
@click.option("--all", "show_all", is_flag=True, help="List every node, not only drained, draining and down ones.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def drained(config_path: Optional[str], show_all: bool, as_json: bool) -> None:
    """Drained and draining nodes: state, reason, who set it and when, whether it is ours, our
    evidence and what to do.

    Example: slurm-gpu drained --json
    """
    from healthcheck.config.settings import DrainSettings, RemediatePolicy

    config = load_config(config_path)
    prefix = config.typed(DrainSettings).reason_prefix
    try:
        nodes = _backend(config).sinfo_nodes()
    except SlurmError as exc:
        fail(str(exc), code=1)
    remediate = config.typed(RemediatePolicy)
    rows = [row(node, prefix, config.state_dir, remediate) for node in nodes
            if show_all or node.drained or node.down or node.has("FAIL")]
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no drained, draining or down node")
        return
    for item in rows:
        mark = "ours" if item["ours"] else "not ours"
        # A reason is anyone's text (scontrol takes what it is given): escape what a terminal obeys.
        click.echo(terminal_safe(f"{item['node']:<12} {item['state']:<24} {mark:<8} {item['set_by'] or '-':<8} "
                                 f"{item['since'] or '-':<24} {item['reason'] or ''}"))
        if item["recommended"]:
            click.echo(terminal_safe(f"{'':12} -> {item['recommended']}"))
        if item["next"] not in (None, "none"):
            click.echo(f"{'':12} -> remediation: next {item['next']}, reboots spent {item['reboots']}")


@click.command()
@config_option
@click.argument("hostlist")
@click.option("--force", is_flag=True, help="Resume even a drain this tool did not set.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: v, nodes (each: node, resumed, message, was, findings); "
                   "the exit status as without.")
def resume(config_path: Optional[str], hostlist: str, force: bool, as_json: bool) -> None:
    """Re-run each node's health checks and resume it in Slurm only when they pass; drains this
    tool did not set are refused unless --force. HOSTLIST is one node or a Slurm hostlist
    (gpu[1-3]); each node goes through the drain gate on its own, under its lock.

    Example: slurm-gpu resume gpu2
    """
    config = load_config(config_path)
    backend = _backend(config)
    try:
        nodes = backend.expand_hostlist(hostlist)
    except Exception as exc:  # noqa: BLE001 - python-hostlist raises its own BadHostlist
        fail(f"{hostlist!r} is not a hostlist: {exc}")
    if not nodes:
        fail(f"{hostlist!r} names no node")
    results = [_resume_one(config, backend, node, force, as_json) for node in nodes]
    refused = [result["node"] for result in results if result["refused"]]
    if as_json:
        click.echo(json.dumps(versioned({"nodes": [{key: value for key, value in result.items() if key != "refused"}
                                                   for result in results]}), sort_keys=False))
    if refused and len(nodes) > 1:
        fail(f"{', '.join(refused)} not resumed", code=1)
    if refused:
        sys.exit(1)   # one node: its one line (why it was refused) is already said


def _resume_one(config, backend, node: str, force: bool, as_json: bool = False) -> Dict[str, Any]:
    """One node through the gate: what happened (``refused``: said on stderr)."""
    from healthcheck.actions import gate
    from healthcheck.config import node_name
    from healthcheck.findings import unseen
    from healthcheck.runner import run_checks

    result: Dict[str, Any] = {"node": node, "resumed": False, "message": "", "was": None, "findings": [],
                              "refused": True}
    if config.backend != "sim" and node != node_name(None):
        result["message"] = f"run this on {node} itself: the checks read that node's GPUs and links"
        click.echo(f"slurm-gpu: {result['message']}", err=True)
        return result
    report = run_checks(config, node, "health", consumer="cli", commit=True)
    request = gate.Request("resume", node, "cli", findings=tuple(report.findings), unseen=unseen(report.findings),
                           force=force)
    outcome = gate.submit(config, backend, request)
    for line in outcome.notes:
        click.echo(f"slurm-gpu: {node}: {line}", err=True)
    decision, info = outcome.decision, outcome.info
    if info is not None:
        result["was"] = info.reason or info.state
    result["findings"] = [finding.to_json() for finding in report.findings if is_drain_finding(finding)]
    if outcome.applied.done:
        result.update(resumed=True, refused=False,
                      message=f"{node}: every check passes; resumed (was: {info.reason or info.state})")
        if not as_json:
            click.echo(result["message"])
        return result
    if decision.rule == "in-service":
        result.update(refused=False, message=f"{node}: {decision.why}")
        if not as_json:
            click.echo(result["message"])
        return result
    if decision.rule == "resume-unhealthy" and not as_json:
        for finding in report.findings:
            if is_drain_finding(finding):
                click.echo(f"  {finding.status} {finding.check}: {finding.message}", err=True)
    result["message"] = f"{node}: {outcome.applied.error or decision.why}"
    click.echo(f"slurm-gpu: {result['message']}", err=True)
    return result
