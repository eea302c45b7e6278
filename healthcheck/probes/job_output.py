"""Read the tail of a job's own output files (StdOut/StdErr) as the job's user, never as root.

The epilog runs as root and the paths come from the job, i.e. from its user: a user can point
the output at a symbolic link to ``/etc/shadow``, swap a directory on the path for a link to a
root-only one, or leave a FIFO there. So the files are opened only in a forked child that first
becomes the job's user and proves it cannot become root again:

* ``prctl(PR_SET_DUMPABLE, 0)``: the user cannot ptrace the child or open its descriptors
  through /proc (the pipe to the root parent); ``setgroups([])``, ``setresgid``, ``setresuid``
  to the job's uid/gid; then ``setuid(0)`` must fail and the effective and permitted capability
  sets (``/proc/self/status``) must be empty, or the child reads nothing. A job of uid or gid 0
  is not read at all (no privilege could be dropped).
* ``open(O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)``: a link as the last component is
  refused (ELOOP), a FIFO does not block the open, and ``fstat`` then refuses anything but a
  regular file. Links earlier on the path are followed with the user's rights only.
* Only the last ``max_bytes`` of each file are read (``pread`` from ``size - max_bytes``).
* The parent enforces the deadline from outside (``deadline.run_raw_with_deadline``: a file on a
  hung NFS server blocks the child, not the epilog) and takes at most the bytes it asked for. The
  child's answer is parsed as JSON headers plus raw bytes, never unpickled.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .deadline import run_raw_with_deadline

_FRAME = struct.Struct("!II")          # header length, data length
_HEADER_MAX = 4096
_DONE = "done"
PR_SET_DUMPABLE = 4                     # <linux/prctl.h>
PR_SET_PDEATHSIG = 1


class PrivilegeError(Exception):
    """The child could not become the job's user, or could become root again."""


@dataclass
class Tail:
    path: str
    data: bytes = b""
    size: int = 0                       # the file's size when it was read
    truncated: bool = False             # the file holds more than the tail read
    error: Optional[str] = None         # why nothing was read ("symbolic link, not followed", ...)

    def summary(self) -> dict:
        """What the record keeps about this read (not the data)."""
        out = {"path": self.path, "size": self.size, "read": len(self.data)}
        if self.error:
            out["error"] = self.error
        return out


# -- child side --------------------------------------------------------------------------------

def _prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise PrivilegeError(f"prctl({option}) failed: {os.strerror(ctypes.get_errno())}")


def _capabilities() -> Tuple[int, int]:
    """(CapEff, CapPrm) of this process, from /proc/self/status."""
    effective = permitted = None
    # Binary: as the job's user, a text codec the parent never loaded may not be importable.
    with open("/proc/self/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"CapEff:"):
                effective = int(line.split()[1], 16)
            elif line.startswith(b"CapPrm:"):
                permitted = int(line.split()[1], 16)
    if effective is None or permitted is None:
        raise PrivilegeError("no CapEff/CapPrm in /proc/self/status")
    return effective, permitted


def drop_privileges(uid: int, gid: int) -> None:
    """Become ``uid``:``gid`` with no supplementary groups, for good; raises PrivilegeError
    unless it is verified that root cannot be regained."""
    if uid <= 0 or gid <= 0:
        raise PrivilegeError(f"uid {uid} gid {gid}: the job's files are read only as an unprivileged user")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # The kernel resets "dumpable" to fs.suid_dumpable when the credentials change: set it after.
    _prctl(PR_SET_DUMPABLE, 0)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups() not in ([], [gid]):
        raise PrivilegeError("the credentials did not change as asked")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise PrivilegeError("could become root again")
    try:
        effective, permitted = _capabilities()
    except OSError as exc:
        raise PrivilegeError(f"cannot verify the capabilities: {exc.strerror or exc}") from None
    if effective or permitted:
        raise PrivilegeError(f"capabilities left: CapEff {effective:x} CapPrm {permitted:x}")


def read_tail(path: str, max_bytes: int) -> Tail:
    """The last ``max_bytes`` of the regular file ``path`` (as whoever calls it); never raises."""
    tail = Tail(path)
    if not os.path.isabs(path):
        tail.error = "not an absolute path"
        return tail
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        tail.error = "symbolic link, not followed" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        return tail
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            tail.error = "not a regular file"
            return tail
        tail.size = info.st_size
        start = max(0, info.st_size - max_bytes)
        tail.truncated = start > 0
        chunks = []
        offset, left = start, info.st_size - start
        while left > 0:
            chunk = os.pread(fd, min(left, 1 << 16), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            left -= len(chunk)
        tail.data = b"".join(chunks)
    except OSError as exc:
        tail.error = exc.strerror or str(exc)
    finally:
        os.close(fd)
    return tail


def _frame(fd: int, header: dict, data: bytes = b"") -> None:
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = _FRAME.pack(len(head), len(data)) + head + data
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def _child(fd: int, paths: Sequence[str], uid: int, gid: int, max_bytes: int) -> None:  # pragma: no cover - child
    try:
        import ctypes  # noqa: F401 - loaded while still root: nothing is imported as the user

        drop_privileges(uid, gid)
        # Changing credentials cleared the parent-death signal: arm it again.
        _prctl(PR_SET_PDEATHSIG, 9)
        os.chdir("/")
    except (PrivilegeError, OSError) as exc:
        _frame(fd, {"problem": f"not read: {exc}"})
        return
    for path in paths:
        tail = read_tail(path, max_bytes)
        _frame(fd, {"path": tail.path, "size": tail.size, "truncated": tail.truncated, "error": tail.error},
               tail.data)
    _frame(fd, {"problem": None, _DONE: True})


# -- parent side -------------------------------------------------------------------------------

def parse_frames(data: bytes, paths: Sequence[str], max_bytes: int) -> Tuple[List[Tail], Optional[str], bool]:
    """(tails, the child's problem, whether its answer was complete) from what it sent. A frame
    that does not fit what was asked (a path not asked for, more data than max_bytes) ends it."""
    tails: List[Tail] = []
    problem: Optional[str] = None
    position = 0
    while position + _FRAME.size <= len(data):
        head_len, data_len = _FRAME.unpack_from(data, position)
        if head_len > _HEADER_MAX or data_len > max_bytes:
            return tails, "the reader's answer is malformed", False
        start = position + _FRAME.size
        end = start + head_len + data_len
        if end > len(data):
            break
        try:
            header = json.loads(data[start:start + head_len].decode("utf-8"))
        except ValueError:
            return tails, "the reader's answer is malformed", False
        position = end
        if not isinstance(header, dict):
            return tails, "the reader's answer is malformed", False
        if "path" not in header:
            problem = header.get("problem") if isinstance(header.get("problem"), str) else None
            return tails, problem, bool(header.get(_DONE)) or problem is not None
        if header["path"] not in paths or len(tails) >= len(paths):
            return tails, "the reader's answer is malformed", False
        error = header.get("error")
        tails.append(Tail(path=header["path"], data=data[start + head_len:end],
                          size=int(header.get("size") or 0), truncated=bool(header.get("truncated")),
                          error=error if isinstance(error, str) else None))
    return tails, problem, False


def read_tails_as(paths: Sequence[str], uid: int, gid: int, max_bytes: int,
                  timeout_s: float) -> Tuple[List[Tail], Optional[str]]:
    """The tails of ``paths`` read as ``uid``:``gid`` in a child under ``timeout_s``; and the
    problem that kept some or all of them from being read (None when all were tried)."""
    paths = list(dict.fromkeys(p for p in paths if p))
    if not paths:
        return [], None
    budget = len(paths) * (max_bytes + _FRAME.size + _HEADER_MAX) + _FRAME.size + _HEADER_MAX
    outcome = run_raw_with_deadline(lambda fd: _child(fd, paths, uid, gid, max_bytes), timeout_s, budget)
    if outcome.error:
        return [], outcome.error
    tails, problem, complete = parse_frames(outcome.data, paths, max_bytes)
    if problem:
        return tails, problem
    if not complete:
        if outcome.timed_out:
            return tails, f"the reader did not finish within {timeout_s:g} s"
        return tails, "the reader exited without an answer"
    return tails, None
