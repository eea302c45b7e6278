"""Find the few lines worth parsing in a stream of log bytes, at grep's speed.

Chunks are searched for the parser's needles with ``fastfind.find`` (glibc's memmem, else
``bytes.find``: C speed, no per-line Python work); only a line holding a needle is cut out and
handed on, as ``bytes``. A chunk may be a ``bytearray`` that the reader fills again after
``feed`` returns: nothing here keeps a reference to it. Memory stays bounded: one chunk
plus at most ``MAX_LINE`` bytes of a line that spans chunks; the rest of an overlong line is
skipped (its head, where the kernel text starts, is what matters).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

from .fastfind import find
from .parser import NEEDLES

CHUNK = 2 * 1024 * 1024
MAX_LINE = 64 * 1024
PREVIOUS_HEAD = 256            # bytes kept of the line before a handed-on line (its prefix is what matters)
PRIMED = -2                    # ``previous_start`` of the line before the first byte fed (``prime``)


@dataclass
class ScanStats:
    bytes_read: int = 0
    lines_read: int = 0            # counted only when asked (it costs a pass over the bytes)
    candidate_lines: int = 0       # lines that held a needle and went to the parser
    events: int = 0                # events parsed (before folding repeats)
    overlong_lines: int = 0
    problems: List[str] = field(default_factory=list)   # what could not be read, one line each


class LineScanner:
    """Feed chunks; ``on_line(line)`` is called for each complete line that holds a needle.

    ``consumed`` is the number of bytes up to and including the last newline seen: where a
    cursor may point so that the next run starts on a line boundary. ``stop(why)`` (from
    ``on_line``, or between chunks) ends the scan; stopped from ``on_line``, ``consumed`` is the
    start of that line, so a read that resumes there reads it again.

    While ``on_line`` runs, ``line_start`` is where its line starts (bytes fed before it),
    ``previous_head`` the first ``PREVIOUS_HEAD`` bytes of the line before it (None when that
    line was not fed) and ``previous_start`` where that one starts: the syslog interface repeats
    a record's prefix on each of its lines, so the line before tells a record's later lines.
    """

    def __init__(self, on_line: Callable[[bytes], None], stats: Optional[ScanStats] = None,
                 count_lines: bool = False):
        self.on_line = on_line
        self.stats = stats if stats is not None else ScanStats()
        self.count_lines = count_lines
        self.consumed = 0
        self._offset = 0                 # bytes fed so far
        self._pending = bytearray()      # head of a line not yet ended
        self._overlong = False           # the pending line passed MAX_LINE; skipping to its end
        self._discard_first = False
        self._pending_start = 0          # where the pending line starts (bytes fed before it)
        self._line_start = 0             # where the line being handed on starts
        self.stopped: Optional[str] = None
        self.previous_head: Optional[bytes] = None
        self.previous_start = -1
        self._last_head: Optional[bytes] = None      # the last complete line fed, and its start
        self._last_start = -1
        self.primed: Optional[Tuple[bytes, bytes]] = None     # ``prime``'s two lines

    def prime(self, line: bytes, before: bytes = b"") -> None:
        """``line`` (without its newline) ends just before the first byte fed, ``before`` is the
        line before it: a read from a cursor. The first line fed then has ``line`` as
        ``previous_head`` (``previous_start`` is ``PRIMED``), so a record's later line that a read
        starts on is still told by its stamp."""
        self._last_head, self._last_start = bytes(line[:PREVIOUS_HEAD]), PRIMED
        self.primed = (bytes(line[:MAX_LINE]), bytes(before[:PREVIOUS_HEAD]))

    @property
    def line_start(self) -> int:
        return self._line_start

    def stop(self, why: str) -> None:
        """Hand on nothing more. Called from ``on_line``, the line being handed on is not consumed."""
        if self.stopped is None:
            self.stopped = why
    def start_mid_line(self) -> None:
        """The first bytes fed are the tail of a line whose start was not read: drop them."""
        self._discard_first = True

    @property
    def at_line_start(self) -> bool:
        """False while still dropping the tail of a line begun before the bytes fed."""
        return not self._discard_first

    def feed(self, chunk: bytes) -> None:
        if not chunk or self.stopped:
            return
        self.stats.bytes_read += len(chunk)
        if self.count_lines:
            self.stats.lines_read += chunk.count(b"\n")
        start = 0
        if self._discard_first:
            newline = chunk.find(b"\n")
            if newline < 0:
                self._offset += len(chunk)
                return
            self._discard_first = False
            start = newline + 1
            self.consumed = self._offset + start
        elif self._pending or self._overlong:
            newline = chunk.find(b"\n")
            if newline < 0:
                self._keep(chunk)
                self._offset += len(chunk)
                return
            self._keep(chunk[:newline])
            self._line_start = self._pending_start
            head = bytes(self._pending[:PREVIOUS_HEAD])
            self._finish_pending()
            if self.stopped:
                self.consumed = self._line_start
                return
            self._last_head, self._last_start = head, self._pending_start
            start = newline + 1
            self.consumed = self._offset + start
        last_newline = chunk.rfind(b"\n", start)
        if last_newline >= 0:
            self._search(chunk, start, last_newline + 1)
            if self.stopped:
                self.consumed = self._line_start
                return
            self.consumed = self._offset + last_newline + 1
            last_start = chunk.rfind(b"\n", start, last_newline) + 1 or start
            self._last_head = bytes(chunk[last_start:min(last_newline, last_start + PREVIOUS_HEAD)])
            self._last_start = self._offset + last_start
            start = last_newline + 1
        if start < len(chunk):
            if not self._pending and not self._overlong:
                self._pending_start = self._offset + start
            self._keep(chunk[start:])
        self._offset += len(chunk)

    def finish(self) -> None:
        """End of input: a last line without a newline is still a line (a one-shot read)."""
        if self._discard_first or self.stopped:
            return
        if self._pending or self._overlong:
            if self.count_lines:
                self.stats.lines_read += 1
            self._finish_pending()

    # -- internals ---------------------------------------------------------------------------
    def _keep(self, piece: bytes) -> None:
        room = MAX_LINE - len(self._pending)
        if len(piece) > room:
            if not self._overlong:
                self.stats.overlong_lines += 1
            self._overlong = True
            piece = piece[:max(room, 0)]
        self._pending += piece

    def _finish_pending(self) -> None:
        line = bytes(self._pending)
        self._pending.clear()
        self._overlong = False
        if any(needle in line for needle in NEEDLES):
            self.previous_head, self.previous_start = self._last_head, self._last_start
            self._emit(line)

    def _search(self, chunk: bytes, start: int, end: int) -> None:
        """Hand on each line in chunk[start:end] (whole lines) that holds a needle, once."""
        starts = []
        for needle in NEEDLES:
            hit = find(chunk, needle, start, end)
            while hit >= 0:
                line_start = chunk.rfind(b"\n", start, hit) + 1 or start
                starts.append(line_start)
                line_end = chunk.find(b"\n", hit, end)
                hit = find(chunk, needle, line_end + 1, end)
        if not starts:
            return
        for line_start in sorted(set(starts)):
            line_end = chunk.find(b"\n", line_start, end)
            if line_end - line_start > MAX_LINE:
                self.stats.overlong_lines += 1
                line_end = line_start + MAX_LINE
            self._line_start = self._offset + line_start
            if line_start > start:
                before = chunk.rfind(b"\n", start, line_start - 1) + 1 or start
                self.previous_head = bytes(chunk[before:min(line_start - 1, before + PREVIOUS_HEAD)])
                self.previous_start = self._offset + before
            else:
                self.previous_head, self.previous_start = self._last_head, self._last_start
            self._emit(bytes(chunk[line_start:line_end]))
            if self.stopped:
                return

    def _emit(self, line: bytes) -> None:
        self.stats.candidate_lines += 1
        self.on_line(line.rstrip(b"\r"))
