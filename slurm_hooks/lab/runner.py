"""Running commands for the lab: argument lists only, always with a timeout, errors as one
line. (The lab keeps this minimal runner of its own; the product's Slurm CLI backend lives
in ``slurm_hooks.slurm``.)"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, Mapping, Optional, Sequence

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
        check: bool = True, input: Optional[str] = None, cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run ``argv``; on failure (when ``check``) raise LabError naming the command and its stderr."""
    try:
        result = subprocess.run(list(argv), env=dict(env) if env is not None else clean_env(),
                                input=input, capture_output=True, text=True, timeout=timeout,
                                cwd=cwd or "/", stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise LabError(f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv[:4])}: no answer within {timeout:g} s") from None
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(argv[:4])} failed (rc {result.returncode}): {last_line(result)}")
    return result


def last_line(result: subprocess.CompletedProcess) -> str:
    for stream in (result.stderr, result.stdout):
        lines = [line.strip() for line in (stream or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return "no output"


def slurm_gpu_argv() -> list:
    """How to run this project's ``slurm-gpu``: the console script next to this Python."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "slurm-gpu")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-I", "-c",
            "import sys; from slurm_hooks.cli import main; sys.argv[0] = 'slurm-gpu'; main()"]
