"""What every subcommand shares: loading config with one-line errors, exit codes."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional

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


@contextlib.contextmanager
def node_or_sim_sources(cfg: Config, node: str, sim_profile: Optional[str], temp_prefix: str) -> Iterator:
    """Where ``node``'s facts come from: this node (or the config's simulator), or with
    ``sim_profile`` a simulated node built from that profile (ValueError: no such shipped name)."""
    from healthcheck.config import shipped
    from healthcheck.safeio.fsutil import run_temp_dir
    from healthcheck.sources import node_sources, sim_sources

    if sim_profile is None:
        yield node_sources(cfg, node)
        return
    sim_profile = shipped.resolve(sim_profile)
    if cfg.sets("paths", "state_dir"):
        yield sim_sources(node, cfg.state_dir, sim_profile)
        return
    # No state dir of the admin's: a throwaway one, so a look at a profile leaves nothing behind
    # (and counter growth starts from a fresh baseline each time).
    # (run_temp_dir also removes what runs killed before they could clean up left behind.)
    with run_temp_dir(temp_prefix) as state_dir:
        yield sim_sources(node, state_dir, sim_profile)
