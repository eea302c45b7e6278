"""``slurm-gpu genconf``: probe this node (or a simulated one) and print its ``[[nodes]]`` entry.

The facts come from the same probes the checks use (NVML in its killable child, IB from
sysfs); the entry from ``healthcheck.config.node_entry``. With ``--slurm`` the node's Gres in
Slurm is compared with what NVML sees.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import click

from healthcheck.config import node_name

from .common import config_option, fail, load_config, node_or_sim_sources, versioned

EXIT_SLURM_DIFFERS = 1
EXIT_NOT_PROBED = 3
# A tier with no checks: the run only gathers node_entry.READS.
PROBE_ONLY_TIER = "genconf"
TEMP_PREFIX = "slurm-gpu-genconf-"
GRES_CHECK = "slurm.gres"


@click.command()
@config_option
@click.option("--node", metavar="NAME", default=None,
              help="Node name (default: $SLURMD_NODENAME, else the short hostname): the entry's match "
                   "and the node --slurm asks about.")
@click.option("--sim", "sim_profile", metavar="PROFILE", default=None,
              help="Probe a simulated node instead of the real hardware: a shipped profile's name "
                   "(h100-healthy; `slurm-gpu sim profiles` lists them) or a profile file's path.")
@click.option("--match", "match", metavar="HOSTLIST", default=None,
              help="The entry's match: a hostlist (gpu[001-128]) or glob (gpu*) for the whole group "
                   "(default: the node's name).")
@click.option("--slurm", "ask_slurm", is_flag=True,
              help="Also compare the node's Gres in Slurm (GPU count and type) with what NVML sees; "
                   "a difference is a finding (exit 1).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: v, node, entry, notes, slurm (null without --slurm), findings.")
def genconf(config_path: Optional[str], node: Optional[str], sim_profile: Optional[str], match: Optional[str],
            ask_slurm: bool, as_json: bool) -> None:
    """Print this node's [[nodes]] entry, as probed, to paste into the config.

    The entry holds what the hardware says (GPU count and model, NVLinks per GPU, NVSwitch
    fabric, the ACTIVE IB ports with their rate and link layer, the RoCE GID index, the power
    limit, the PCIe generation and width); take it on a node known to be healthy. Exit 0
    printed, 1 Slurm's Gres differs (one finding line on stderr), 2 bad input, 3 the node could
    not be probed or Slurm not asked.

    Example: slurm-gpu genconf --sim h100-healthy --match 'gpu[001-064]'
    """
    from healthcheck.config import CONFIG_SCHEMA
    from healthcheck.config.node_entry import READS, node_entry
    from healthcheck.schema import validate

    cfg = load_config(config_path)
    name = node_name(node)
    match = name if match is None else match
    problems = validate({"nodes": [{"match": match}]}, CONFIG_SCHEMA)
    if problems:
        fail(f"genconf: --match {match!r}: {problems[0][1]}")
    nvml, ib = _probe(cfg, name, sim_profile, READS)
    entry, notes = node_entry(match, nvml, ib)
    slurm: Optional[Dict[str, Any]] = None
    findings: List[Dict[str, Any]] = []
    slurm_error = ""
    if ask_slurm:
        try:
            slurm, findings = _compare_with_slurm(cfg, name, nvml)
        except _NotAsked as exc:
            slurm_error = str(exc)
    if as_json:
        click.echo(json.dumps(versioned({"node": name, "entry": entry, "notes": notes, "slurm": slurm,
                                         "findings": findings}), indent=2, sort_keys=False))
    else:
        click.echo(_toml(name, nvml, entry, notes), nl=False)
    if slurm_error:
        fail(f"genconf: {slurm_error}", EXIT_NOT_PROBED)
    for finding in findings:
        click.echo(f"{finding['status'].upper():<5}  {finding['check']:<26} {finding['message']}", err=True)
    if findings:
        raise click.exceptions.Exit(EXIT_SLURM_DIFFERS)


def _probe(cfg, name: str, sim_profile: Optional[str], reads):
    """(NVML facts, IB facts) of the node, both answered; else one line and exit 3 (2: a bad profile)."""
    from healthcheck.runner import run_checks
    from healthcheck.sim.profile import ProfileError

    try:
        with node_or_sim_sources(cfg, name, sim_profile, TEMP_PREFIX) as sources:
            facts = run_checks(cfg, name, PROBE_ONLY_TIER, sources=sources, extra_reads=reads).facts
    except ProfileError as exc:
        fail(f"genconf: {str(exc).splitlines()[0]}")
    except ValueError as exc:
        fail(f"genconf: {exc}")
    except OSError as exc:
        fail(f"genconf: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}", EXIT_NOT_PROBED)
    if facts.nvml is None or facts.nvml.status != "ok":
        what = facts.nvml.message or facts.nvml.status if facts.nvml is not None else "not run"
        fail(f"genconf: NVML did not answer ({what}); nothing printed", EXIT_NOT_PROBED)
    if facts.ib is None or facts.ib.status != "ok":
        what = facts.ib.message or facts.ib.status if facts.ib is not None else "not run"
        fail(f"genconf: the InfiniBand sysfs probe did not answer ({what}); nothing printed", EXIT_NOT_PROBED)
    return facts.nvml, facts.ib


class _NotAsked(Exception):
    """Slurm could not be asked, or answered what cannot be read (one line)."""


def _compare_with_slurm(cfg, name: str, nvml):
    """({"gres", "gpus", "types"}, [finding as JSON]) for the node's Gres in Slurm."""
    from healthcheck.config.node_entry import gres_problems
    from healthcheck.findings import Finding
    from healthcheck.slurm import SlurmError, backend_from_config
    from healthcheck.slurm.backend import gpu_gres

    try:
        text = backend_from_config(cfg).node(name).gres
    except SlurmError as exc:
        raise _NotAsked(f"cannot ask Slurm about {name}: {exc}") from None
    try:
        gres = gpu_gres(text)
    except ValueError as exc:
        raise _NotAsked(f"Slurm's Gres for {name}: {exc}") from None
    problems = gres_problems(gres, text, nvml)
    findings = [Finding(check=GRES_CHECK, status="fail", action="none", message=f"{name}: " + "; ".join(problems),
                        evidence={"gres": text, "slurm_gpus": sum(gres.values()), "nvml_gpus": nvml.device_count})
                .to_json()] if problems else []
    return {"gres": text, "gpus": sum(gres.values()), "types": gres}, findings


def _toml(name: str, nvml, entry: Dict[str, Any], notes: List[str]) -> str:
    from healthcheck.safeio import tomlio

    models = ", ".join(sorted({gpu.name for gpu in nvml.gpus if gpu.name})) or "no GPU"
    head = [f"# slurm-gpu genconf: {name} as probed ({nvml.device_count or 0}x {models}, "
            f"driver {nvml.driver_version or 'unknown'})"]
    head += [f"# {note}" for note in notes]
    return "\n".join(head) + "\n" + tomlio.dumps({"nodes": [entry]})
