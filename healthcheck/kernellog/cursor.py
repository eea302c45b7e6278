"""Where the last run stopped reading, and the flood state, kept in the state dir.

Layout: ``<state_dir>/kernellog/<node>/`` (mode 0750) holding

* ``cursor-<kind>-<hash>.json`` one per source; ``kind`` is file | kmsg | journal:
    file     {"path", "dev", "ino", "offset", "tail_sha256"}: the byte after the last complete
             line read, and a hash of the 64 bytes before it (a rewritten file fails to match)
    kmsg     {"boot_id", "seq"}: the last /dev/kmsg sequence number read in this boot
    journal  {"cursor"}: journalctl's own cursor
* ``flood.json``  open events and escalation burst times (``flood.FloodTracker.state``)
* ``.lock``       held while a run reads and writes the above

Files are written with ``fsutil.atomic_write`` (mode 0640) and read with ``O_NOFOLLOW``; a file
that is not ours (another owner, a link, unreadable JSON) counts as absent, which leads to a
bounded rescan rather than trusting it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from typing import Any, Dict, Iterator, Optional

from ..fsutil import atomic_write, ensure_dir, locked

MAX_STATE_BYTES = 16 * 1024 * 1024


def _check_node(node: str) -> str:
    if not node or "/" in node or "\0" in node or node.startswith(".") or len(node) > 255:
        raise ValueError(f"{node!r} is not a node name")
    return node


class StateStore:
    def __init__(self, state_dir: str, node: str):
        self.dir = os.path.join(state_dir, "kernellog", _check_node(node))

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        ensure_dir(os.path.dirname(self.dir))      # makedirs gives only the leaf the mode
        ensure_dir(self.dir)
        with locked(os.path.join(self.dir, ".lock")):
            yield

    def cursor_path(self, kind: str, source: str) -> str:
        digest = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(self.dir, f"cursor-{kind}-{digest}.json")

    def load_cursor(self, kind: str, source: str) -> Optional[Dict[str, Any]]:
        data = read_json(self.cursor_path(kind, source))
        if data is None or data.get("source") != source:
            return None
        return data

    def save_cursor(self, kind: str, source: str, cursor: Dict[str, Any]) -> None:
        atomic_write(self.cursor_path(kind, source), json.dumps(dict(cursor, source=source), sort_keys=True))

    def load_flood(self) -> Dict[str, Any]:
        return read_json(os.path.join(self.dir, "flood.json")) or {}

    def save_flood(self, state: Dict[str, Any]) -> None:
        atomic_write(os.path.join(self.dir, "flood.json"), json.dumps(state, sort_keys=True))


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """A JSON object from a state file, or None when absent, a link, not ours or not JSON."""
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


def tail_hash(fd: int, offset: int) -> str:
    """A hash of the 64 bytes before ``offset``: the same file still holds what we read."""
    start = max(0, offset - 64)
    return hashlib.sha256(os.pread(fd, offset - start, start)).hexdigest()


def boot_id() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None
