"""A large saved accounting file (``--input FILE``) read by several processes at once.

The file is cut into byte ranges that begin at line starts, several per process; this process
and forked children take them from a shared queue (a pipe of indexes) and read each with the
same reader and tally as one process would, and the tallies are merged (a child's comes back
pickled through a pipe). Every line falls in exactly one range, so the result equals a single
pass; a process slowed by something else on its CPU takes fewer ranges. Worth it only for big
plain files: stdin, ``.gz``, small files and ``--jobs`` (rows in file order) take one pass.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from .accounting import BAD_EXAMPLES, LineCap, RowReader, bad_lines_problem, detect_delimiter, row_blocks
from .tally import Filters, Tally

MIN_BYTES_PER_WORKER = 32 << 20
MAX_WORKERS = 3                      # each worker holds its own counters (~45 MB)
RANGES_PER_WORKER = 32              # small ranges: the last one taken ends soon after the others
MIN_BYTES_PER_RANGE = 4 << 20


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def workers_for(path: str, wanted: Optional[int]) -> int:
    """How many processes should read ``path`` (1: a single pass)."""
    if path == "-" or path.endswith(".gz"):
        return 1
    try:
        size = os.path.getsize(path)
    except OSError:
        return 1
    if not os.path.isfile(path):
        return 1
    workers = default_workers() if not wanted else wanted
    return max(1, min(workers, size // MIN_BYTES_PER_WORKER))


def byte_ranges(path: str, parts: int) -> List[Tuple[int, int]]:
    """``parts`` contiguous [start, end) ranges covering the file, each starting at a line."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as handle:
        for k in range(1, parts):
            handle.seek(max(size * k // parts - 1, bounds[-1]))
            while True:                      # to the start of the next line, a piece at a time
                piece = handle.readline(1 << 20)
                if not piece or piece.endswith(b"\n"):
                    break
            bounds.append(min(handle.tell(), size))
    bounds.append(size)
    return [(start, end) for start, end in zip(bounds, bounds[1:]) if end > start]


def _first_line(path: str) -> str:
    with open(path, "rb") as handle:
        return handle.readline(1 << 16).decode("utf-8", "replace")


# What one process hands back: its tally, and per range it read (by index) the lines that were not
# rows (examples, count) and the lines past the cap.
Result = Tuple[Tally, Dict[int, Tuple[List[str], int, int]]]
Job = Tuple[str, List[Tuple[int, int]], str, Filters, int]


def _work(job: Job, queue: int) -> Result:
    """Ranges taken from ``queue`` (4-byte indexes, one read each: atomic on a pipe) until it is
    empty, tallied into one tally."""
    path, ranges, delimiter, filters, max_line = job
    tally = Tally(filters)
    done: Dict[int, Tuple[List[str], int, int]] = {}
    with open(path, "rb") as handle:
        while True:
            token = os.read(queue, 4)
            if len(token) < 4:
                break
            index = int.from_bytes(token, "little")
            start, end = ranges[index]
            examples: List[str] = []
            reader, cap = RowReader(examples, delimiter, at_start=start == 0), LineCap(max_line)
            handle.seek(start)
            tally.add_chunks(row_blocks(handle, cap, examples, delimiter, start, end, reader=reader))
            done[index] = (examples, reader.bad, cap.skipped)
    return tally.finish(), done


class ReaderFailed(OSError):
    """A forked reader ended without handing back its tally."""


def _fork(job: Job, queue: int) -> Tuple[int, int]:
    """A child that works ``job`` and writes its pickled result (or the exception it raised) to
    a pipe; returns (pid, the pipe's read end)."""
    import pickle

    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:                                      # pragma: no cover - runs in the child (tests see its result)
        code = 0
        try:
            os.close(read_end)
            try:
                result = pickle.dumps((True, _work(job, queue)), pickle.HIGHEST_PROTOCOL)
            except Exception as exc:                  # handed to the parent, which raises it
                result = pickle.dumps((False, exc), pickle.HIGHEST_PROTOCOL)
            with open(write_end, "wb") as out:
                out.write(result)
        except BaseException:
            code = 1
        finally:
            os._exit(code)                            # no atexit, no flushing of the parent's buffers
    os.close(write_end)
    return pid, read_end


def _collect(pid: int, read_end: int) -> Result:
    import pickle

    with open(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data or os.waitstatus_to_exitcode(status) != 0:
        raise ReaderFailed(f"a reader process ended with status {os.waitstatus_to_exitcode(status)} "
                           "and no result")
    ok, result = pickle.loads(data)
    if not ok:
        raise result
    return result


def _stop(pid: int, read_end: int) -> None:
    import signal

    os.close(read_end)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def range_count(size: int, workers: int) -> int:
    """How many ranges ``workers`` processes share: several each, so that one that runs faster
    (the other CPU busy with something else a while) takes more of them; none below
    ``MIN_BYTES_PER_RANGE``."""
    return max(workers, min(workers * RANGES_PER_WORKER, size // MIN_BYTES_PER_RANGE))


def _queue(count: int) -> int:
    """A pipe holding the indexes 0..count-1, its write end closed: the read end, which every
    reader shares (``count`` * 4 bytes: well within a pipe's buffer)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"".join(index.to_bytes(4, "little") for index in range(count)))
    finally:
        os.close(write_end)
    return read_end


def tally_file(path: str, filters: Filters, workers: int, problems: List[str], cap: LineCap) -> Tally:
    """The tally of a whole file read by ``workers`` processes: this one and forked children,
    each taking ranges from a shared queue until none are left (the reader of the range at
    byte 0 checks the header); lines past ``cap`` are counted into it. What was not a row is told as
    one pass would tell it: the first examples in the file, then the count."""
    delimiter = detect_delimiter(_first_line(path))
    ranges = byte_ranges(path, range_count(os.path.getsize(path), workers))
    job = (path, ranges, delimiter, filters, cap.cap)
    queue = _queue(len(ranges))
    try:
        # Forked before this process reads: the children share the imports and the page cache,
        # and this process reads too instead of waiting (no pool: its threads and pipes cost
        # more than a small job's reading).
        children: List[Tuple[int, int]] = []
        for _ in range(workers - 1):
            try:
                children.append(_fork(job, queue))
            except OSError:                           # no more processes: those there read it all
                break
        try:
            results = [_work(job, queue)]
        except BaseException:
            for pid, read_end in children:            # this process's error is the one to tell
                _stop(pid, read_end)
            raise
    finally:
        os.close(queue)
    failure: Optional[BaseException] = None
    for pid, read_end in children:                    # every child reaped, the first failure raised
        try:
            results.append(_collect(pid, read_end))
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    total = results[0][0]                             # this process's own: the others merge into it
    for tally, _ in results[1:]:
        total.merge(tally)
    per_range = {index: told for _, done in results for index, told in done.items()}
    examples = [example for index in sorted(per_range) for example in per_range[index][0]]
    bad = sum(told[1] for told in per_range.values())
    problems.extend(examples[:BAD_EXAMPLES])
    if bad > BAD_EXAMPLES:
        problems.append(bad_lines_problem(bad))
    cap.skipped += sum(told[2] for told in per_range.values())
    return total
