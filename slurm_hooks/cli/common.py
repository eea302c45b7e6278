"""What every subcommand shares: loading config with one-line errors, exit codes."""
from __future__ import annotations

from typing import Optional

import click

from healthcheck.config import Config, ConfigError

EXIT_USAGE = 2

config_option = click.option(
    "--config", "config_path", metavar="PATH", default=None,
    help="Config file (default: $SLURM_GPU_HOOKS_CONFIG, else /etc/slurm-gpu-hooks/config.toml).")


def fail(message: str, code: int = EXIT_USAGE) -> "click.exceptions.Exit":
    """Print one clear line to stderr and exit non-zero (never a traceback)."""
    click.echo(f"slurm-gpu: {message}", err=True)
    raise click.exceptions.Exit(code)


def load_config(path: Optional[str]) -> Config:
    try:
        return Config.load(path)
    except ConfigError as exc:
        for line in exc.lines():
            click.echo(line, err=True)
        raise click.exceptions.Exit(EXIT_USAGE)
