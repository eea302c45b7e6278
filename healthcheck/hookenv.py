"""What every hook does first: load config without ever failing the node over it."""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

from .config import Config, ConfigError


def load_config_or_none(env: Mapping[str, str] = os.environ, hook: str = "hook") -> Optional[Config]:
    """The config, or None after one line on stderr (slurmd logs it).

    A hook that cannot read its own config must not drain the node or fail the job: the
    tool being broken is not the node being broken.
    """
    try:
        return Config.load(None, env)
    except ConfigError as exc:
        print(f"slurm-gpu-{hook}: config unusable, doing nothing: {exc.lines()[0]}", file=sys.stderr)
    except OSError as exc:
        print(f"slurm-gpu-{hook}: config unreadable, doing nothing: {exc}", file=sys.stderr)
    return None


def journal(config: Config, hook: str, node: str, job_id: Optional[str], **detail: Any) -> None:
    """Record that a hook ran; a journal that cannot be written is said once, never fatal."""
    from .hookruns import record_run

    try:
        record_run(config.state_dir, hook, node, job_id, **detail)
    except (OSError, ValueError) as exc:     # ValueError: a node name unusable as a file name
        print(f"slurm-gpu-{hook}: cannot write the hook journal: {exc}", file=sys.stderr)
