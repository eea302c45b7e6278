"""``slurm-gpu drained [--all] [--json]`` and ``slurm-gpu resume NODE [--force]``: the admin's
review of drained nodes, and the way back into service that re-checks the node first."""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

import click

from healthcheck.actions.cause import is_drain_finding
from healthcheck.drain_reason import is_ours, parse_reason
from healthcheck.slurm.backend import NodeInfo, SlurmError

from .common import config_option, fail, load_config

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


def row(node: NodeInfo, prefix: str, state_dir: str) -> Dict[str, Any]:
    from healthcheck.health import state as node_state

    ours = is_ours(node.reason, prefix)
    evidence: Optional[List[Dict[str, Any]]] = None
    recommended = None
    cause = None
    if ours:
        parsed = parse_reason(node.reason, prefix)
        cause = parsed.cause if parsed is not None and parsed.check else None
        record = node_state.load(state_dir, node.name).drained
        if record is not None and (cause is None or record.cause == cause):
            evidence = record.evidence
            recommended = RECOMMENDED.get(record.resume_mode, "").format(node=node.name) or None
    elif node.reason:
        recommended = f"not drained by this tool: ask {node.reason_user or 'whoever set it'}"
    return {"node": node.name, "state": node.state, "reason": node.reason or None, "ours": ours,
            "set_by": node.reason_user or None, "since": _iso(node.reason_epoch), "since_epoch": node.reason_epoch,
            "cause": cause, "evidence": evidence, "recommended": recommended}


@click.command()
@config_option
@click.option("--all", "show_all", is_flag=True, help="List every node, not only drained, draining and down ones.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def drained(config_path: Optional[str], show_all: bool, as_json: bool) -> None:
    """Drained and draining nodes: state, reason, who set it and when, whether it is ours, our
    evidence and what to do.

    Example: slurm-gpu drained --json
    """
    config = load_config(config_path)
    prefix = config.section("drain")["reason_prefix"]
    try:
        nodes = _backend(config).sinfo_nodes()
    except SlurmError as exc:
        fail(str(exc), code=1)
    rows = [row(node, prefix, config.state_dir) for node in nodes
            if show_all or node.drained or node.down or node.has("FAIL")]
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not rows:
        click.echo("no drained, draining or down node")
        return
    for item in rows:
        mark = "ours" if item["ours"] else "not ours"
        click.echo(f"{item['node']:<12} {item['state']:<24} {mark:<8} {item['set_by'] or '-':<8} "
                   f"{item['since'] or '-':<24} {item['reason'] or ''}")
        if item["recommended"]:
            click.echo(f"{'':12} -> {item['recommended']}")


@click.command()
@config_option
@click.argument("node")
@click.option("--force", is_flag=True, help="Resume even a drain this tool did not set.")
def resume(config_path: Optional[str], node: str, force: bool) -> None:
    """Re-run the node's health checks and resume it in Slurm only when they pass; drains this
    tool did not set are refused unless --force.

    Example: slurm-gpu resume gpu2
    """
    from healthcheck.config import node_name
    from healthcheck.runner import run_checks

    config = load_config(config_path)
    prefix = config.section("drain")["reason_prefix"]
    if config.backend != "sim" and node != node_name(None):
        fail(f"run this on {node} itself: the checks read that node's GPUs and links")
    backend = _backend(config)
    try:
        info = backend.node(node)
    except SlurmError as exc:
        fail(str(exc), code=1)
    if not (info.drained or info.down or info.has("FAIL")):
        click.echo(f"{node}: {info.state}, not drained: nothing to resume")
        return
    if info.reason and not is_ours(info.reason, prefix) and not force:
        fail(f"{node} was drained by {info.reason_user or 'someone else'} ({info.reason!r}), not by this tool: "
             "refusing without --force", code=1)
    report = run_checks(config, node, "health", consumer="cli", commit=True)
    blocking = [finding for finding in report.findings if is_drain_finding(finding)]
    if blocking:
        for finding in blocking:
            click.echo(f"  {finding.status} {finding.check}: {finding.message}", err=True)
        fail(f"{node} is still unhealthy ({len(blocking)} finding(s) that drain): not resumed", code=1)
    try:
        backend.resume(node)
    except SlurmError as exc:
        fail(str(exc), code=1)
    _forget(config.state_dir, node, info, prefix)
    click.echo(f"{node}: every check passes; resumed (was: {info.reason or info.state})")


def _forget(state_dir: str, node: str, info: NodeInfo, prefix: str) -> None:
    """An admin resumed the node: our drain record goes, and the Xid reboot count of the cause
    (someone looked at the GPU)."""
    from healthcheck.health import state as node_state

    record = node_state.load(state_dir, node)
    record.drained = None
    parsed = parse_reason(info.reason, prefix)
    if parsed is not None and parsed.xid is not None:
        record.xid_boots = {key: boots for key, boots in record.xid_boots.items()
                            if not key.endswith(f" xid:{parsed.xid}")}
    record.failing = {}
    try:
        node_state.save(state_dir, node, record)
    except OSError as exc:
        click.echo(f"slurm-gpu: {node}: health state not updated: {exc.strerror or exc}", err=True)
