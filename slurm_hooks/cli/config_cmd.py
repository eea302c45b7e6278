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


def kernel_log_warnings(cfg: Config) -> List[str]:
    """A warning when ``[paths] kernel_log`` is a file whose lines are in a form that cannot tell a
    kernel record's later lines (a user's text) from the driver's own lines (docs/kernel-log.md)."""
    path = cfg.section("paths").get("kernel_log", "auto")
    if path in ("auto", "kmsg", "journal"):
        return []
    from healthcheck.kernellog.logfiles import untellable_file_form
    from healthcheck.kernellog.readers import KernelLogError

    try:
        form = untellable_file_form(path)
    except (KernelLogError, OSError):
        return []                          # not readable here: the hooks say so when they read it
    if form is None:
        return []
    return [f"{cfg.path or 'built-in defaults'}: paths.kernel_log: {path} holds {form}: a user's text "
            "in a kernel message can be read as a driver line there; use \"kmsg\" or \"journal\" "
            "(docs/kernel-log.md)"]


@config.command("check")
@click.argument("path", required=False)
@click.option("--config", "config_path", metavar="PATH", default=None, hidden=True)
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: v, path (null: built-in defaults), ok, problems, config, "
                   "deprecated, warnings.")
def check(path: Optional[str], config_path: Optional[str], as_json: bool) -> None:
    """Print the effective config, or each problem as one line and exit 2.

    Older keys, and a [paths] kernel_log file whose lines cannot tell a user's text from the
    kernel's (dmesg -t, dmesg -S -T: docs/kernel-log.md), are one warning line each on stderr.

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
    for line in cfg.deprecations() + kernel_log_warnings(cfg):
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
               "deprecated": cfg.deprecations(), "warnings": kernel_log_warnings(cfg)}
    click.echo(json.dumps(versioned(doc), indent=2, sort_keys=False))
    if not doc["ok"]:
        raise click.exceptions.Exit(EXIT_USAGE)
