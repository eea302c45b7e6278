"""Careful file writes for code that runs as root: no following links, restrictive modes, atomic."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import sys
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

DIR_MODE = 0o750
FILE_MODE = 0o640
MAX_STATE_BYTES = 16 * 1024 * 1024
CORRUPT_SUFFIX = ".corrupt"      # where a state file that does not match its schema is kept


MAX_NAME_BYTES = 255


def name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot be one file or directory name under a directory we own, or None.

    The one safe-name rule for every name that becomes a path component (node names, simulated
    HCAs and their counter files, cursor readers): a single component, so never ``..``, never
    absolute, never hidden (our own lock and temp files start with a dot), no control
    characters (a name also ends up in logs), at most 255 bytes.
    """
    if not isinstance(name, str) or not name:
        return "is empty" if isinstance(name, str) else f"is {type(name).__name__}, not a string"
    if "/" in name:
        return "holds a '/'"
    if name.startswith("."):
        return "starts with '.'"
    if any(ord(char) < 0x20 or ord(char) == 0x7f for char in name):
        return "holds a control character"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def path_component(name: str) -> str:
    """``name`` checked by ``name_problem``; ValueError (one line) when it is not safe."""
    problem = name_problem(name)
    if problem:
        shown = name if not isinstance(name, str) or len(name) <= 80 else name[:77] + "..."
        raise ValueError(f"{shown!r} is not usable as a file name: it {problem}")
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


def read_state_json(path: str, problem_of: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None
                    ) -> Optional[Dict[str, Any]]:
    """A state file's JSON object, or None: the caller starts afresh, never fails the hook.

    None when the file is absent or not ours (a link, another owner, world-writable, not a
    regular file): left alone. A file of ours that is too big, not JSON (NaN and Infinity
    included), not an object, or in which ``problem_of`` finds a problem (its schema) is set
    aside as ``<path>.corrupt`` for the admin, said once on stderr, and None is returned so
    that the caller rebuilds it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not _is_ours(info):
            return None
        if info.st_size > MAX_STATE_BYTES:
            problem: Optional[str] = f"larger than {MAX_STATE_BYTES} bytes"
        else:
            data, problem = _parse_json(_read_all(fd))
    except OSError:
        return None
    finally:
        os.close(fd)
    if problem is None and not isinstance(data, dict):
        problem = f"a JSON {type(data).__name__}, not an object"
    if problem is None and problem_of is not None:
        problem = problem_of(data)
    if problem is not None:
        set_aside(path, problem)
        return None
    return data


def set_aside(path: str, problem: str) -> str:
    """Move a corrupt state file to ``<path>.corrupt`` (replacing an older one) and say so once."""
    aside = path + CORRUPT_SUFFIX
    try:
        os.replace(path, aside)
        done = f"moved to {aside}"
    except OSError as exc:
        done = f"could not be moved aside ({exc.strerror or exc})"
    print(f"slurm-gpu-hooks: state file {path} is unusable ({_one_line(problem)}); {done}; starting afresh",
          file=sys.stderr)
    return aside


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state file holds")


def _parse_json(raw: bytes) -> Tuple[Any, Optional[str]]:
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant), None
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON: {exc}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:200]


def _is_ours(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o002
