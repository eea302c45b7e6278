"""The ``slurm-gpu(1)`` man page, generated from the commands' own click help (so it cannot
drift from ``--help``). ``man/slurm-gpu.1`` in the repository is its output and the wheel
installs it as ``<venv>/share/man/man1/slurm-gpu.1``; tests/test_cli_scripting.py fails when
the file is not current. Regenerate it with::

    python -m slurm_hooks.cli.manpage > man/slurm-gpu.1
"""
from __future__ import annotations

import sys
from typing import Iterator, List, Tuple

import click

WIDTH = 78          # fixed, so the page does not depend on the terminal it was made on


def _walk(ctx: click.Context) -> Iterator[Tuple[List[str], click.Context]]:
    """Every command under ``ctx``'s, each with a context chained to its parents' (help option
    names and widths are inherited, as when a person runs it)."""
    yield ctx.command_path.split()[1:], ctx
    command = ctx.command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(click.Context(sub, info_name=name, parent=ctx))


def _escape(line: str) -> str:
    line = line.replace("\\", "\\e")
    return ("\\&" + line) if line.startswith((".", "'")) else line


def _verbatim(text: str) -> List[str]:
    return [".nf"] + [_escape(line) for line in text.rstrip().splitlines()] + [".fi"]


def render(main: click.Command, version: str) -> str:
    from . import EXIT_STATUS

    out = [f'.TH SLURM-GPU 1 "" "slurm-gpu-hooks {version}" "slurm-gpu-hooks"',
           ".SH NAME", "slurm-gpu \\- keep Slurm jobs off broken GPU nodes, and say why every job ended",
           ".SH SYNOPSIS", ".B slurm-gpu", "COMMAND [OPTIONS] [ARGS]...",
           ".SH DESCRIPTION",
           "The admin's command of slurm-gpu-hooks: checks on demand, Xid explanations, config validation, "
           "drained nodes and resuming them, summaries of why jobs ended, the simulator and the lab. "
           "The hooks Slurm runs are slurm-gpu-prolog, slurm-gpu-epilog, slurm-gpu-taskprolog and "
           "slurm-gpu-healthcheck (each answers --help).",
           ".SH COMMANDS"]
    root = click.Context(main, info_name="slurm-gpu", terminal_width=WIDTH, max_content_width=WIDTH,
                         **getattr(main, "context_settings", {}))
    for path, ctx in _walk(root):
        if not path:
            continue
        out += [".SS " + " ".join(["slurm-gpu", *path])]
        out += _verbatim(ctx.get_help())
    out += [".SH EXIT STATUS"]
    for name, codes in EXIT_STATUS:
        out += [".TP", f".B {name}", codes]
    out += [".PP", "Bad input is one line on standard error, never a traceback.",
            ".SH JSON", "Every document a command prints with --json carries the key \\fBv\\fR, its format version "
            "(1). Keys are only added within a version.",
            ".SH ENVIRONMENT", ".TP", ".B SLURM_GPU_HOOKS_CONFIG",
            "The config file (default /etc/slurm-gpu-hooks/config.toml).",
            ".TP", ".B SLURMD_NODENAME", "This node's name (default: the short hostname).",
            ".SH FILES", ".TP", ".B /etc/slurm-gpu-hooks/config.toml", "The config (docs/configuration.md).",
            ".TP", ".B /var/lib/slurm-gpu-hooks", "The state dir ([paths] state_dir): job records, evidence, journals.",
            ".TP", ".B /var/lib/prometheus/node-exporter/slurm_gpu_health_<node>.prom",
            "The health check's metrics ([health] textfile_dir).",
            ".TP", ".B <venv>/share/slurm-gpu-hooks/", "Prometheus alert rules and a Grafana dashboard.",
            ".SH SEE ALSO", "slurm.conf(5), scontrol(1), sacct(1); docs/install.md and docs/operations.md of "
            "slurm-gpu-hooks."]
    return "\n".join(out) + "\n"


def main_entry() -> int:
    from importlib.metadata import PackageNotFoundError, version

    from . import main

    try:
        number = version("slurm-gpu-hooks")
    except PackageNotFoundError:
        number = "0"
    sys.stdout.write(render(main, number))
    return 0


if __name__ == "__main__":
    sys.exit(main_entry())
