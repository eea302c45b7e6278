"""``slurm-gpu-prolog``: Slurm's Prolog (run by slurmd on every allocated node).

A non-zero exit drains the node and cancels or requeues the job, so it exits non-zero
only when the node is known to be bad, never because this tool is broken.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hookenv import run_hook

    return run_hook("prolog", lambda: _run(argv))


def _run(argv: Optional[Sequence[str]]) -> int:
    from healthcheck.config import node_name
    from healthcheck.hookenv import journal, load_config_or_none

    config = load_config_or_none(os.environ, "prolog")
    if config is None:
        return 0
    journal(config, "prolog", node_name(None, os.environ), os.environ.get("SLURM_JOB_ID"),
            context=os.environ.get("SLURM_SCRIPT_CONTEXT"), gpus=os.environ.get("SLURM_JOB_GPUS"),
            result="not-implemented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
