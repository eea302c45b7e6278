"""The one way this project runs another program: an argument list (never a shell), stdin from
/dev/null unless input is given, a deadline, and on the deadline the whole process group killed
(a child's children too: ``dcgmi`` and ``journalctl`` may start helpers). Errors are one line.

Kept tiny and cheap to import: the hooks' import path goes through it.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from ..plain import plain
from . import run_deadline
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

KILL_WAIT_S = 0.5          # after SIGKILL to the group, how long to wait for the child to be reaped
READ_CHUNK = 65536
ARG_SHOWN = 60             # an error shows at most this much of each argument
STDERR_KEEP = 8192         # stderr is for a one-line error; never hold more of it
# Where a program named without a directory is looked for, after PATH (a hook's PATH is slurmd's).
SEARCH_PATH = "/usr/bin:/usr/local/bin:/usr/sbin:/usr/local/sbin"


def _within(timeout_s: float) -> Tuple[float, str]:
    """The command's time limit and how an error says it was cut short."""
    limit = run_deadline.within(timeout_s)
    return limit, (" (the time left in the run)" if limit < timeout_s else "")


class CommandError(Exception):
    """A command could not be run, or did not finish in time; the message is one line."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


@plain
class Completed:
    argv: List[str]
    returncode: int
    stdout: str
    stderr: str

    def last_line(self) -> str:
        """The last non-empty line of stderr, else of stdout: what went wrong, in one line."""
        for stream in (self.stderr, self.stdout):
            lines = [line.strip() for line in (stream or "").splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return f"exit {self.returncode}"


def describe(argv: Sequence[str], words: int = 3) -> str:
    """How an error names a command, on one line: the program's base name and its first few
    arguments (each cut to ARG_SHOWN characters)."""
    shown = [os.path.basename(str(argv[0]))] + [str(a) for a in argv[1:1 + words]]
    shown = [" ".join(arg.split()) for arg in shown]
    return " ".join(arg if len(arg) <= ARG_SHOWN else arg[:ARG_SHOWN - 3] + "..." for arg in shown)


def _start(argv: Sequence[str], env: Optional[Mapping[str, str]], cwd: Optional[str],
           with_input: bool) -> subprocess.Popen:
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.PIPE if with_input else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env) if env is not None else None, cwd=cwd,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        raise CommandError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group; reap it, or leave a thread to reap it later."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        # A child stuck in the kernel (D state) cannot die yet; do not wait for it.
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()


def run(argv: Sequence[str], timeout_s: float, *, env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None, input: Optional[str] = None) -> Completed:
    """Run ``argv`` to completion within ``timeout_s``; its exit status is the caller's to judge.
    Raises CommandError (``timed_out`` set) when it could not start or ran past the deadline."""
    timeout_s, cut = _within(timeout_s)
    proc = _start(argv, env, cwd, input is not None)
    try:
        out, err = proc.communicate(input=input.encode() if input is not None else None, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        _close(proc)
        raise CommandError(f"{describe(argv)}: no answer within {timeout_s:g} s{cut}", timed_out=True) from None
    return Completed(list(argv), proc.returncode, out.decode("utf-8", "replace"),
                     err.decode("utf-8", "replace"))


def stream(argv: Sequence[str], timeout_s: float, on_stdout: Callable[[bytes], None], *,
           env: Optional[Mapping[str, str]] = None) -> Tuple[int, bytes]:
    """Run ``argv``, handing its stdout to ``on_stdout`` chunk by chunk (nothing is held in
    memory); returns (exit status, the first STDERR_KEEP bytes of stderr). The deadline covers
    the whole run; past it the process group is killed and CommandError raised."""
    timeout_s, cut = _within(timeout_s)
    proc = _start(argv, env, None, False)
    deadline = time.monotonic() + timeout_s
    errors = bytearray()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            open_streams = 2
            while open_streams:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandError(f"{describe(argv, 0)} did not finish within {timeout_s:g} s{cut}", timed_out=True)
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fileobj.fileno(), READ_CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        open_streams -= 1
                    elif key.fileobj is proc.stdout:
                        on_stdout(chunk)
                    elif len(errors) < STDERR_KEEP:
                        errors += chunk[:STDERR_KEEP - len(errors)]
        try:
            returncode = proc.wait(max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise CommandError(f"{describe(argv, 0)} did not exit within {timeout_s:g} s{cut}", timed_out=True) from None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        _close(proc)
    return returncode, bytes(errors)


def _close(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


def find_program(configured: str, programs_dir: Optional[str] = None) -> Optional[str]:
    """The program's path; ``programs_dir`` (the simulator's stand-ins) is the only place looked
    at when given."""
    if programs_dir is not None:
        path = os.path.join(programs_dir, os.path.basename(configured))
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    if os.sep in configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else None
    import shutil   # only here: shutil stays off the hooks' import path (docs/performance.md)

    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), SEARCH_PATH) if p)
    return shutil.which(configured, path=search)
