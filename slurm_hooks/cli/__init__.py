"""``slurm-gpu``: the admin CLI. Subcommands load lazily so ``--help`` and each command
import only what they use."""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional

import click

# name -> "module:attribute" of a click command or group. Add a line to add a command.
SUBCOMMANDS: Dict[str, str] = {
    "config": "slurm_hooks.cli.config_cmd:config",
    "sim": "slurm_hooks.cli.sim_cmd:sim",
    "check": "slurm_hooks.cli.check_cmd:check",
    "genconf": "slurm_hooks.cli.genconf_cmd:genconf",
    "xid": "slurm_hooks.cli.xid_cmd:xid",
    "lab": "slurm_hooks.cli.lab_cmd:lab",
    "slurm-conf": "slurm_hooks.cli.slurm_conf_cmd:slurm_conf",
    "summary": "slurm_hooks.cli.summary_cmd:summary",
    "job": "slurm_hooks.cli.job_cmd:job",
    "drained": "slurm_hooks.cli.drained_cmd:drained",
    "resume": "slurm_hooks.cli.drained_cmd:resume",
}

HELP = {
    "config": "Validate and print the configuration.",
    "sim": "Change, reset and show simulated nodes.",
    "check": "Run the GPU, NVLink and InfiniBand checks on this node.",
    "genconf": "Print this node's [[nodes]] entry, as probed (--slurm: compare with Slurm's Gres).",
    "xid": "Scan kernel logs for Xid events and explain Xid codes.",
    "lab": "A real Slurm cluster on this machine, for tests and the demo.",
    "slurm-conf": "Print the slurm.conf lines that plug the installed hooks into Slurm.",
    "summary": "Why jobs ended, which hardware hurt them, which nodes keep doing it.",
    "job": "How one job ended: its class per node, with the evidence.",
    "drained": "Drained nodes: who drained them, why, our evidence, what to do.",
    "resume": "Re-check a node and resume it in Slurm when healthy.",
}


# One exit-status table for every command (docs/operations.md "Exit status" shows the same rows,
# `slurm-gpu --help` and the man page too; tests/test_cli_scripting.py holds them together).
EXIT_STATUS = (
    ("check", "0 ok, 1 warnings only, 2 failures, 3 could not check (bad input included)"),
    ("config check", "0 valid, 2 invalid or bad input"),
    ("genconf", "0 printed, 1 Slurm's Gres differs from the node (one finding line), 2 bad input, "
                "3 the node not probed or Slurm not asked"),
    ("summary", "0 done, 1 input partly unreadable (the rest is summarised), 2 bad input"),
    ("xid scan", "0 done, 1 the log is partly unreadable, 2 bad input"),
    ("xid explain, sim, slurm-conf", "0 done, 2 bad input"),
    ("drained, job", "0 done, 1 Slurm failed or the job is unknown, 2 bad input"),
    ("resume", "0 resumed or nothing to resume, 1 not resumed (still unhealthy, not ours, Slurm failed), "
               "2 bad input"),
    ("lab up, down, scenarios", "0 done, 1 failed (one line says what)"),
    ("lab status", "0 everything runs, 1 part of it, 3 nothing"),
    ("slurm-gpu-prolog", "0 the job may start, 1 the node was drained (the job must not start), 2 an argument"),
    ("slurm-gpu-epilog, -healthcheck, -taskprolog", "0 always when Slurm runs them, 2 a person's bad command line"),
)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        target = SUBCOMMANDS.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing help should not import every subcommand module.
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Exit status"):
            formatter.write_dl(list(EXIT_STATUS))
        formatter.write_paragraph()
        formatter.write_text("Every --json document carries \"v\" (its format version). Bad input: one line on "
                             "stderr, never a traceback. The manual: man slurm-gpu.")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-gpu-hooks")
def main() -> None:
    """Keep Slurm jobs off broken GPU nodes, and say why every job ended.

    Example: slurm-gpu check --sim h100-ecc-dbe
    """
