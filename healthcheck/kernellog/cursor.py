"""Where the last run stopped reading, and the flood state, kept in the state dir.

Layout: ``<state_dir>/kernellog/<reader>/`` (mode 0750; the runner's readers are
``<node>.<tier>`` and ``<node>.cli.<tier>``) holding

* ``cursor-<kind>-<hash>.json`` one per source; ``kind`` is file | kmsg | journal:
    file     {"path", "dev", "ino", "offset", "tail_sha256"}: the byte after the last complete
             line read, and a hash of the 64 bytes before it (a rewritten file fails to match)
    kmsg     {"boot_id", "seq"}: the last /dev/kmsg sequence number read in this boot
    journal  {"cursor"}: journalctl's own cursor
* ``flood.json``  open events and escalation burst times (``flood.FloodTracker.state``)
* ``.lock``       held while a read loads the above, and while its commit saves them

Files are written with ``fsutil.atomic_write`` (mode 0640) and read with ``O_NOFOLLOW``; a file
that is not ours (another owner, a link, unreadable JSON) counts as absent, which leads to a
bounded rescan rather than trusting it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any, Dict, Iterator, Optional

from ..fsutil import atomic_write, ensure_dir, locked, path_component
from ..fsutil import read_state_json as read_json


class StateStore:
    def __init__(self, state_dir: str, node: str):
        self.dir = os.path.join(state_dir, "kernellog", path_component(node))

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
