"""``slurm-gpu config check``."""
from __future__ import annotations

from typing import List, Optional

import click

from healthcheck.config import Config

from .common import EXIT_USAGE, load_config, versioned


@click.group()
def config() -> None:
    """Validate and print the configuration (every key: docs/configuration.md).

    Example: slurm-gpu config check /etc/slurm-gpu-hooks/config.toml
    """


def referenced_file_problems(cfg: Config) -> List[str]:
    """Simulator profiles the config names must exist and be valid profiles themselves."""
    from healthcheck.sim.profile import ProfileError, load_profile

    sim = cfg.section("sim")
    named = [("sim.profile", sim["profile"])] if sim.get("profile") else []
    named += [(f"sim.nodes.{node}", path) for node, path in sim.get("nodes", {}).items()]
    problems = []
    for key, value in named:
        try:
            path = cfg.resolve_profile(value)
        except ValueError as exc:
            problems.append(f"{cfg.path}: {key}: {exc}")
            continue
        try:
            load_profile(path)
        except ProfileError as exc:
            first = exc.problems[0]
            problems.append(f"{cfg.path}: {key}: {path}: {first[0]}: {first[1]}; {first[2]}")
    return problems


@config.command("check")
@click.argument("path", required=False)
@click.option("--config", "config_path", metavar="PATH", default=None, hidden=True)
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: v, path (null: built-in defaults), ok, problems, config.")
def check(path: Optional[str], config_path: Optional[str], as_json: bool) -> None:
    """Print the effective config, or each problem as one line and exit 2.

    PATH defaults to $SLURM_GPU_HOOKS_CONFIG, else /etc/slurm-gpu-hooks/config.toml.

    Example: slurm-gpu config check /etc/slurm-gpu-hooks/config.toml
    """
    if as_json:
        _check_json(path or config_path)
        return
    cfg = load_config(path or config_path)
    problems = referenced_file_problems(cfg)
    if problems:
        for line in problems:
            click.echo(line, err=True)
        raise click.exceptions.Exit(EXIT_USAGE)
    for line in cfg.deprecations():
        click.echo(line, err=True)
    click.echo(f"# effective configuration ({cfg.path or 'built-in defaults'})")
    click.echo(cfg.as_toml(), nl=False)


def _check_json(path: Optional[str]) -> None:
    """The same verdict as one JSON document on stdout (exit 2 when not ok)."""
    import json

    from healthcheck.config import ConfigError

    try:
        cfg = Config.load(path)
    except ConfigError as exc:
        doc = {"path": exc.path, "ok": False,
               "problems": exc.lines(), "config": None}
    else:
        problems = referenced_file_problems(cfg)
        doc = {"path": cfg.path, "ok": not problems, "problems": problems, "config": None if problems else cfg.data,
               "deprecated": cfg.deprecations()}
    click.echo(json.dumps(versioned(doc), indent=2, sort_keys=False))
    if not doc["ok"]:
        raise click.exceptions.Exit(EXIT_USAGE)
