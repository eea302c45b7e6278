"""A probe child forked at a hook's very start, which imports the NVML binding while the hook
loads its own code and then runs the one probe the hook hands it.

Importing pynvml is the floor's whole cost (``docs/performance.md``). The NVML probe runs in a
forked child anyway (``deadline.ChildProbe``: a driver call can hang); forked first thing in a
hook's ``main``, that child pays the import while the hook reads its config and loads its
checks, so the probe's answer no longer waits for it. The child is every other probe's child:
it dies with its parent (PR_SET_PDEATHSIG), holds none of the hook's descriptors, and is
killed at the probe's deadline, which runs from the moment the probe is handed over. It learns
what to run from a pipe (a module, a function and its arguments, pickled: our own process
talking to its own fork) and answers on another with ``ChildProbe``'s frames.

A hook that ends without handing it a probe closes its pipe: the child exits. Imports only
``os`` before the fork.
"""
from __future__ import annotations

import os

# The stand-by children of this process: [pid, command fd, result fd], at most one; and the
# pids of those told to go, for ``deadline.reap_answered``.
_READY: list = []
LEAVING: list = []


class standby:
    """``with standby(preload): ...``: a stand-by child that imports the modules ``preload``
    names, for the body's first ``ChildProbe`` with a remote target; gone when the body ends."""

    def __init__(self, preload=("pynvml", "healthcheck.probes.nvml", "healthcheck.sources")):
        self.preload = tuple(preload)

    def __enter__(self) -> "standby":
        if not _READY:
            _fork(self.preload)
        return self

    def __exit__(self, *exc) -> None:
        release()


def take():
    """(pid, command fd, result fd) of the stand-by child, once; None when there is none."""
    return _READY.pop() if _READY else None


def release() -> None:
    """An unused stand-by child is told to go (its command pipe closes) and reaped later."""
    while _READY:
        pid, command_fd, result_fd = _READY.pop()
        for fd in (command_fd, result_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        LEAVING.append(pid)              # deadline.reap_answered reaps it (or kills it, a second on)


def _fork(preload) -> None:
    try:
        command_r, command_w = os.pipe()
    except OSError:
        return
    try:
        result_r, result_w = os.pipe()
    except OSError:
        os.close(command_r)
        os.close(command_w)
        return
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        for fd in (command_r, command_w, result_r, result_w):
            os.close(fd)
        return
    if pid == 0:  # pragma: no cover - the child, which leaves through os._exit
        _child(parent, preload, command_r, command_w, result_r, result_w)
    os.close(command_r)
    os.close(result_w)
    _READY.append([pid, command_w, result_r])


def _child(parent: int, preload, command_r: int, command_w: int, result_r: int,
           result_w: int) -> None:  # pragma: no cover - child only
    try:
        os.close(command_w)
        os.close(result_r)
        from . import child

        child._die_with_parent(parent)
        child._detach_stdio(result_w, command_r)
        import importlib

        for name in preload:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - the probe's own import says what is wrong
                pass
        message = _read_exactly(command_r, 4)
        size = int.from_bytes(message, "big") if len(message) == 4 else 0
        message = _read_exactly(command_r, size) if size else b""
        os.close(command_r)
        if not size or len(message) != size:
            os._exit(0)                  # the hook needed no probe (its end of the pipe closed)
        import pickle

        module, function, args = pickle.loads(message)
        target = getattr(importlib.import_module(module), function)
    except BaseException:  # noqa: BLE001
        os._exit(1)
    child._serve(lambda emit: target(*args, emit), result_w)


def _read_exactly(fd: int, size: int) -> bytes:  # pragma: no cover - child only
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def send(command_fd: int, module: str, function: str, args: tuple) -> bool:
    """Hand the stand-by child its probe: ``module.function(*args, emit)``. False when the
    child cannot take it (gone already): the caller forks a probe child of its own."""
    import pickle

    payload = pickle.dumps((module, function, args), protocol=pickle.HIGHEST_PROTOCOL)
    data = len(payload).to_bytes(4, "big") + payload
    try:
        while data:
            data = data[os.write(command_fd, data):]
        return True
    except OSError:
        return False
    finally:
        os.close(command_fd)
