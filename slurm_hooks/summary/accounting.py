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
from typing import Callable, Iterable, Iterator, List, Optional, Sequence

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
    """sacct's output as the runner hands it over (``healthcheck.bounded.stream``: bytes in
    chunks) -> complete lines -> ``consume``; nothing more than one chunk is held."""

    def __init__(self, consume: Callable[[List[str]], None]):
        self.consume = consume
        self.rest = b""

    def feed(self, chunk: bytes) -> None:
        data = self.rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self.rest = data
            return
        self.rest = data[cut + 1:]
        # UTF-8 never puts a newline byte inside a character: cutting at one is safe.
        self.consume(data[:cut + 1].decode("utf-8", "replace").splitlines(keepends=True))

    def close(self) -> None:
        if self.rest:
            self.consume([self.rest.decode("utf-8", "replace")])
            self.rest = b""
