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
from typing import BinaryIO, Callable, Iterable, Iterator, List, Optional, Sequence

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


DEFAULT_MAX_LINE_BYTES = 4 << 20                   # [summary] max_line_bytes
_SKIP_PIECE = 1 << 20
# Values no job can have: a row holding one is not counted (and is counted as rejected).
MAX_ELAPSED_S = 10 * 366 * 86400
MAX_JOB_GPUS = 1_000_000


class LineCap:
    """Lines of at most ``cap`` bytes (without the line end); a longer one is read through in
    pieces, never held whole, and counted in ``skipped``."""

    def __init__(self, cap: int = DEFAULT_MAX_LINE_BYTES):
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

    def problem(self) -> Optional[str]:
        if not self.skipped:
            return None
        return (f"{self.skipped} line(s) longer than {self.cap} bytes ([summary] max_line_bytes) "
                "were skipped, not counted")


def impossible_problem(count: int) -> Optional[str]:
    if not count:
        return None
    return (f"{count} row(s) with impossible values were not counted (elapsed below 0 or above "
            f"{MAX_ELAPSED_S} s, or more than {MAX_JOB_GPUS} GPUs)")


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


def is_header(parts: Sequence[str]) -> bool:
    return len(parts) >= 2 and parts[0] == SACCT_FIELDS[0] and parts[1] == SACCT_FIELDS[1]


def read_rows(lines: Iterable[str], problems: List[str], delimiter: Optional[str] = None) -> Iterator[List[str]]:
    """Rows of ``SACCT_FIELDS`` values, one per sacct line, streamed. A header line (sacct
    without ``-n``) is checked against the contract; lines that are not rows of this format
    are counted into ``problems`` (at most a few examples are kept)."""
    bad = 0
    first = True
    for line in lines:
        # The line end stays on the last field (the job name): ``job_name`` strips it.
        if first:
            line = line.rstrip("\r\n")
            if not line:
                continue
            first = False
            if delimiter is None:
                delimiter = detect_delimiter(line)
            parts = line.split(delimiter)
            if parts[0] == SACCT_FIELDS[0] or (parts and parts[0] in ("JobID", "JobIDRaw") and len(parts) > 1):
                if tuple(parts) != SACCT_FIELDS:
                    raise AccountingError(
                        f"the sacct header is {','.join(parts[:20])}; expected {SACCT_FORMAT} "
                        "(run sacct with --format=$(slurm-gpu summary --sacct-format))")
                continue
        else:
            parts = line.split(delimiter)
        if len(parts) != FIELD_COUNT:
            if not line.strip():
                continue
            parts = repair(parts, delimiter)
            if parts is None:
                bad += 1
                if bad <= 3:
                    problems.append(f"not a sacct row of the expected format ({FIELD_COUNT} fields): "
                                    f"{line[:80]!r}")
                continue
        yield parts
    if bad > 3:
        problems.append(f"{bad} lines in all were not rows of the expected format")


class LineFeed:
    """sacct's output as the runner hands it over (``healthcheck.safeio.programs.stream``: bytes in
    chunks) -> complete lines -> ``consume``; nothing more than one chunk is held."""

    def __init__(self, consume: Callable[[List[str]], None], cap: Optional[LineCap] = None):
        self.consume = consume
        self.rest = b""
        self.cap = cap or LineCap()
        self.skipping = False            # inside a line past the cap: dropped up to its end

    def feed(self, chunk: bytes) -> None:
        if self.skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                return
            self.skipping = False
            chunk = chunk[cut + 1:]
        data = self.rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self.rest = self._capped(data)
            return
        self.rest = self._capped(data[cut + 1:])
        lines = data[:cut + 1]
        if cut > self.cap.cap:
            lines = self._without_long(lines)
        # UTF-8 never puts a newline byte inside a character: cutting at one is safe.
        self.consume(lines.decode("utf-8", "replace").splitlines(keepends=True))

    def _without_long(self, lines: bytes) -> bytes:
        pieces = lines.split(b"\n")[:-1]
        kept = [piece for piece in pieces if len(piece) <= self.cap.cap]
        self.cap.skipped += len(pieces) - len(kept)
        return b"".join(piece + b"\n" for piece in kept) if len(kept) < len(pieces) else lines

    def _capped(self, rest: bytes) -> bytes:
        """The head of a line not yet ended, unless it is already past the cap."""
        if len(rest) > self.cap.cap:
            self.cap.skipped += 1
            self.skipping = True
            return b""
        return rest

    def close(self) -> None:
        if self.rest:
            self.consume([self.rest.decode("utf-8", "replace")])
            self.rest = b""
