"""The child side of a probe (``deadline.ChildProbe``): die with the parent, hold none of its
descriptors, and send each record as a frame (a 4-byte length, a pickle)."""
from __future__ import annotations

import os
import pickle
import signal
import struct
import threading
from typing import Any, Callable

Emit = Callable[[Any], None]

_HEADER = struct.Struct("!I")
_DONE = "__deadline_done__"
_FAILED = "__deadline_failed__"


PR_SET_PDEATHSIG = 1          # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:  # pragma: no cover - child only
    """The kernel SIGKILLs this child when its parent dies (slurmd's SIGTERM or SIGKILL of an
    overrunning hook, a crash), so a probe stuck in the driver never outlives the run. The
    signal fires when the *thread* that forked exits: fork from the thread that waits."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass                     # not Linux: the parent's deadline still kills the child
    if os.getppid() != parent:   # the parent died before prctl took effect
        os._exit(1)


def _serve(target: Callable[[Emit], None], write_fd: int) -> None:  # pragma: no cover - child only
    """Run ``target(emit)``, each record a frame on ``write_fd``, then leave (``os._exit``)."""
    status = 0
    try:
        lock = threading.Lock()

        def emit(record: Any) -> None:
            payload = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
            with lock:
                _write_all(write_fd, _HEADER.pack(len(payload)) + payload)

        try:
            target(emit)
            emit(_DONE)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as text
            status = 1
            try:
                emit((_FAILED, f"{type(exc).__name__}: {exc}"))
            except BaseException:  # noqa: BLE001
                pass
    finally:
        os._exit(status)


def _detach_stdio(keep_fd: int, *also: int) -> None:  # pragma: no cover - child only
    """A child stuck in the kernel must not hold the caller's stdout open (slurmd, a pipe
    reader waiting for EOF), nor any other descriptor the parent inherited (``keep_fd`` and
    ``also`` stay)."""
    keep = sorted({keep_fd, *also})
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd not in keep:
            os.dup2(devnull, fd)
    if devnull > 2 and devnull not in keep:
        os.close(devnull)
    low = 3
    for fd in keep:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:  # pragma: no cover - child only
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 65536)
    except (ValueError, OSError):
        return 4096


def _write_all(fd: int, data: bytes) -> None:  # pragma: no cover - child only
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
