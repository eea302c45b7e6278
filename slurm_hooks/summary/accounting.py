"""Reading Slurm accounting for the summary: the field list (a contract), the sacct command
line, and a streaming reader of ``sacct --parsable2`` text.

``slurm-gpu summary --sacct-format`` prints ``SACCT_FORMAT``; data saved with
``sacct -a -D -X -P --format=$(slurm-gpu summary --sacct-format)`` (with or without the header
line, with ``|`` or any one-character ``--delimiter``) is what ``--input`` reads.

sacct does not escape its delimiter, so a job name or an AdminComment that holds ``|`` makes
a line split into more fields than asked for. The two free-text fields are therefore last,
AdminComment before JobName: extra pieces are glued back, our entries (JSON, which may hold
``|`` inside strings) are kept whole, and the rest of the line is the job name.
"""
from __future__ import annotations

import json
import re
from io import BytesIO
from itertools import compress, islice, repeat
from typing import BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

from healthcheck.records import admin_comment

# The order is part of the contract: fixed-width fields first, free text last.
SACCT_FIELDS = ("JobIDRaw", "JobID", "DBIndex", "User", "Account", "Partition", "State",
                "ExitCode", "Submit", "Start", "End", "ElapsedRaw", "AllocTRES", "NNodes",
                "NodeList", "AdminComment", "JobName")
SACCT_FORMAT = ",".join(SACCT_FIELDS)
FIELD_COUNT = len(SACCT_FIELDS)
INDEX = {name: position for position, name in enumerate(SACCT_FIELDS)}
I_ADMIN = INDEX["AdminComment"]
FIXED = I_ADMIN                                    # fields before the free text

DEFAULT_DELIMITER = "|"
LIVE_DELIMITER = "\x1f"                            # what we ask sacct for: no name can hold it


_SKIP_PIECE = 1 << 20
BLOCK_BYTES = 128 << 10          # LineCap.blocks: read and decoded at once (~500 rows: the tally's chunk)
# Values no job can have: a row holding one is not counted (and is counted as rejected, per
# reason: ``SET_ASIDE``).
MAX_ELAPSED_S = 10 * 366 * 86400
MAX_JOB_GPUS = 1_000_000
# A job's End as sacct writes it for a job that ended: local ISO time, from 2000 (Slurm is younger)
# to before 2200. sacct's "Unknown", "None", 0000-00-00T00:00:00 or 9999-12-31T23:59:59 are no
# ending: such a row would be a job ending and become the report's window.
END_FIRST, END_LAST = "2000-01-01T00:00:00", "2200-01-01T00:00:00"
END_LENGTH = len(END_FIRST)
_END_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)", re.ASCII)
NOT_A_NUMBER = -(1 << 62)        # ElapsedRaw that is not a whole number of seconds (1e9, NaN)
NOT_A_COUNT = -1                 # AllocTRES gres/gpu that is not a whole count (-8, 2.5)
# Why a row was set aside (the report's ``set_aside``: reason -> rows), in the order they are tried.
SET_ASIDE = {
    "end_not_a_time": f"End is not a time a job ended (Unknown, 0000-00-00T00:00:00, before {END_FIRST[:4]} "
                      f"or from {END_LAST[:4]} on)",
    "elapsed_not_a_number": "ElapsedRaw is not a whole number of seconds (1e9, NaN)",
    "elapsed_out_of_range": f"ElapsedRaw below 0 or above {MAX_ELAPSED_S} s",
    "gpus_not_a_count": "AllocTRES gres/gpu is not a whole count (-8)",
    "gpus_out_of_range": f"more than {MAX_JOB_GPUS} GPUs",
}


def end_is_time(end: str) -> bool:
    """Whether an End value is a time a job can have ended at (see ``END_FIRST``)."""
    match = _END_TIME.fullmatch(end)
    if match is None or not END_FIRST <= end < END_LAST:
        return False
    _, month, day, hour, minute, second = map(int, match.groups())
    return 1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61


def seconds_of(value: str) -> int:
    """ElapsedRaw as an int, ``NOT_A_NUMBER`` for anything but ASCII digits (with a sign)."""
    digits = value[1:] if value[:1] in ("-", "+") else value
    return int(value) if digits.isdigit() and digits.isascii() else NOT_A_NUMBER


def impossible_reason(end: str, elapsed: int, gpus: int) -> Optional[str]:
    """The ``SET_ASIDE`` key of the first value no job can have, or None."""
    if not end_is_time(end):
        return "end_not_a_time"
    if elapsed == NOT_A_NUMBER:
        return "elapsed_not_a_number"
    if elapsed < 0 or elapsed > MAX_ELAPSED_S:
        return "elapsed_out_of_range"
    if gpus == NOT_A_COUNT:
        return "gpus_not_a_count"
    if gpus > MAX_JOB_GPUS:
        return "gpus_out_of_range"
    return None


class LineCap:
    """Lines of at most ``cap`` bytes (without the line end); a longer one is read through in
    pieces, never held whole, and counted in ``skipped``."""

    def __init__(self, cap: int):                # [summary] max_line_bytes
        self.cap = cap
        self.skipped = 0

    def lines(self, stream: BinaryIO, end: Optional[int] = None, start: int = 0) -> Iterator[str]:
        """Decoded lines of ``stream`` (binary), from ``start`` to the line that reaches ``end``."""
        readline, cap, position = stream.readline, self.cap, start
        while end is None or position < end:
            raw = readline(cap + 2)
            if not raw:
                return
            position += len(raw)
            if len(raw) > cap + 1 or (len(raw) == cap + 1 and raw[-1:] != b"\n"):
                self.skipped += 1
                while raw[-1:] != b"\n":
                    raw = readline(_SKIP_PIECE)
                    if not raw:
                        return
                    position += len(raw)
                continue
            yield raw.decode("utf-8", "replace")

    def blocks(self, stream: BinaryIO, end: Optional[int] = None, start: int = 0) -> Iterator[List[str]]:
        """The lines ``lines`` gives (cut at ``\n`` only, the line end kept, one longer than the
        cap skipped and counted, the one that reaches ``end`` read to its end), a block of about
        ``BLOCK_BYTES`` at a time: one read and one decode per block instead of per line."""
        read, cap, position = stream.read, self.cap, start
        # The line begun and not yet ended, in pieces: joined once when it ends (a line many
        # blocks long was copied once per block, 11 s for one of 60 MB).
        held: List[bytes] = []
        held_bytes, skipping = 0, False
        while True:
            finishing = end is not None and position >= end      # only the line that reaches end is left
            if finishing and not held and not skipping:
                return
            data = read(BLOCK_BYTES if end is None or finishing else min(BLOCK_BYTES, end - position))
            if not data:
                if held and not skipping:
                    yield [b"".join(held).decode("utf-8", "replace")]
                return
            position += len(data)
            if finishing:
                data = data[:data.find(b"\n") + 1] or data   # no further line than the one begun
            if skipping:
                cut = data.find(b"\n")
                if cut < 0:
                    continue
                skipping, data = False, data[cut + 1:]
                if finishing:
                    return
            if b"\n" not in data:                            # the line goes on
                if data:
                    held.append(data)
                    held_bytes += len(data)
                    if held_bytes > cap:                      # a line past the cap: read through, dropped
                        self.skipped += 1
                        held, held_bytes, skipping = [], 0, True
                continue
            if held:
                held.append(data)
                data = b"".join(held)
            cut = data.rfind(b"\n")
            rest = data[cut + 1:]
            if len(rest) > cap:                               # a line past the cap: read through, dropped
                self.skipped += 1
                held, held_bytes, skipping = [], 0, True
            else:
                held, held_bytes = ([rest], len(rest)) if rest else ([], 0)
            body = data[:cut + 1]
            if len(body) > cap + 1:
                body = self.without_long(body)
            # Cut by BytesIO's readlines (a memchr scan; str.split looks at every character) and
            # decoded a line at a time: UTF-8 puts no newline byte inside a character, so each
            # line decodes as it does within the block.
            yield list(map(bytes.decode, BytesIO(body).readlines(), repeat("utf-8"), repeat("replace")))
            if finishing:
                return

    def without_long(self, body: bytes) -> bytes:
        """Whole lines (each ending in ``\\n``) without those longer than the cap (counted)."""
        pieces = body.split(b"\n")[:-1]
        kept = [piece for piece in pieces if len(piece) <= self.cap]
        self.skipped += len(pieces) - len(kept)
        return b"".join(piece + b"\n" for piece in kept) if len(kept) < len(pieces) else body

    def problem(self) -> Optional[str]:
        if not self.skipped:
            return None
        return (f"{self.skipped} line(s) longer than {self.cap} bytes ([summary] max_line_bytes) "
                "were skipped, not counted")


def impossible_problem(count: int, reasons: Optional[Dict[str, int]] = None) -> Optional[str]:
    """The rows set aside as one line: how many, and how many for each ``SET_ASIDE`` reason."""
    if not count:
        return None
    if reasons:
        detail = "; ".join(f"{rows}: {SET_ASIDE.get(reason, reason)}" for reason, rows in sorted(reasons.items()))
    else:
        detail = f"elapsed below 0 or above {MAX_ELAPSED_S} s, or more than {MAX_JOB_GPUS} GPUs"
    return f"{count} row(s) with impossible values were not counted ({detail})"


class AccountingError(Exception):
    """The accounting input cannot be read as sacct output; the message is one line."""


def sacct_arguments(since: str, until: str, users: Sequence[str] = (), accounts: Sequence[str] = (),
                    partitions: Sequence[str] = (), nodes: Sequence[str] = (),
                    job_ids: Sequence[str] = ()) -> List[str]:
    """sacct's arguments for the window (local ISO times): every user (-a), every incarnation
    of a requeued job (-D), allocations only (-X), no header, our delimiter."""
    args = ["-a", "-D", "-X", "-n", "-P", f"--delimiter={LIVE_DELIMITER}", f"--format={SACCT_FORMAT}",
            f"--starttime={since}", f"--endtime={until}"]
    for flag, values in (("--user", users), ("--accounts", accounts), ("--partition", partitions),
                         ("--nodelist", nodes), ("--jobs", job_ids)):
        if values:
            args.append(f"{flag}={','.join(values)}")
    return args


def _split_free_text(rest: str, delimiter: str) -> List[str]:
    """AdminComment and JobName from the text after the fixed fields, when either held the
    delimiter: our JSON entries are skipped over whole; the first delimiter outside them ends
    the AdminComment."""
    position = 0
    folded = rest.lower()
    quoted = rest.replace("`", '"')       # sacctmgr's stored form; same length, so positions hold
    tag_text = admin_comment.TAG.lower()
    while True:
        cut = rest.find(delimiter, position)
        if cut < 0:
            return [rest, ""]
        tag = folded.find(tag_text, position, cut)
        if tag < 0:
            return [rest[:cut], rest[cut + len(delimiter):]]
        try:
            _, end = json.JSONDecoder().raw_decode(quoted, tag + len(admin_comment.TAG))
        except ValueError:
            end = tag + len(admin_comment.TAG)
        position = max(end, tag + 1)


def repair(parts: List[str], delimiter: str) -> Optional[List[str]]:
    """A line that split into more fields than the format has, put back together; None when
    it has fewer (not a row of this format)."""
    if len(parts) < FIELD_COUNT:
        return None
    rest = delimiter.join(parts[FIXED:])
    return parts[:FIXED] + _split_free_text(rest, delimiter)


def job_name(row) -> str:
    """A row's JobName without the line end ``read_rows`` leaves on it."""
    return row[-1].rstrip("\r\n")


def detect_delimiter(first_line: str) -> str:
    if LIVE_DELIMITER in first_line:
        return LIVE_DELIMITER
    return DEFAULT_DELIMITER


class RowReader:
    """``SACCT_FIELDS`` rows from sacct lines, a list of lines at a time (what ``read_rows``
    does line by line): a header line (sacct without ``-n``) is checked against the contract,
    lines that are not rows of this format are counted into ``problems`` (at most a few examples
    are kept; ``finish`` adds the count). The line end stays on the last field (the job name):
    ``job_name`` strips it."""

    def __init__(self, problems: List[str], delimiter: Optional[str] = None, at_start: bool = True):
        # ``at_start``: these lines begin the file, so the first one may be a header to check.
        # A reader of a byte range further in reads its first line as any other: a file is
        # read the same whether one process reads it or several (each its own ranges).
        self.problems, self.delimiter = problems, delimiter
        self.first, self.bad = at_start, 0

    def rows(self, lines: List[str]) -> List[List[str]]:
        begin = 0
        out: List[List[str]] = []
        while self.first and begin < len(lines):
            row = self._first(lines[begin])
            begin += 1
            if row is not None:
                out.append(row)
        if begin >= len(lines):
            return out
        delimiter = self.delimiter
        if begin:
            lines = lines[begin:]
        split = list(map(str.split, lines, repeat(delimiter)))
        lengths = list(map(len, split))
        if lengths.count(FIELD_COUNT) != len(lengths):
            # The lines that are not rows at once (a job name holding the delimiter, ...), in place:
            # no Python-level step for the others.
            checked, gone = self._checked, False
            for i in compress(range(len(split)), map(FIELD_COUNT.__ne__, lengths)):
                split[i] = checked(lines[i], split[i])
                gone = gone or split[i] is None
            if gone:
                split = [parts for parts in split if parts is not None]
        if not out:
            return split
        out.extend(split)
        return out

    def _first(self, line: str) -> Optional[List[str]]:
        line = line.rstrip("\r\n")
        if not line:
            return None
        self.first = False
        if self.delimiter is None:
            self.delimiter = detect_delimiter(line)
        parts = line.split(self.delimiter)
        if parts[0] == SACCT_FIELDS[0] or (parts and parts[0] in ("JobID", "JobIDRaw") and len(parts) > 1):
            if tuple(parts) != SACCT_FIELDS:
                raise AccountingError(
                    f"the sacct header is {','.join(parts[:20])}; expected {SACCT_FORMAT} "
                    "(run sacct with --format=$(slurm-gpu summary --sacct-format))")
            return None
        return self._checked(line, parts)

    def _checked(self, line: str, parts: List[str]) -> Optional[List[str]]:
        if len(parts) == FIELD_COUNT:
            return parts
        if not line.strip():
            return None
        repaired = repair(parts, self.delimiter)
        if repaired is None:
            self.bad += 1
            if self.bad <= BAD_EXAMPLES:
                self.problems.append(f"not a sacct row of the expected format ({FIELD_COUNT} fields): {line[:80]!r}")
        return repaired

    def finish(self) -> None:
        if self.bad > BAD_EXAMPLES:
            self.problems.append(bad_lines_problem(self.bad))


BAD_EXAMPLES = 3                  # lines that are not rows, quoted in the problems; then a count


def bad_lines_problem(count: int) -> str:
    return f"{count} lines in all were not rows of the expected format"


def read_rows(lines: Iterable[str], problems: List[str], delimiter: Optional[str] = None) -> Iterator[List[str]]:
    """Rows of ``SACCT_FIELDS`` values, one per sacct line, streamed (``RowReader``, a few
    hundred lines at a time)."""
    reader = RowReader(problems, delimiter)
    iterator = iter(lines)
    while True:
        chunk = list(islice(iterator, 512))
        if not chunk:
            break
        yield from reader.rows(chunk)
    reader.finish()


def row_blocks(stream: BinaryIO, cap: LineCap, problems: List[str], delimiter: Optional[str] = None,
               start: int = 0, end: Optional[int] = None, reader: Optional[RowReader] = None
               ) -> Iterator[List[List[str]]]:
    """The rows ``read_rows(cap.lines(stream))`` gives, as lists of a block's rows
    (``LineCap.blocks``, ``RowReader``): what a saved file is read with. With ``reader`` given,
    its caller counts what was not a row (``reader.bad``) and finishes it."""
    own = reader is None
    if reader is None:
        reader = RowReader(problems, delimiter)
    for lines in cap.blocks(stream, end, start):
        rows = reader.rows(lines)
        if rows:
            yield rows
    if own:
        reader.finish()


class LineFeed:
    """sacct's output as the runner hands it over (``healthcheck.safeio.programs.stream``: bytes in
    chunks) -> complete lines -> ``consume``; nothing more than one chunk is held."""

    def __init__(self, consume: Callable[[List[str]], None], cap: LineCap):
        self.consume = consume
        self.held: List[bytes] = []      # the line begun, in pieces: joined once, when it ends
        self.held_bytes = 0
        self.cap = cap
        self.skipping = False            # inside a line past the cap: dropped up to its end

    def feed(self, chunk: bytes) -> None:
        if self.skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                return
            self.skipping = False
            chunk = chunk[cut + 1:]
        if b"\n" not in chunk:
            self._hold(chunk)
            return
        data = b"".join(self.held + [chunk]) if self.held else chunk
        self.held, self.held_bytes = [], 0
        cut = data.rfind(b"\n")
        self._hold(data[cut + 1:])
        lines = data[:cut + 1]
        if cut > self.cap.cap:
            lines = self.cap.without_long(lines)
        # UTF-8 never puts a newline byte inside a character: cutting at one is safe. Cut at "\n"
        # only: str.splitlines also cuts at \r, \x1c-\x1e, \x85, \u2028..., which a job name may
        # hold (a name "x\x1e<a forged row>" would have become a row of its own).
        text = lines.decode("utf-8", "replace")
        self.consume([line + "\n" for line in text.split("\n")[:-1]])

    def _hold(self, piece: bytes) -> None:
        """Keep the head of a line not yet ended, unless it is past the cap by now."""
        if not piece:
            return
        self.held.append(piece)
        self.held_bytes += len(piece)
        if self.held_bytes > self.cap.cap:
            self.cap.skipped += 1
            self.skipping = True
            self.held, self.held_bytes = [], 0

    def close(self) -> None:
        if self.held:
            self.consume([b"".join(self.held).decode("utf-8", "replace")])
            self.held, self.held_bytes = [], 0
