"""Careful file writes for code that runs as root: no following links, restrictive modes, atomic."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from typing import Any, Dict, Iterator, Optional, Union

DIR_MODE = 0o750
FILE_MODE = 0o640
MAX_STATE_BYTES = 16 * 1024 * 1024


def path_component(name: str) -> str:
    """``name`` (a node, a cursor's reader) made safe to use as one file or directory name."""
    if not name or "/" in name or "\0" in name or name.startswith(".") or len(name) > 255:
        raise ValueError(f"{name!r} is not a node name usable as a file name")
    return name


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


def read_state_json(path: str) -> Optional[Dict[str, Any]]:
    """A JSON object from a state file, or None when absent, a link, not ours, too big or not
    JSON: a torn or foreign file means starting afresh, never failing the hook."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not _is_ours(info) or info.st_size > MAX_STATE_BYTES:
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        data = json.loads(b"".join(chunks).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _is_ours(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o002
