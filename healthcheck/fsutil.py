"""Careful file writes for code that runs as root: no following links, restrictive modes, atomic."""
from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator, Union

DIR_MODE = 0o750
FILE_MODE = 0o640


def ensure_dir(path: str, mode: int = DIR_MODE) -> str:
    """Create ``path`` (and parents) if missing; refuse a symlink in its place."""
    os.makedirs(path, mode=mode, exist_ok=True)
    if os.path.islink(path):
        raise OSError(f"{path} is a symbolic link; refusing to use it")
    return path


def atomic_write(path: str, data: Union[str, bytes], mode: int = FILE_MODE) -> None:
    """Write a whole file so readers see the old or the new content, never a mix."""
    directory = os.path.dirname(os.path.abspath(path))
    ensure_dir(directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def append_line(path: str, line: str, mode: int = FILE_MODE) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing) for read-modify-write."""
    ensure_dir(os.path.dirname(os.path.abspath(path)))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
