"""``slurm-gpu-epilog``: serves both Epilog (slurmd, per node) and EpilogSlurmctld (once
per job, inside slurmctld), told apart by SLURM_SCRIPT_CONTEXT.

EpilogSlurmctld gets no SLURMD_NODENAME; its journal entries go under "slurmctld".
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

CONTEXT_SLURMD = "epilog_slurmd"
CONTEXT_SLURMCTLD = "epilog_slurmctld"


def hook_identity(env=os.environ):
    context = env.get("SLURM_SCRIPT_CONTEXT", CONTEXT_SLURMD)
    if context == CONTEXT_SLURMCTLD:
        return "epilog_slurmctld", "slurmctld"
    from healthcheck.config import node_name

    return "epilog", node_name(None, env)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hookenv import run_hook

    return run_hook("epilog", lambda: _run(argv))


def _run(argv: Optional[Sequence[str]]) -> int:
    from healthcheck.hookenv import journal, load_config_or_none

    config = load_config_or_none(os.environ, "epilog")
    if config is None:
        return 0
    hook, node = hook_identity(os.environ)
    journal(config, hook, node, os.environ.get("SLURM_JOB_ID"), context=os.environ.get("SLURM_SCRIPT_CONTEXT"),
            exit_code2=os.environ.get("SLURM_JOB_EXIT_CODE2"), result="not-implemented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
