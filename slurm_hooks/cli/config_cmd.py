"""``slurm-gpu config check``."""
from __future__ import annotations

from typing import Optional

import click

from .common import load_config


@click.group()
def config() -> None:
    """Validate and print the configuration."""


@config.command("check")
@click.argument("path", required=False)
@click.option("--config", "config_path", metavar="PATH", default=None, hidden=True)
def check(path: Optional[str], config_path: Optional[str]) -> None:
    """Print the effective config, or each problem as one line and exit 2."""
    cfg = load_config(path or config_path)
    click.echo(f"# effective configuration ({cfg.path or 'built-in defaults'})")
    click.echo(cfg.as_toml(), nl=False)
