"""A large saved accounting file (``--input FILE``) read by several processes at once.

The file is cut into byte ranges that begin at line starts; each worker (forked) reads its
range with the same reader and tally as one process would, and the tallies are merged. Every
line falls in exactly one range, so the result equals a single pass. Worth it only for big
plain files: stdin, ``.gz``, small files and ``--jobs`` (rows in file order) take one pass.
"""
from __future__ import annotations

import multiprocessing
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


def tally_file(path: str, filters: Filters, workers: int, problems: List[str],
               cap: Optional[LineCap] = None) -> Tally:
    """The tally of a whole file read by ``workers`` processes (header checked once, by the
    first range's reader); lines past ``cap`` are counted into it."""
    cap = cap if cap is not None else LineCap()
    delimiter = detect_delimiter(_first_line(path))
    ranges = byte_ranges(path, workers)
    jobs = [(path, start, end, delimiter, filters, cap.cap) for start, end in ranges]
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        results = pool.map(_work, jobs, chunksize=1)
    total = Tally(filters)
    for tally, found, skipped in results:
        total.merge(tally)
        problems.extend(found)
        cap.skipped += skipped
    return total
