"""A large saved accounting file (``--input FILE``) read by several processes at once.

The file is cut into byte ranges that begin at line starts; this process reads the first, a
forked child each other one, with the same reader and tally as one process would, and the
tallies are merged (a child's comes back pickled through a pipe). Every
line falls in exactly one range, so the result equals a single pass. Worth it only for big
plain files: stdin, ``.gz``, small files and ``--jobs`` (rows in file order) take one pass.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .accounting import LineCap, detect_delimiter, row_blocks
from .tally import Filters, Tally

MIN_BYTES_PER_WORKER = 32 << 20
MAX_WORKERS = 3                      # each worker holds its own counters (~45 MB)


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


def _work(job: Tuple[str, int, int, str, Filters, int]) -> Tuple[Tally, List[str], int]:
    path, start, end, delimiter, filters, max_line = job
    problems: List[str] = []
    tally = Tally(filters)
    cap = LineCap(max_line)
    with open(path, "rb") as handle:
        handle.seek(start)
        tally.add_chunks(row_blocks(handle, cap, problems, delimiter, start, end))
    return tally.finish(), problems, cap.skipped


class ReaderFailed(OSError):
    """A forked reader ended without handing back its tally."""


def _fork(job: Tuple[str, int, int, str, Filters, int]) -> Tuple[int, int]:
    """A child that works ``job`` and writes its pickled result (or the exception it raised) to
    a pipe; returns (pid, the pipe's read end)."""
    import pickle

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                      # pragma: no cover - runs in the child (tests see its result)
        code = 0
        try:
            os.close(read_end)
            try:
                result = pickle.dumps((True, _work(job)), pickle.HIGHEST_PROTOCOL)
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


def _collect(pid: int, read_end: int) -> Tuple[Tally, List[str], int]:
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


def tally_file(path: str, filters: Filters, workers: int, problems: List[str],
               cap: Optional[LineCap] = None) -> Tally:
    """The tally of a whole file read by ``workers`` processes: this one reads the first range
    (and checks the header), forked children the others; lines past ``cap`` are counted into
    it."""
    cap = cap if cap is not None else LineCap()
    delimiter = detect_delimiter(_first_line(path))
    ranges = byte_ranges(path, workers)
    jobs = [(path, start, end, delimiter, filters, cap.cap) for start, end in ranges]
    # Forked before this process reads: the children share the imports and the page cache, and
    # this process does a share of the reading instead of waiting (no pool: its threads and
    # pipes cost more than a small job's reading).
    children = [_fork(job) for job in jobs[1:]]
    try:
        results = [_work(jobs[0])]
    except BaseException:
        for pid, read_end in children:                # this process's error is the one to tell
            _stop(pid, read_end)
        raise
    failure: Optional[BaseException] = None
    for pid, read_end in children:                    # every child reaped, the first failure raised
        try:
            results.append(_collect(pid, read_end))
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    total = results[0][0]                             # this process's own: the others merge into it
    for index, (tally, found, skipped) in enumerate(results):
        if index:
            total.merge(tally)
        problems.extend(found)
        cap.skipped += skipped
    return total
