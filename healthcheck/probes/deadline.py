"""Run a probe in a forked child under a deadline enforced from outside the call.

A driver call on a lost GPU can block in uninterruptible sleep; no timeout inside the
calling process can end it. So the probe runs in a child that streams what it learns
through a pipe (one record at a time, so whatever finished before a hang is kept), and the
parent stops listening at the deadline, SIGKILLs the child and never waits on it for more
than a short, bounded time: a child stuck in the kernel is left to a reaper thread.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
from ..plain import field, plain
from .child import _DONE, _FAILED, _HEADER, _detach_stdio, _die_with_parent, _serve
from typing import Any, Callable, List, Optional, Tuple, Union

Emit = Callable[[Any], None]

# After SIGKILL, how long the parent polls for the child's exit before handing it to a
# reaper thread. A killable child is gone in microseconds; one in D state may never be.
REAP_WAIT_S = 0.2


@plain
class Outcome:
    records: List[Any] = field(default_factory=list)
    finished: bool = False          # the target returned normally
    timed_out: bool = False
    error: Optional[str] = None     # the target raised, or the child died without a word
    elapsed_s: float = 0.0


class ChildProbe:
    """``target(emit)`` in a forked child; ``wait()`` returns what it emitted by the deadline.

    Start several, then wait on each: the deadlines run concurrently.
    """

    def __init__(self, target: Callable[[Emit], None], timeout_s: float):
        self.target = target
        self.timeout_s = float(timeout_s)
        self.pid: Optional[int] = None
        self._read_fd: Optional[int] = None
        self._started = 0.0
        self._outcome: Optional[Outcome] = None

    def start(self) -> "ChildProbe":
        reap_answered()
        self._started = time.monotonic()
        forked = _fork_with_pipe()
        if isinstance(forked, str):
            self._outcome = Outcome(error=forked)
            return self
        pid, read_fd, write_fd = forked
        if pid == 0:  # pragma: no cover - runs in the child, which leaves through os._exit
            _child_main(self.target, read_fd, write_fd)
        os.close(write_fd)
        self.pid, self._read_fd = pid, read_fd
        return self

    @property
    def started(self) -> float:
        """When the deadline began (``time.monotonic()``), the zero of the child's time stamps."""
        return self._started

    def wait(self) -> Outcome:
        if self.pid is None and self._outcome is None:
            self.start()
        if self._outcome is not None:
            return self._outcome
        outcome = Outcome()
        deadline = self._started + self.timeout_s
        buffer = bytearray()
        eof = False
        try:
            while True:
                # Past the deadline, still take what is already in the pipe: a caller that
                # waited on another probe first must not lose this one's answer.
                remaining = max(deadline - time.monotonic(), 0.0)
                ready, _, _ = select.select([self._read_fd], [], [], remaining)
                if not ready:
                    if remaining <= 0:
                        break
                    continue
                chunk = os.read(self._read_fd, 1 << 16)
                if not chunk:
                    eof = True
                    break
                buffer.extend(chunk)
                _drain_frames(buffer, outcome)
                if outcome.finished or outcome.error:
                    break
        finally:
            os.close(self._read_fd)
        if not (outcome.finished or outcome.error):
            if eof:
                outcome.error = "the probe process exited without an answer"
            else:
                outcome.timed_out = True
        if outcome.timed_out:
            _end_child(self.pid, deadline)
        else:
            _reap_later(self.pid, deadline)
        outcome.elapsed_s = time.monotonic() - self._started
        self._outcome = outcome
        return outcome


def run_with_deadline(target: Callable[[Emit], None], timeout_s: float) -> Outcome:
    return ChildProbe(target, timeout_s).start().wait()


def call_with_deadline(function: Callable[[], Any], timeout_s: float) -> Outcome:
    """``function()`` in a child; its return value is the outcome's only record."""
    return run_with_deadline(lambda emit: emit(function()), timeout_s)


@plain
class RawOutcome:
    data: bytes = b""
    complete: bool = False          # the child closed its end (finished or died) by the deadline
    timed_out: bool = False
    overflow: bool = False          # the child sent more than max_bytes; the rest was not read
    error: Optional[str] = None     # the child could not be started
    elapsed_s: float = 0.0


def run_raw_with_deadline(target: Callable[[int], None], timeout_s: float, max_bytes: int) -> RawOutcome:
    """``target(fd)`` in a forked child that writes plain bytes to ``fd``; the parent takes at most
    ``max_bytes`` of them by the deadline, then kills the child as ``ChildProbe`` does.

    For a child that gives up privileges (a reader running as a job's user): what such a child
    sends is never unpickled, only parsed by the caller as data."""
    started = time.monotonic()
    deadline = started + float(timeout_s)
    forked = _fork_with_pipe()
    if isinstance(forked, str):
        return RawOutcome(error=forked)
    pid, read_fd, write_fd = forked
    if pid == 0:  # pragma: no cover - runs in the child, which leaves through os._exit
        status = 0
        try:
            os.close(read_fd)
            _detach_stdio(write_fd)
            target(write_fd)
        except BaseException:  # noqa: BLE001 - the parent sees an answer cut short
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    outcome = RawOutcome()
    buffer = bytearray()
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome.timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                outcome.complete = True
                break
            buffer.extend(chunk)
            if len(buffer) > max_bytes:
                outcome.overflow = True
                del buffer[max_bytes:]
                break
    finally:
        os.close(read_fd)
    _end_child(pid, deadline if outcome.complete else time.monotonic())
    outcome.data = bytes(buffer)
    outcome.elapsed_s = time.monotonic() - started
    return outcome


def _fork_with_pipe() -> Union[Tuple[int, int, int], str]:
    """``(pid, read_fd, write_fd)`` on both sides of a fork (pid 0 in the child, which dies with
    its parent), or why no child could be started."""
    try:
        read_fd, write_fd = os.pipe()
    except OSError as exc:
        return f"cannot start the probe process: {exc.strerror or exc}"
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        return f"cannot start the probe process: {exc.strerror or exc}"
    if pid == 0:  # pragma: no cover - child only
        _die_with_parent(parent)
    return pid, read_fd, write_fd


# -- child side: probes/child.py ----------------------------------------------------------------
def _child_main(target: Callable[[Emit], None], read_fd: int, write_fd: int) -> None:  # pragma: no cover
    try:
        os.close(read_fd)
        _detach_stdio(write_fd)
    except BaseException:  # noqa: BLE001
        os._exit(1)
    _serve(target, write_fd)



# -- parent side -----------------------------------------------------------------------------
def _drain_frames(buffer: bytearray, outcome: Outcome) -> None:
    while len(buffer) >= _HEADER.size:
        (length,) = _HEADER.unpack_from(buffer)
        if len(buffer) < _HEADER.size + length:
            return
        payload = bytes(buffer[_HEADER.size:_HEADER.size + length])
        del buffer[:_HEADER.size + length]
        # The payload comes from our own forked child, which runs our code with our privileges.
        record = pickle.loads(payload)
        if record == _DONE:
            outcome.finished = True
        elif isinstance(record, tuple) and len(record) == 2 and record[0] == _FAILED:
            outcome.error = record[1]
        else:
            outcome.records.append(record)


# Children that answered (or closed their pipe) and are on their way out: (pid, deadline).
_ANSWERED: List[Tuple[int, float]] = []


def _reap_later(pid: int, deadline: float) -> None:
    """A child that answered is leaving (``os._exit`` after its last record): the caller does
    not wait for its exit (a process's teardown, 1-2 ms here). It is reaped at the next probe's
    start, or killed then if it is still there past its deadline; it dies with its parent
    (PDEATHSIG) in any case."""
    if not _reaped(pid):
        _ANSWERED.append((pid, deadline))


def reap_answered() -> None:
    """Reap the children that answered; one still there past its deadline is ended as a child
    that overran is (SIGKILL, a bounded wait, then a reaper thread)."""
    now = time.monotonic()
    left = []
    for pid, deadline in _ANSWERED:
        if _reaped(pid):
            continue
        if now >= deadline:
            _end_child(pid, now)
        else:
            left.append((pid, deadline))
    _ANSWERED[:] = left


def _end_child(pid: int, deadline: float) -> None:
    """Reap the child if it is gone (or goes by the deadline); else kill it and move on."""
    # A child that has answered is gone within a millisecond or two: poll often at first,
    # then every 5 ms (a fixed 5 ms sleep cost every hook run 5 ms per probe).
    pause = 0.0002
    while True:
        if _reaped(pid):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, 0.005)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    give_up = time.monotonic() + REAP_WAIT_S
    while time.monotonic() < give_up:
        if _reaped(pid):
            return
        time.sleep(0.005)
    # Still there: blocked in the kernel. Do not wait; reap it whenever the kernel lets go.
    threading.Thread(target=_blocking_reap, args=(pid,), name=f"reap-{pid}", daemon=True).start()


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _blocking_reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
