"""``slurm-gpu check``: run the GPU, NVLink and InfiniBand checks on this node (or a simulated one).

Exit status: 0 healthy, 1 warnings only, 2 failures, 3 could not check (including bad input:
a config or profile that cannot be used, an unknown option).
"""
from __future__ import annotations

import json
from typing import Dict, Optional, Tuple

import click

from healthcheck.config import TIERS, Config, ConfigError, node_name
from healthcheck.findings import EXIT_CODES
from .common import config_option, node_or_sim_sources, versioned

EXIT_COULD_NOT_CHECK = EXIT_CODES["error"]
DEFAULT_TIER = "health"
TEMP_PREFIX = "slurm-gpu-check-"

_COUNT_WORDS = {"fail": ("failure", "failures"), "warn": ("warning", "warnings"), "error": ("error", "errors")}


class _CheckCommand(click.Command):
    """Usage errors exit 3 like every other "could not check", not click's 2 (= failures here)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            exc.exit_code = EXIT_COULD_NOT_CHECK
            raise


def _give_up(message: str) -> "click.exceptions.Exit":
    click.echo(f"slurm-gpu check: {message}", err=True)
    raise click.exceptions.Exit(EXIT_COULD_NOT_CHECK)


@click.command(cls=_CheckCommand)
@config_option
@click.option("--node", metavar="NAME", default=None,
              help="Node name (default: $SLURMD_NODENAME, else the short hostname); picks the [[nodes]] entry.")
@click.option("--sim", "sim_profile", metavar="PROFILE", default=None,
              help="Check a simulated node instead of the real hardware: a shipped profile's name "
                   "(h100-ecc-dbe; `slurm-gpu sim profiles` lists them) or a profile file's path.")
@click.option("--tier", type=click.Choice(TIERS), default=None,
              help="Which checks: prolog (fast), health (all; the default), deep (plus DCGM diagnostics).")
@click.option("--only", "only", multiple=True, metavar="CHECK",
              help="Run only this check (repeatable; a check id such as gpu.ecc.uncorrectable, see docs/checks.md).")
@click.option("--verbose", "-v", "verbose", is_flag=True,
              help="List every check that ran, passing ones too (JSON: a \"checks\" object, check -> status).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(config_path: Optional[str], node: Optional[str], sim_profile: Optional[str], tier: str,
          only: Tuple[str, ...], verbose: bool, as_json: bool) -> None:
    """Run the checks and print the findings (exit 0 ok, 1 warn, 2 fail, 3 could not check).

    With --sim, a profile is judged by what it says of itself: its [hardware] stands in for
    [[nodes]] when the config has none, and without --tier the checks its [expect] names run
    beside the health tier's.

    Example: slurm-gpu check --sim h100-ecc-dbe --json
    """
    from healthcheck.checklist import CHECKS
    from healthcheck.runner import run_checks
    from healthcheck.sim.profile import ProfileError

    try:
        cfg = Config.load(config_path)
    except ConfigError as exc:
        for line in exc.lines():
            click.echo(line, err=True)
        raise click.exceptions.Exit(EXIT_COULD_NOT_CHECK)
    unknown = [cid for cid in only if cid not in CHECKS]
    if unknown:
        _give_up(f"--only {unknown[0]}: not a check id (one of: {', '.join(sorted(CHECKS))})")
    name = node_name(node)
    try:
        if sim_profile is not None:
            _judge_profile(cfg, name, tier or DEFAULT_TIER, sim_profile, add_expected=tier is None)
        tier = tier or DEFAULT_TIER
        if only:
            cfg.data["tiers"][tier] = list(only)
        with node_or_sim_sources(cfg, name, sim_profile, TEMP_PREFIX) as sources:
            report = run_checks(cfg, name, tier, sources=sources, consumer="cli", commit=True)
    except ProfileError as exc:
        _give_up(str(exc).splitlines()[0])
    except ValueError as exc:
        _give_up(str(exc))
    except OSError as exc:
        _give_up(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
    except ImportError as exc:
        _give_up(f"cannot load NVML bindings: {exc}")

    ran = _statuses(report, [cid for cid in cfg.tier(tier) if cid in CHECKS])
    if as_json:
        doc = report.to_json()
        if verbose:
            doc["checks"] = ran
        click.echo(json.dumps(versioned(doc), indent=2, sort_keys=False))
    else:
        for finding in report.findings:
            click.echo(f"{finding.status.upper():<5}  {finding.check:<26} {finding.message}  [{finding.action}]")
        if verbose:
            for cid, status in ran.items():
                if status == "ok":
                    click.echo(f"{'OK':<5}  {cid:<26} passed")
        click.echo(_summary(report))
    raise click.exceptions.Exit(report.exit_code)


def _statuses(report, check_ids) -> Dict[str, str]:
    """check id -> the worst status of its findings ("ok": none), for every check that ran."""
    from healthcheck.findings import STATUSES

    rank = {status: index for index, status in enumerate(STATUSES)}
    out = {cid: "ok" for cid in check_ids}
    for finding in report.findings:
        current = out.get(finding.check, "ok")
        if rank.get(finding.status, 0) > rank.get(current, 0):
            out[finding.check] = finding.status
    return out


def _judge_profile(cfg: Config, node: str, tier: str, sim_profile: str, add_expected: bool) -> None:
    """Judge a simulated node as its profile says: the profile's [hardware] is the [[nodes]]
    entry when the config describes no hardware at all, and (``add_expected``) the checks of its
    [expect] run beside the tier's."""
    from healthcheck.checklist import CHECKS
    from healthcheck.config import shipped
    from healthcheck.sim.profile import load_profile

    profile = load_profile(shipped.resolve(sim_profile))
    hardware = profile.get("hardware")
    if hardware:
        from healthcheck.config import CONFIG_SCHEMA
        from healthcheck.schema import validate

        problems = validate({"nodes": [dict(hardware, match=node)]}, CONFIG_SCHEMA)
        if problems:
            key, what, _ = problems[0]
            raise ValueError(f"{sim_profile}: [hardware] {key.replace('nodes.0.', '')}: {what}")
    if hardware and not cfg.data.get("nodes"):
        cfg.data["nodes"] = [dict(hardware, match=node)]
    if not add_expected:
        return
    expected = [cid for cid in profile.get("expect", {}).get("findings", []) if cid in CHECKS]
    tiers = cfg.data.setdefault("tiers", {})
    tiers[tier] = list(dict.fromkeys(list(tiers.get(tier, [])) + expected))


def _summary(report) -> str:
    counts = {}
    for finding in report.findings:
        counts[finding.status] = counts.get(finding.status, 0) + 1
    parts = []
    for status in ("fail", "warn", "error"):
        if counts.get(status):
            singular, many = _COUNT_WORDS[status]
            parts.append(f"{counts[status]} {singular if counts[status] == 1 else many}")
    detail = ", ".join(parts) if parts else "no findings"
    return f"{report.node}: {report.status} ({detail}; tier {report.tier}, {report.duration_ms} ms)"
