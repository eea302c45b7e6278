"""``slurm-gpu-healthcheck``: Slurm's HealthCheckProgram.

Slurm gives it no environment but SLURMD_NODENAME (no PATH, no SLURM_CONF) and ignores its
exit status, so anything it concludes must be acted on by the program itself.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .hookenv import run_hook

    return run_hook("healthcheck", lambda: _run(argv))


def _run(argv: Optional[Sequence[str]]) -> int:
    from .config import node_name
    from .hookenv import journal, load_config_or_none

    config = load_config_or_none(os.environ, "healthcheck")
    if config is None:
        return 0
    journal(config, "healthcheck", node_name(None, os.environ), None, result="not-implemented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
