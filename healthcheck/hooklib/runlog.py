"""A journal of hook runs: one JSON line per Prolog/Epilog/HealthCheckProgram run.

It is how an admin (and the lab's tests) can see that a hook really ran, on which node,
for which job, and what it concluded. One file per node keeps appends from several
slurmd on one host apart.

The journal is bounded: once ``<node>.jsonl`` reaches ``MAX_BYTES`` it becomes
``<node>.jsonl.1`` (replacing the previous one) and a fresh file starts, so a node keeps at
most about twice ``MAX_BYTES`` of history however long it runs. A hook that had the file open
when it rotated appends into ``.1``: nothing written is lost before the next rotation.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Iterator, List, Optional

from .. import __version__
from ..safeio.fsutil import append_line, ensure_dir, ensure_state_dir, locked, open_state_file, path_component

JOURNAL_DIR = "hook-runs"
ROTATED = ".1"
# ~2,500 entries of ~400 bytes: weeks of runs on a busy node; two files at most per node.
MAX_BYTES = 1024 * 1024


def journal_path(state_dir: str, node: str) -> str:
    """``<state_dir>/hook-runs/<node>.jsonl``; a node name unusable as a file name is a ValueError."""
    return os.path.join(state_dir, JOURNAL_DIR, f"{path_component(node)}.jsonl")


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def rotate_if_full(path: str, max_bytes: int = MAX_BYTES) -> bool:
    """Move a journal that reached ``max_bytes`` to ``<path>.1``; True when it did.

    The size is checked again under a lock, so hooks that race here rotate once."""
    if _size(path) < max_bytes:
        return False
    directory, name = os.path.split(path)
    with locked(os.path.join(directory, f".{name}.lock")):
        if _size(path) < max_bytes:
            return False
        os.replace(path, path + ROTATED)
    return True


def record_run(state_dir: str, hook: str, node: str, job_id: Optional[str] = None, *,
               max_bytes: int = MAX_BYTES, **detail: Any) -> Dict[str, Any]:
    # "version": which release ran (a rolling upgrade has several at once, one per node).
    entry: Dict[str, Any] = {"time": round(time.time(), 3), "hook": hook, "node": node,
                             "job_id": job_id, "pid": os.getpid(), "version": __version__}
    entry.update(detail)
    path = journal_path(state_dir, node)
    ensure_state_dir(state_dir)
    ensure_dir(os.path.dirname(path))
    rotate_if_full(path, max_bytes)
    append_line(path, json.dumps(entry, sort_keys=True))
    return entry


def journal_files(state_dir: str) -> List[str]:
    """Every journal file, per node the rotated one first (oldest entries first)."""
    directory = os.path.join(state_dir, JOURNAL_DIR)
    if not os.path.isdir(directory):
        return []
    names = set(os.listdir(directory))
    bases = sorted({n for n in names if n.endswith(".jsonl")} |
                   {n[:-len(ROTATED)] for n in names if n.endswith(".jsonl" + ROTATED)})
    ordered = []
    for base in bases:
        for name in (base + ROTATED, base):
            if name in names:
                ordered.append(os.path.join(directory, name))
    return ordered


def read_runs(state_dir: str) -> Iterator[Dict[str, Any]]:
    for path in journal_files(state_dir):
        try:
            fd = open_state_file(path, os.O_RDONLY, ours=False)
        except FileNotFoundError:
            continue  # rotated away between listing and opening
        except OSError:
            continue  # a FIFO, device or link in its place is not a journal: never hang on it
        with open(fd, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn line from a crash is skipped, not fatal
