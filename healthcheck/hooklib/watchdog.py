"""The whole-run watchdog every hook shares (prolog, epilog, health check).

Each step of a hook has its own limit (a probe's deadline, a Slurm command's timeout, the kernel
log's read budget); added up they can still pass what Slurm allows the whole hook (slurmd kills a
HealthCheckProgram at 60 s, a Prolog or Epilog at PrologEpilogTimeout, and then Slurm drains the
node with a bare "Prolog error"). This bounds the sum: SIGALRM at the hook's deadline raises
``Watchdog`` wherever the run is, the hook ends what it started (``kill_children``) and exits by
its own rule, never leaving a half-written file (writes are atomic) or a child behind.

Steps that must not be lost say when they are done (``note``): a hook that drained its node
before the watchdog fired still stops the job; an epilog's record written stays written.
Kept lean: on the prolog's import path.
"""
from __future__ import annotations

import contextlib
import os
import signal
from typing import Dict, Iterator, Set

# The time a run keeps for itself after its last command (its state saved, what it read
# committed, its outputs): a fifth of its deadline, at most this. Every command of the run is cut
# to the time left less this (``safeio/run_deadline.py``).
RESERVE_S = 5.0

_progress: Dict[str, str] = {}
_detached: Set[int] = set()


class Watchdog(BaseException):
    """The whole run took longer than its deadline.

    A BaseException: the ``except Exception`` that keeps one failed step (a post-decision
    output, a probe) from stopping the rest must not swallow the deadline too."""

    def __init__(self, where: str = ""):
        super().__init__(where)
        self.where = where


@contextlib.contextmanager
def whole_run(deadline_s: float) -> Iterator[None]:
    """Raise ``Watchdog`` in the body once ``deadline_s`` seconds have passed; forgets the
    progress of any earlier run in this process. Meanwhile no command the run starts
    (``safeio.programs``: scontrol, the GPU reset) is given more than the time left, less
    ``RESERVE_S`` (or a fifth of the deadline) for the run to save what it did
    (``safeio/run_deadline.py``). A probe's child, which runs before anything is applied, keeps
    its own deadline: the watchdog striking there loses nothing."""
    import time

    from ..safeio import run_deadline

    _progress.clear()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    run_deadline.set_deadline(time.monotonic() + deadline_s, min(RESERVE_S, deadline_s / 5))
    signal.setitimer(signal.ITIMER_REAL, deadline_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        run_deadline.set_deadline(None)


def _on_alarm(signum, frame) -> None:
    # Where the run was when time ran out: the one line names it (a probe, a Slurm command).
    where = ""
    if frame is not None:
        where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
    raise Watchdog(where)


def note(step: str, state: str) -> None:
    """Say that a step the hook must not lose has reached ``state`` (e.g. drain -> applying)."""
    _progress[step] = state


def progress() -> Dict[str, str]:
    """What this run said it got done (``note``), as a copy."""
    return dict(_progress)


def done_so_far(nothing: str) -> str:
    """``progress()`` as one phrase for the watchdog's line ("drain applied, record written"),
    or ``nothing`` when the run had noted nothing."""
    return ", ".join(f"{step} {state}" for step, state in sorted(_progress.items())) or nothing


def detached(pid: int) -> None:
    """``pid`` is meant to outlive this hook (the background delivery): never killed here."""
    _detached.add(pid)


def kill_children() -> None:
    """The watchdog fired: end what this run started (a probe child stuck on the driver, a
    Slurm command with its whole process group), so nothing of it outlives the run."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as handle:
                children = [int(pid) for pid in handle.read().split()]
        except (OSError, ValueError):
            continue
        for pid in children:
            if pid in _detached:
                continue
            try:
                if os.getpgid(pid) == pid:        # a command started in its own session (programs.run)
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
