"""``slurm-gpu-prolog``: Slurm's Prolog (run by slurmd on every allocated node).

A non-zero exit drains the node and cancels or requeues the job, so it exits non-zero
only when the node is known to be bad, never because this tool is broken.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.config import node_name
    from healthcheck.hookenv import load_config_or_none
    from healthcheck.hookruns import record_run

    config = load_config_or_none(os.environ, "prolog")
    if config is None:
        return 0
    try:
        record_run(config.state_dir, "prolog", node_name(None, os.environ),
                   os.environ.get("SLURM_JOB_ID"), context=os.environ.get("SLURM_SCRIPT_CONTEXT"),
                   gpus=os.environ.get("SLURM_JOB_GPUS"), result="not-implemented")
    except OSError as exc:
        print(f"slurm-gpu-prolog: cannot write the hook journal: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
