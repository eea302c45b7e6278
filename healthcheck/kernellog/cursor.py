"""Where the last run stopped reading, and the flood state, kept in the state dir.

Layout: ``<state_dir>/kernellog/<reader>/`` (mode 0750; the runner's readers are
``<node>.<tier>`` and ``<node>.cli.<tier>``) holding

* ``cursor-<kind>-<hash>.json`` one per source; ``kind`` is file | kmsg | journal:
    file     {"path", "dev", "ino", "offset", "tail_sha256", "head_sha256", "span_bytes",
             "span_crc32"}: the byte after the last complete line read, a hash of the 64 bytes
             before it, one of the file's first 4 KiB (at most to the offset) and a CRC of the
             ``span_bytes`` before it ([xid] rescan_bytes, at most 16 MiB): a file rewritten in
             place (copytruncate, then lines whose bytes before the offset, or whose head,
             happen to be the same) fails to match
    kmsg     {"boot_id", "seq"}: the last /dev/kmsg sequence number read in this boot
    journal  {"cursor"}: journalctl's own cursor
* ``flood.json``  open events and escalation burst times (``flood.FloodTracker.state``)
* ``.lock``       held while a read loads the above, and while its commit saves them

Files are written with ``fsutil.atomic_write`` (mode 0640) and read with ``O_NOFOLLOW``; a file
that is not ours (another owner, a link) counts as absent, and one of ours that does not match
its schema below (unreadable JSON, an offset that is not a number, ...) is set aside as
``<name>.corrupt``; either way the run does a bounded rescan rather than trusting it.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
from typing import Any, Dict, Iterator, Optional

from ..safeio.sha256 import sha256
from ..safeio.fsutil import atomic_write, ensure_dir, ensure_state_dir, locked, path_component
from ..safeio.fsutil import read_state_json as read_json
from ..safeio.jsontypes import field_problem, is_count, is_int, is_str, optional

# The format of the cursor and flood files (``version``; none: 1). A newer one (a rollback) is
# left as it is: the kernel log is not judged (probe.error) until that version is back.
VERSION = 1


# What each kind of cursor must hold ("source" too: the source it belongs to).
CURSOR_SCHEMAS = {
    "file": {"dev": is_int, "ino": is_int, "offset": is_count, "tail_sha256": is_str},
    "kmsg": {"boot_id": optional(is_str), "seq": lambda value: is_int(value) and value >= -1},
    "journal": {"cursor": optional(is_str)},
}
_OPTIONAL_FIELDS = {"mid_line": lambda value: isinstance(value, bool), "head_sha256": is_str,
                    "span_bytes": is_count, "span_crc32": is_count}


def cursor_problem(kind: str, data: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a saved cursor of ``kind``; None when it matches its schema."""
    schema = CURSOR_SCHEMAS.get(kind)
    if schema is None:
        return f"unknown cursor kind {kind!r}"
    return (field_problem(data, {"source": is_str})
            or field_problem(data, schema)
            or field_problem(data, _OPTIONAL_FIELDS, required=False))


class StateStore:
    def __init__(self, state_dir: str, node: str):
        self.dir = os.path.join(state_dir, "kernellog", path_component(node))

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        ensure_state_dir(os.path.dirname(os.path.dirname(self.dir)))
        ensure_dir(self.dir)
        with locked(os.path.join(self.dir, ".lock")):
            yield

    def cursor_path(self, kind: str, source: str) -> str:
        digest = sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(self.dir, f"cursor-{kind}-{digest}.json")

    def load_cursor(self, kind: str, source: str) -> Optional[Dict[str, Any]]:
        def problem(data: Dict[str, Any]) -> Optional[str]:
            wrong = cursor_problem(kind, data)
            if wrong is None and data["source"] != source:
                wrong = f"it belongs to another source ({data['source']!r})"
            return wrong

        return read_json(self.cursor_path(kind, source), problem, newest=VERSION)

    def save_cursor(self, kind: str, source: str, cursor: Dict[str, Any]) -> None:
        atomic_write(self.cursor_path(kind, source),
                     json.dumps(dict(cursor, source=source, version=VERSION), sort_keys=True))

    def load_flood(self) -> Dict[str, Any]:
        from .flood import state_problem

        return read_json(os.path.join(self.dir, "flood.json"), state_problem, newest=VERSION) or {}

    def save_flood(self, state: Dict[str, Any]) -> None:
        atomic_write(os.path.join(self.dir, "flood.json"), json.dumps(dict(state, version=VERSION), sort_keys=True))

    def clear_flood(self) -> None:
        """No flood state (what an empty one says, ``load_flood``): a file left from an earlier
        reader of this name is removed. Durable with the next write in this directory (a
        cursor's: ``atomic_write`` syncs the directory), so a fresh reader costs one write."""
        try:
            os.unlink(os.path.join(self.dir, "flood.json"))
        except FileNotFoundError:
            pass


def tail_hash(fd: int, offset: int) -> str:
    """A hash of the 64 bytes before ``offset``: the same file still holds what we read."""
    start = max(0, offset - 64)
    return sha256(os.pread(fd, offset - start, start)).hexdigest()


HEAD_BYTES = 4096


def head_hash(fd: int, offset: int) -> str:
    """A hash of the file's first ``HEAD_BYTES`` (at most to ``offset``): a log truncated and
    written again from its start (copytruncate) has another head, even when the bytes just before
    the old offset happen to be the same."""
    return sha256(os.pread(fd, min(offset, HEAD_BYTES), 0)).hexdigest()


# The most bytes before the offset a file cursor hashes whole (``span_hash``), and how many when the
# reader does not say (the prolog's job reader): [xid] rescan_bytes' default.
SPAN_MAX = 16 * 1024 * 1024
SPAN_DEFAULT = 4 * 1024 * 1024
_SPAN_PIECE = 256 * 1024


def span_hash(fd: int, offset: int, span: int) -> int:
    """A CRC-32 of the ``span`` bytes before ``offset``, read in small pieces (memory stays flat).
    A log rewritten in place whose head and last 64 bytes happen to be the same (byte-identical
    lines) differs somewhere in between: within the span, the rewrite is seen. A change further
    back is outside what a rescan reads anyway (the last ``rescan_bytes`` of a file at least as
    long as the offset). CRC-32, not SHA-256: this runs over megabytes on every read, 15 times
    faster (about 1 ms for 4 MiB here against 14 ms for the built-in SHA-256), and it guards
    against an accident (the head and tail hashes stay SHA-256)."""
    import zlib

    crc = 0
    position = offset - span
    while position < offset:
        piece = os.pread(fd, min(_SPAN_PIECE, offset - position), position)
        if not piece:
            break
        crc = zlib.crc32(piece, crc)
        position += len(piece)
    return crc


def file_marks(fd: int, offset: int, span: int = SPAN_DEFAULT) -> Dict[str, Any]:
    """The hashes a file cursor at ``offset`` keeps: the 64 bytes before it, the file's head, and
    (a CRC) the ``span`` bytes before it (at most ``SPAN_MAX``, at most to the start)."""
    span = max(0, min(span, SPAN_MAX, offset))
    return {"tail_sha256": tail_hash(fd, offset), "head_sha256": head_hash(fd, offset),
            "span_bytes": span, "span_crc32": span_hash(fd, offset, span)}


def marks_match(fd: int, offset: int, cursor: Dict[str, Any]) -> bool:
    """Whether the file still holds, at and before ``offset``, what the cursor saw (a cursor
    saved before the head or span hash existed is judged on the hashes it has)."""
    if tail_hash(fd, offset) != cursor.get("tail_sha256"):
        return False
    head = cursor.get("head_sha256")
    if head is not None and head_hash(fd, offset) != head:
        return False
    span, hashed = cursor.get("span_bytes"), cursor.get("span_crc32")
    if span is None or hashed is None:
        return True
    return span <= offset and span_hash(fd, offset, span) == hashed


# How far back from a file's end ``start_file_at_end`` looks for the last complete line.
_LAST_LINE_BYTES = 64 * 1024


def start_file_at_end(path: str, state_dir: str, node: str) -> bool:
    """Start reader ``node``'s cursor on the file ``path`` at its last complete line, with no
    flood state: what a read to the end would commit when the reader only wants what comes
    next (the prolog, for a job's own reader). A stat and one short read instead of a scan.

    False when it cannot say where the end is this way (not a regular file, a compressed one,
    no line end in the last 64 KiB): the caller then reads the log instead. Raises OSError
    when the file cannot be opened or the state dir written."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)      # followed, as the readers do: an admin's path
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or os.pread(fd, 2, 0) == b"\x1f\x8b":
            return False
        offset = info.st_size
        if offset:
            start = max(0, offset - _LAST_LINE_BYTES)
            tail = os.pread(fd, offset - start, start)
            newline = tail.rfind(b"\n")
            if newline < 0:
                return False
            offset = start + newline + 1
        identity = os.path.abspath(path)
        cursor = dict(file_marks(fd, offset), dev=info.st_dev, ino=info.st_ino, offset=offset, mid_line=False)
    finally:
        os.close(fd)
    store = StateStore(state_dir, node)
    with store.lock():
        store.clear_flood()
        store.save_cursor("file", identity, cursor)
    return True


def file_unchanged(path: str, state_dir: str, node: str) -> bool:
    """Whether reader ``node`` has already read the file ``path`` to its end: its saved cursor
    is on this file (same device and inode, the bytes before it the same) at its last byte.
    Then a read would find no new line; the epilog asks this before loading the reader.
    False when unsure (no cursor, another file, a line still being written): read it."""
    identity = os.path.abspath(path)
    saved = StateStore(state_dir, node).load_cursor("file", identity)
    if saved is None:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        return (stat.S_ISREG(info.st_mode) and saved["dev"] == info.st_dev and saved["ino"] == info.st_ino
                and saved["offset"] == info.st_size and marks_match(fd, info.st_size, saved))
    finally:
        os.close(fd)


def boot_id() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None
