"""Running commands for the lab through the product's bounded runner (``healthcheck.safeio.programs``:
argument lists only, a timeout that kills the whole process group, errors as one line), with
the lab's clean environment."""
from __future__ import annotations

import os
import sys
from typing import Dict, Mapping, Optional, Sequence

from healthcheck.safeio import programs
from healthcheck.safeio.programs import Completed

from . import LabError
from .paths import LabPaths

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def clean_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """A minimal environment for daemons and clients: nothing of the caller's leaks in."""
    env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/root",
           "TZ": os.environ.get("TZ", "UTC")}
    env.update(extra or {})
    return env


def slurm_env(lab: LabPaths) -> Dict[str, str]:
    return clean_env({"SLURM_CONF": lab.slurm_conf, "SLURM_GPU_HOOKS_CONFIG": lab.hooks_config})


def run(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, timeout: float = 30,
        check: bool = True, input: Optional[str] = None, cwd: Optional[str] = None) -> Completed:
    """Run ``argv``; on failure (when ``check``) raise LabError naming the command and its stderr."""
    try:
        result = programs.run(argv, timeout, env=env if env is not None else clean_env(), cwd=cwd or "/",
                             input=input)
    except programs.CommandError as exc:
        if not exc.timed_out and "No such file" in str(exc):
            raise LabError(f"{argv[0]}: command not found") from None
        raise LabError(str(exc)) from None
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(argv[:4])} failed (rc {result.returncode}): {last_line(result)}")
    return result


def last_line(result: Completed) -> str:
    lines = result.last_line()
    return "no output" if lines == f"exit {result.returncode}" else lines


def slurm_gpu_argv() -> list:
    """How to run this project's ``slurm-gpu``: the console script next to this Python."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "slurm-gpu")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-I", "-c",
            "import sys; from slurm_hooks.cli import main; sys.argv[0] = 'slurm-gpu'; main()"]
