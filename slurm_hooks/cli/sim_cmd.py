"""``slurm-gpu sim inject | reset | show | profiles``: break and mend simulated hardware while jobs run."""
from __future__ import annotations

import json
from typing import Optional, Tuple

import click

from healthcheck.safeio import tomlio
from healthcheck.config import DEFAULT_CONFIG_PATH
from healthcheck.sim.node import SimNode
from healthcheck.sim.profile import ProfileError, parse_assignment

from .common import config_option, fail, load_config, versioned


def _sim_node(config_path: Optional[str], node: str) -> SimNode:
    cfg = load_config(config_path)
    try:
        profile = cfg.sim_profile_path(node)
    except ValueError as exc:
        fail(str(exc))
    if profile is None:
        where = cfg.path or f"the config (none given, and {DEFAULT_CONFIG_PATH} does not exist)"
        fail(f"node {node!r} has no simulator profile ([sim] profile or [sim] nodes.{node} in {where})")
    try:
        return SimNode(cfg.state_dir, node, profile)
    except ValueError as exc:
        fail(str(exc))


def _guard(action):
    try:
        return action()
    except ProfileError as exc:
        fail(str(exc).splitlines()[0])
    except (KeyError, ValueError) as exc:
        fail(str(exc.args[0]) if exc.args else str(exc))
    except OSError as exc:
        fail(f"{exc.filename or ''}: {exc.strerror or exc}")


@click.group()
def sim() -> None:
    """Change, reset and show simulated nodes; list the shipped profiles.

    Example: slurm-gpu sim inject gpu1 gpu.3.state=lost
    """


@sim.command()
@config_option
@click.argument("node")
@click.argument("assignments", nargs=-1, metavar="[KEY=VALUE ...]")
@click.option("--log", "log_lines", multiple=True, metavar="LINE", help="Append a kernel-log line.")
def inject(config_path: Optional[str], node: str, assignments: Tuple[str, ...], log_lines: Tuple[str, ...]) -> None:
    """Change a simulated node: gpu.3.ecc.volatile_uncorrected=1, gpu.5.state=lost,
    gpu.1.nvlink.down=[4,5], ib.mlx5_2:1.state="1: DOWN".

    Example: slurm-gpu sim inject gpu1 gpu.3.ecc.volatile_uncorrected=1 gpu.5.state=lost
    """
    target = _sim_node(config_path, node)
    if not assignments and not log_lines:
        fail("nothing to inject: give KEY=VALUE and/or --log LINE")
    pairs = _guard(lambda: [parse_assignment(text) for text in assignments])
    _guard(lambda: target.inject(pairs, log_lines))
    for key, value in pairs:
        click.echo(f"{node}: {key} = {json.dumps(value)}")
    for line in log_lines:
        click.echo(f"{node}: kernel log += {line}")


@sim.command()
@config_option
@click.argument("node")
def reset(config_path: Optional[str], node: str) -> None:
    """Restore a simulated node to its shipped profile.

    Example: slurm-gpu sim reset gpu1
    """
    target = _sim_node(config_path, node)
    _guard(target.reset)
    click.echo(f"{node}: reset to {target.profile_path}")


@sim.command()
@config_option
@click.argument("node")
def reboot(config_path: Optional[str], node: str) -> None:
    """Reboot a simulated node: a new boot id, an empty kernel log, and what a reboot clears
    cleared (lost GPUs, volatile ECC counts, pending remaps); hardware faults stay.

    Example: slurm-gpu sim reboot gpu2
    """
    target = _sim_node(config_path, node)
    _guard(target.reboot)
    click.echo(f"{node}: rebooted (boot id {target.boot_id()})")


@sim.command()
@config_option
@click.argument("node")
def show(config_path: Optional[str], node: str) -> None:
    """Print a simulated node's live profile as TOML.

    Example: slurm-gpu sim show gpu1
    """
    target = _sim_node(config_path, node)
    profile = _guard(target.ensure)
    click.echo(tomlio.dumps(profile), nl=False)


@sim.command()
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: v, profiles (name, description, path, expect).")
def profiles(as_json: bool) -> None:
    """List the shipped simulator profiles: name and what each simulates.

    A name goes wherever a profile is expected: `slurm-gpu check --sim h100-ecc-dbe`,
    `[sim] profile = "h100-healthy"` in the config.

    Example: slurm-gpu sim profiles
    """
    from healthcheck.config import shipped
    from healthcheck.sim.profile import load_profile

    rows = []
    for name in shipped.shipped_names():
        path = shipped.resolve(name)
        profile = _guard(lambda: load_profile(path))
        rows.append({"name": name, "description": profile["node"].get("description", ""), "path": path,
                     "expect": list(profile.get("expect", {}).get("findings", []))})
    if as_json:
        click.echo(json.dumps(versioned({"profiles": rows}), indent=2))
        return
    for item in rows:
        click.echo(f"{item['name']:<28} {item['description']}".rstrip())
