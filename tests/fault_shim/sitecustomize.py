"""Faults at the OS edge, for tests that run a hook as a real process (tests/test_hooks_under_faults.py).

Python imports ``sitecustomize`` at start-up from PYTHONPATH; this one does nothing unless
``SGH_TEST_FAULTS`` holds a JSON object, and then wraps a few ``os`` functions:

* ``"enospc": [dir, ...]``: every ``os.write`` to a file under one of the dirs fails with ENOSPC
  (a full disk: creating a file still works, writing to it does not).
* ``"erofs": [dir, ...]``: creating, writing, renaming, removing or chmod-ing anything under the
  dirs fails with EROFS (a read-only mount; reading still works).
* ``"except": [dir, ...]``: paths under these dirs are spared (the simulated hardware, which on a
  real node is not in the state dir).
* ``"eacces": [path, ...]``: opening these files fails with EACCES (root is not refused by file
  modes, so a mode cannot make this happen).
* ``"rotate": {"path": p, "new": text}``: right after the first read of ``p`` has started (the
  hook holds it open), ``p`` is renamed to ``p.1`` and a new ``p`` holding ``new`` takes its place,
  as logrotate does.

Only what a test names is touched; everything else runs unchanged.
"""
import errno
import json
import os

_SPEC = os.environ.get("SGH_TEST_FAULTS")


def _install(spec):
    real = {name: getattr(os, name) for name in ("open", "write", "mkdir", "replace", "rename", "unlink",
                                                  "chmod", "preadv", "pread", "rmdir")}
    enospc = [os.path.abspath(p) for p in spec.get("enospc", [])]
    erofs = [os.path.abspath(p) for p in spec.get("erofs", [])]
    spared = [os.path.abspath(p) for p in spec.get("except", [])]
    eacces = {os.path.abspath(p) for p in spec.get("eacces", [])}
    rotate = spec.get("rotate")
    rotated = []

    def under(path, dirs):
        try:
            path = os.path.abspath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        if any(path == d or path.startswith(d + os.sep) for d in spared):
            return False
        return any(path == d or path.startswith(d + os.sep) for d in dirs)

    def fd_path(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def fail(code, path):
        raise OSError(code, os.strerror(code), os.fsdecode(path))

    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def open_(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is None and os.path.abspath(os.fsdecode(path)) in eacces:
            fail(errno.EACCES, path)
        if dir_fd is None and flags & writing and under(path, erofs):
            fail(errno.EROFS, path)
        return real["open"](path, flags, mode, dir_fd=dir_fd)

    def write(fd, data):
        if enospc and under(fd_path(fd), enospc):
            fail(errno.ENOSPC, fd_path(fd))
        return real["write"](fd, data)

    def guarded(name, *positions):
        def call(*args, **kwargs):
            for at in positions:
                if at < len(args) and under(args[at], erofs):
                    fail(errno.EROFS, args[at])
            return real[name](*args, **kwargs)
        return call

    def rotating(name):
        def call(fd, *args):
            got = real[name](fd, *args)
            if rotate and not rotated and fd_path(fd) == os.path.realpath(rotate["path"]):
                rotated.append(True)
                path = rotate["path"]
                real["rename"](path, path + ".1")
                handle = real["open"](path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
                real["write"](handle, rotate["new"].encode())
                os.close(handle)
            return got
        return call

    os.open = open_
    os.write = write
    os.mkdir = guarded("mkdir", 0)
    os.replace = guarded("replace", 0, 1)
    os.rename = guarded("rename", 0, 1)
    os.unlink = guarded("unlink", 0)
    os.rmdir = guarded("rmdir", 0)
    os.chmod = guarded("chmod", 0)
    if rotate:
        os.preadv = rotating("preadv")
        os.pread = rotating("pread")


if _SPEC:
    _install(json.loads(_SPEC))
