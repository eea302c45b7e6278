"""What every subcommand shares: loading config with one-line errors, exit codes."""
from __future__ import annotations

from typing import Any, Dict, Optional

import click

from healthcheck.config import Config, ConfigError

EXIT_USAGE = 2
# Every JSON document a command prints carries "v": its format version. Keys are only ever added
# within a version; a renamed or removed key would be a new version.
JSON_VERSION = 1

config_option = click.option(
    "--config", "config_path", metavar="PATH", default=None,
    help="Config file (default: $SLURM_GPU_HOOKS_CONFIG, else /etc/slurm-gpu-hooks/config.toml).")


def versioned(doc: Dict[str, Any]) -> Dict[str, Any]:
    """``doc`` with ``"v"`` first (its own keys unchanged)."""
    return {"v": JSON_VERSION, **doc}


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
