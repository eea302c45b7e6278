"""A doorbell for a kernel-log file (rsyslog's kern.log, the lab's simulated log): the kernel says
when the file is written, truncated or replaced, so an idle watcher sleeps in ``poll`` instead of
a stat every ``[watch] poll_s`` (measured by bench/scale: 2 wake-ups a second per node with the
stat, against issue 30's target of at most 1).

Two watches: the file itself (written, truncated, attributes, moved or deleted) and its directory
for a new file of that name only (created, or moved in: a rotation), so another file's writes in
/var/log do not wake the watcher. Linux's inotify through libc (the standard library has no
binding); where it cannot be had (no libc symbol, out of watches), ``open_doorbell`` says None
and the watcher keeps its stat.
"""
from __future__ import annotations

import ctypes
import os
import select
import struct
from typing import Optional

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x002, 0x004, 0x008
IN_MOVED_TO, IN_CREATE, IN_DELETE_SELF, IN_MOVE_SELF = 0x080, 0x100, 0x400, 0x800
IN_ONLYDIR, IN_DONTFOLLOW = 0x01000000, 0x02000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, 0o2000000
FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
DIR_EVENTS = IN_CREATE | IN_MOVED_TO
_EVENT = struct.Struct("iIII")          # wd, mask, cookie, len (then len bytes of name)


class Doorbell:
    """``rang()`` after any change to ``path`` (or a new file by its name); ``wait(s)`` sleeps
    until one or ``s`` seconds. Never follows a link (the directory's nor the file's)."""

    def __init__(self, libc, path: str):
        self._libc, self.path = libc, path
        self.directory, self.name = os.path.split(os.path.abspath(path))
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        try:
            self._dir_wd = self._watch(self.directory, DIR_EVENTS | IN_ONLYDIR | IN_DONTFOLLOW)
            if self._dir_wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {self.directory}")
        except BaseException:
            os.close(self.fd)
            raise
        self._file_wd = -1
        self._watch_file()
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        self._rang = True               # look once at the start

    def _watch(self, path: str, mask: int) -> int:
        return self._libc.inotify_add_watch(self.fd, os.fsencode(path), ctypes.c_uint32(mask))

    def _watch_file(self) -> None:
        """Watch the file now at ``path`` (after a rotation, the new one); absent: the directory's
        watch says when it comes. A watch on the same inode is the same watch (inotify(7))."""
        old, self._file_wd = self._file_wd, self._watch(self.path, FILE_EVENTS | IN_DONTFOLLOW)
        if old >= 0 and old != self._file_wd:
            self._libc.inotify_rm_watch(self.fd, old)      # the rotated file's writes are not ours

    def _drain(self) -> None:
        renew = False
        for _ in range(1024):
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not data:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if wd == self._dir_wd and name == os.fsencode(self.name):
                    renew, self._rang = True, True
                elif wd == self._file_wd:
                    self._rang = True
                    renew = renew or bool(mask & (IN_DELETE_SELF | IN_MOVE_SELF))
        if renew:
            self._watch_file()

    def rang(self) -> bool:
        if self.poller.poll(0):
            self._drain()
        rang, self._rang = self._rang, False
        return rang

    def wait(self, timeout: float) -> None:
        if self.poller.poll(max(0, int(timeout * 1000))):
            self._drain()

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _libc():
    # The running program's own symbols, glibc's among them: no library search (find_library
    # would start ldconfig, a process a root daemon need not start).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def open_doorbell(path: str) -> Optional[Doorbell]:
    """A doorbell for ``path``, or None where inotify cannot be had (the caller stats instead)."""
    try:
        return Doorbell(_libc(), path)
    except (OSError, AttributeError):
        return None
