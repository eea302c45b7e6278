"""What every hook shares: an entry that never fails the node over the tool's own faults, and
loading config without ever failing the node over it."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from .config import Config, ConfigError


def run_hook(hook: str, body: Callable[[], int]) -> int:
    """Run a hook's body and return its exit status; whatever it raises is the tool being broken.

    Every hook's ``main`` goes through here: a bug, a config the hook cannot use (a path with a
    NUL byte, TOML nested past the parser's recursion limit), a missing driver function, memory
    running out: one line on stderr (slurmd logs it) and exit 0, so the node is not drained and
    the job not failed over it (fail open). Only ``SystemExit``, a hook deciding its own status,
    passes through.

    The body runs as one short process (``healthcheck.shortlived``: no cyclic garbage
    collection, the heap frozen at exit); the hooks' ``main`` enters that before its imports.
    """
    from .shortlived import short_process

    with short_process():
        return _run_failing_open(hook, body)


def _run_failing_open(hook: str, body: Callable[[], int]) -> int:
    try:
        return body()
    except SystemExit:
        raise
    except BaseException as exc:       # noqa: B036 - fail open is the policy, whatever went wrong
        try:
            detail = " ".join(str(exc).split())[:300]
            where = _innermost_frame(exc)
            print(f"slurm-gpu-{hook}: internal error, doing nothing (fail open): "
                  f"{type(exc).__name__}: {detail}{where}", file=sys.stderr)
        except BaseException:           # noqa: B036 - even the message must not fail the hook
            pass
        return 0


def help_requested(hook: str, argv: Optional[Sequence[str]], doc: str, example: str) -> Optional[int]:
    """``--help`` for a hook Slurm runs without arguments: the exit status to return when a
    person asked for help (or passed an argument the hook does not take), else None.

    Slurm never passes a Prolog or Epilog arguments, so any argument is a person at a terminal.
    Kept argparse-free: this is on every job's path."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return None
    if args[0] in ("-h", "--help"):
        print(f"usage: slurm-gpu-{hook} [-h]\n\n{doc.strip()}\n\noptions:\n  -h, --help  show this help and exit"
              f"\n\nExample:\n  {example}")
        return 0
    print(f"slurm-gpu-{hook}: takes no arguments (Slurm runs it; see --help), got {args[0]!r}", file=sys.stderr)
    return 2


def _innermost_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f" (at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})"


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
