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
    "xid": "Scan kernel logs for Xid events and explain Xid codes.",
    "lab": "A real Slurm cluster on this machine, for tests and the demo.",
    "slurm-conf": "Print the slurm.conf lines that plug the installed hooks into Slurm.",
    "summary": "Why jobs ended, which hardware hurt them, which nodes keep doing it.",
    "job": "How one job ended: its class per node, with the evidence.",
    "drained": "Drained nodes: who drained them, why, our evidence, what to do.",
    "resume": "Re-check a node and resume it in Slurm when healthy.",
}


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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-gpu-hooks")
def main() -> None:
    """Keep Slurm jobs off broken GPU nodes, and say why every job ended.

    Example: slurm-gpu check --sim h100-ecc-dbe
    """
