"""``slurm-gpu job JOBID [--json]``: how one job ended, with its evidence (``slurm_hooks.jobview``).

Exit status: 0 shown; 1 no source knows the job; 2 bad input (a JOBID that is not one, a config
that cannot be used).
"""
from __future__ import annotations

import json
from typing import Any, Dict

import click

from .common import config_option, fail, load_config, versioned


@click.command("job")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (keys job_id, class, nodes, sources).")
@config_option
def job(job_id: str, as_json: bool, config_path) -> None:
    """Show how job JOBID ended: its class, per node, and the evidence (exit 1: unknown job).

    JOBID is the id sacct shows (4242, an array task 4242_7, a heterogeneous job's component
    4242+1) or the raw id the hooks were given (SLURM_JOB_ID).

    Example: slurm-gpu job 4242 --json
    """
    from healthcheck.records.store import shown_job_id_ok

    from ..delivery import backend_for
    from ..jobview import gather

    try:
        shown_job_id_ok(job_id)
    except ValueError as exc:
        fail(str(exc))
    config = load_config(config_path)
    view = gather(config, job_id, backend_for(config))
    if not view["sources"]:
        fail(f"job {job_id}: not in accounting, in this node's records or in Slurm"
             + (f" ({'; '.join(view['problems'])})" if view.get("problems") else ""), code=1)
    if as_json:
        click.echo(json.dumps(versioned(view), sort_keys=True))
        return
    click.echo(_text(view))


def _text(view: Dict[str, Any]) -> str:
    head = f"job {view['job_id']}: {view['class']}"
    if view.get("state"):
        head += f"  (Slurm: {view['state']} {view.get('exit_code') or ''}".rstrip() + ")"
    lines = [head]
    for name, node in view["nodes"].items():
        evidence = ", ".join(f"{k} {v}" for k, v in node["evidence"].items() if k != "items")
        lines.append(f"  {name:<12} {node['class']:<14} {evidence}".rstrip())
    lines.append(f"sources: {', '.join(view['sources'])}")
    for problem in view.get("problems", []):
        lines.append(f"note: {problem}")
    return "\n".join(lines)
