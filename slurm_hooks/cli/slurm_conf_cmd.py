"""``slurm-gpu slurm-conf``: the slurm.conf lines that plug this installation's hooks into Slurm.

The text is data (``slurm_hooks/data/slurm.conf.tmpl``); ``etc/slurm.conf.snippet`` is the same
text for the layout docs/install.md recommends (a test keeps the two equal).
"""
from __future__ import annotations

import os
import string
import sys
from importlib import resources
from typing import Dict, List, Optional, Tuple

import click

from .common import fail

HOOK_COMMANDS = ("slurm-gpu-prolog", "slurm-gpu-epilog", "slurm-gpu-healthcheck", "slurm-gpu-taskprolog")
NODE_STATES = ("ANY", "IDLE", "ALLOC", "MIXED", "NONDRAINED_IDLE")
DEFAULT_INTERVAL_S = 300


def render(bin_dir: str, interval: int = DEFAULT_INTERVAL_S, node_state: str = "ANY",
           release: Optional[Tuple[int, int]] = None) -> str:
    text = resources.files("slurm_hooks").joinpath("data/slurm.conf.tmpl").read_text("utf-8")
    out = string.Template(text).substitute(bin_dir=bin_dir.rstrip("/") or "/", interval=interval,
                                           node_state=node_state)
    for line in release_entries(release):
        out += "".join(f"# {part}\n" for part in line["comment"].splitlines())
        if line.get("note"):
            continue                    # a comment only: a setting this release has and we leave out
        if line.get("below_interval") and int(line["value"]) >= interval:
            out += (f"# {line['setting']}={line['value']} left out: Slurm wants it below "
                    f"HealthCheckInterval ({interval}).\n")
            continue
        out += f"{line['setting']}={line['value']}\n"
    return out


def parse_release(text: str) -> Tuple[int, int]:
    """"24.11" -> (24, 11); ValueError otherwise."""
    major, dot, minor = text.strip().partition(".")
    if not dot or not major.isdigit() or not minor.isdigit():
        raise ValueError(f"not a Slurm release: {text!r} (e.g. 24.11)")
    return int(major), int(minor)


def release_entries(release: Optional[Tuple[int, int]]) -> List[Dict[str, str]]:
    """The entries of ``slurm-conf-releases.toml`` for ``release`` (none when unknown): settings,
    and notes (``note = true``: a comment only)."""
    if release is None:
        return []
    from healthcheck.safeio.tomlio import loads

    table = loads(resources.files("slurm_hooks").joinpath("data/slurm-conf-releases.toml").read_text("utf-8"))
    return [line for line in table.get("line", []) if release >= parse_release(str(line["since"]))]


def release_lines(release: Optional[Tuple[int, int]]) -> List[Dict[str, str]]:
    """The settings of ``slurm-conf-releases.toml`` that ``release`` has (none when unknown)."""
    return [line for line in release_entries(release) if not line.get("note")]


def detected_release() -> Optional[Tuple[int, int]]:
    """The release this machine's ``scontrol --version`` reports (None: no scontrol, or unknown)."""
    from healthcheck.slurm.cli_backend import CliBackend

    found = CliBackend(timeout_s=10).release()
    return found if found != (0, 0) else None


def installed_bin_dir(argv0: str = "", executable: str = "") -> Optional[str]:
    """Where this installation's hook commands are: beside the ``slurm-gpu`` that runs, as it was
    called (so a stable symlinked path such as /opt/slurm-gpu-hooks/current/bin stays stable), or
    beside what a link to it names (one level: /usr/local/bin/slurm-gpu -> .../current/bin), else
    beside the Python running it. None when none of these holds the hooks."""
    argv0 = argv0 or sys.argv[0]
    executable = executable or sys.executable
    candidates = []
    if argv0 and os.path.basename(argv0) == "slurm-gpu":
        called = os.path.abspath(argv0)
        candidates.append(os.path.dirname(called))
        if os.path.islink(called):   # /usr/local/bin/slurm-gpu -> /opt/slurm-gpu-hooks/current/bin/slurm-gpu
            target = os.path.join(os.path.dirname(called), os.readlink(called))
            candidates.append(os.path.dirname(os.path.normpath(target)))
    candidates.append(os.path.dirname(os.path.abspath(executable)))
    for directory in candidates:
        if all(os.access(os.path.join(directory, name), os.X_OK) for name in HOOK_COMMANDS):
            return directory
    return None


@click.command("slurm-conf")
@click.option("--bin-dir", metavar="DIR", default=None,
              help="Directory of the installed hook commands (default: where this slurm-gpu is, "
                   "as it was called; call it by its stable path, e.g. /opt/slurm-gpu-hooks/current/bin).")
@click.option("--interval", type=click.IntRange(min=10), default=DEFAULT_INTERVAL_S, show_default=True,
              metavar="SECONDS", help="HealthCheckInterval: seconds between two health checks of a node.")
@click.option("--node-state", type=click.Choice(NODE_STATES), default="ANY", show_default=True,
              help="HealthCheckNodeState: which nodes the health check runs on.")
@click.option("--slurm", "slurm_release", metavar="VERSION", default=None,
              help="The Slurm release to write for, e.g. 24.11 (default: what `scontrol --version` says; "
                   "settings newer releases added are printed only for them).")
def slurm_conf(bin_dir: Optional[str], interval: int, node_state: str, slurm_release: Optional[str]) -> None:
    """Print the slurm.conf lines for this installation: PrologFlags, Prolog, Epilog,
    EpilogSlurmctld, TaskProlog, HealthCheckProgram (absolute paths of the installed commands),
    HealthCheckInterval and HealthCheckNodeState, each with a comment; and for the Slurm release
    (detected, or --slurm) the settings it added: PrologTimeout and EpilogTimeout (25.05+),
    HealthCheckTimeout (26.05+); for 26.05+ a comment on why HealthCheckNodeState's START_ONLY and
    REBOOT_ONLY are left out.

    Example: /opt/slurm-gpu-hooks/current/bin/slurm-gpu slurm-conf >> /etc/slurm/slurm.conf
    """
    if bin_dir is None:
        bin_dir = installed_bin_dir()
        if bin_dir is None:
            fail("cannot tell where the hook commands are installed; give --bin-dir DIR")
    elif not os.path.isabs(bin_dir):
        fail(f"--bin-dir must be an absolute path (Slurm runs the hooks without PATH): {bin_dir!r}")
    if any(char.isspace() or char in "#\\\"'" or not char.isprintable() for char in bin_dir):
        fail(f"--bin-dir {bin_dir!r} cannot go into slurm.conf (no blanks, quotes, '#' or backslashes)")
    if slurm_release is not None:
        try:
            release: Optional[Tuple[int, int]] = parse_release(slurm_release)
        except ValueError as exc:
            fail(f"--slurm: {exc}")
    else:
        release = detected_release()
    click.echo(render(bin_dir, interval, node_state, release), nl=False)
