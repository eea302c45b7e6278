"""What every hook shares: the one hook skeleton (``serve``: --help, config, watchdog, fail
open, journal), an entry that never fails the node over the tool's own faults, and loading
config without ever failing the node over it.

The four entry points (prolog, epilog, health check, TaskProlog) are compositions of it::

    def main(argv=None):
        from healthcheck.hooklib.nogc import short_process

        with short_process():          # the collector off before any import: one short process
            from healthcheck.hooklib.skeleton import serve

            return serve("taskprolog", argv, _body, doc=ADMIN_HELP, example=EXAMPLE, start=_start)

(the prolog, epilog and health check the same way).

``start(argv)`` loads the config and names the run (``HookRun``; an int ends the hook with that
status: no config, bad arguments), ``_body(run)`` does the hook's work and returns its
``Ending`` (exit status, journal line), ``on_watchdog``/``on_error`` say what a run stopped at its
deadline or broken by the tool's own fault ends with. Without ``deadline`` (the TaskProlog) there
is no watchdog, and an ``Ending`` without a journal line journals nothing.
"""
from __future__ import annotations

import os
import sys
from ..plain import field, plain
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Union

from ..config import DEFAULT_CONFIG_PATH, Config, ConfigError


@plain
class HookRun:
    """One run of a hook, as the skeleton hands it to the hook's body."""
    hook: str                                   # the journal's name ("epilog_slurmctld" for the ctld epilog)
    config: Config
    node: str
    job_id: Optional[str] = None
    journal: Dict[str, Any] = field(default_factory=dict)   # fields every journal line of the run carries
    options: Any = None                         # the hook's parsed options (the health check's)


class Ending(NamedTuple):
    exit: int
    journal: Optional[Dict[str, Any]] = None    # the journal line's detail; None: nothing journaled


def config_or_exit(prog: str, path: Optional[str], env: Mapping[str, str] = os.environ,
                   cached: bool = False) -> Union[Config, int]:
    """The config a person named (``--config``; None: the default lookup) for a program they run:
    when it is not usable, one line and exit status 2 (a hook Slurm runs fails open instead:
    ``load_config_or_none``)."""
    loaded = _load(path, env, cached)
    if isinstance(loaded, Config):
        return loaded
    print(f"{prog}: config {loaded}", file=sys.stderr)
    return 2


def _load(path: Optional[str], env: Mapping[str, str], cached: bool) -> Union[Config, str]:
    """The config, or why it cannot be had in words ("unusable: file: key: ..." or "unreadable:
    ..."): never raised, each caller says it its own way."""
    try:
        return Config.load(path, env, cached=cached)
    except ConfigError as exc:
        return f"unusable: {exc.lines()[0]}"
    except OSError as exc:
        return f"unreadable: {path}: {exc.strerror or exc}" if path else f"unreadable: {exc}"


def start(name: str, env: Mapping[str, str] = os.environ, hook: Optional[str] = None, node: Optional[str] = None,
          config_path: Optional[str] = None, **journal: Any) -> Union[HookRun, int]:
    """The usual start of a hook: its config (the default one not usable: exit 0, one line; an
    explicit ``config_path`` a person gave that is not usable: one line, exit 2), its node (``node``,
    else ``SLURMD_NODENAME``) and job; ``journal``: fields every journal line of the run carries."""
    from ..config import node_name

    if config_path is not None:
        config = config_or_exit(f"slurm-gpu-{name}", config_path, env)
        if isinstance(config, int):
            return config
    else:
        config = load_config_or_none(env, name)
    if config is None:
        return 0
    return HookRun(hook or name, config, node if node is not None else node_name(None, env),
                   env.get("SLURM_JOB_ID"), dict(journal))


def serve(name: str, argv: Optional[Sequence[str]], body: Callable[[HookRun], Ending], *, doc: str = "",
          example: str = "", start: Optional[Callable[[Optional[Sequence[str]]], Union[HookRun, int]]] = None,
          deadline: Optional[Callable[[Any], float]] = None,
          on_watchdog: Optional[Callable[[HookRun, float, str], Ending]] = None,
          on_error: Optional[Callable[[HookRun, Exception], Ending]] = None) -> int:
    """The one hook skeleton (module docstring). ``doc``: a hook Slurm runs without arguments
    answers --help from it and refuses any other argument; ``deadline``: the whole-run watchdog's
    seconds, read from the run's config. Whatever escapes (a bug in a handler, a start that raises) is
    the tool being broken: one line, exit 0 (``run_hook``, whose short process it runs in too)."""
    if doc:
        asked = help_requested(name, argv, doc, example)
        if asked is not None:
            return asked
    return run_hook(name, lambda: _serve(name, argv, body, start, deadline, on_watchdog, on_error))


def _serve(name, argv, body, begin, deadline, on_watchdog, on_error) -> int:
    run = (begin or (lambda _: start(name)))(argv)
    if isinstance(run, int):
        return run
    if deadline is None:
        ending = body(run)
    else:
        from .watchdog import Watchdog, kill_children, whole_run

        limit = deadline(run.config)
        try:
            with whole_run(limit):
                ending = body(run)
        except Watchdog as fired:
            kill_children()
            ending = on_watchdog(run, limit, fired.where) if on_watchdog else Ending(0, {"result": "watchdog"})
        except Exception as exc:  # noqa: BLE001 - the tool being broken is never the node being broken
            if on_error is None:
                raise
            ending = on_error(run, exc)
    if ending.journal is not None:
        journal(run.config, run.hook, run.node, run.job_id, **{**run.journal, **ending.journal})
    return ending.exit


def run_hook(hook: str, body: Callable[[], int]) -> int:
    """Run a hook's body and return its exit status; whatever it raises is the tool being broken.

    Every hook's ``main`` goes through here: a bug, a config the hook cannot use (a path with a
    NUL byte, TOML nested past the parser's recursion limit), a missing driver function, memory
    running out: one line on stderr (slurmd logs it) and exit 0, so the node is not drained and
    the job not failed over it (fail open). Only ``SystemExit``, a hook deciding its own status,
    passes through.

    The body runs as one short process (``healthcheck.hooklib.nogc``: no cyclic garbage
    collection, the heap frozen at exit); the hooks' ``main`` enters that before its imports.
    """
    from .nogc import short_process

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
        print(f"usage: slurm-gpu-{hook} [-h]\n\n{admin_help(hook, '') if doc == ADMIN_HELP else doc.strip()}\n\noptions:\n  -h, --help  show this help and exit"
              f"\n\nExample:\n  {example}")
        return 0
    print(f"slurm-gpu-{hook}: takes no arguments (Slurm runs it; see --help), got {args[0]!r}", file=sys.stderr)
    return 2


# ``doc`` of a hook Slurm runs: its --help is the admin's text, healthcheck/data/help/<hook>.txt.
ADMIN_HELP = "@admin-help"


def admin_help(hook: str, fallback: str = "") -> str:
    """A hook's --help for admins (``healthcheck/data/help/<hook>.txt``): what runs it, what it
    does, its exit status, where it logs. Read only when a person asks for help."""
    from ..safeio import datafiles

    try:
        return datafiles.read_text("help", f"{hook}.txt").strip()
    except OSError:
        return fallback.strip()


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
    loaded = _load(None, env, cached=True)
    if isinstance(loaded, Config):
        if loaded.path is None and hook != "taskprolog":
            # No file at the default path and none named: the built-in defaults, draining included.
            # Said every run (slurmd's log), so a node that lost its config is seen. The TaskProlog
            # runs per task and exports nothing on defaults: it stays quiet.
            print(f"slurm-gpu-{hook}: no config file ({DEFAULT_CONFIG_PATH} is missing, "
                  "$SLURM_GPU_HOOKS_CONFIG unset): running on the built-in defaults, draining on", file=sys.stderr)
        return loaded
    kind, _, why = loaded.partition(": ")
    print(f"slurm-gpu-{hook}: config {kind}, doing nothing: {why}", file=sys.stderr)
    return None


def journal(config: Config, hook: str, node: str, job_id: Optional[str], **detail: Any) -> None:
    """Record that a hook ran; a journal that cannot be written is said once, never fatal."""
    from .runlog import record_run

    try:
        record_run(config.state_dir, hook, node, job_id, **detail)
    except (OSError, ValueError) as exc:     # ValueError: a node name unusable as a file name
        print(f"slurm-gpu-{hook}: cannot write the hook journal: {exc}", file=sys.stderr)
