"""Age-based pruning of the state dir, by the tool itself: a node that runs for years keeps
``[retention]`` days of per-job records, health evidence and hook-run journals, no more.

What goes (``[retention]``, 0 keeps forever):

* ``jobs/<job id>/`` whose newest file is older than ``job_records_days``;
* ``health/<node>.evidence.jsonl`` and its rotated ``.1`` older than ``evidence_days``;
* ``hook-runs/<node>.jsonl`` and ``.1`` older than ``journal_days`` (the live one only when no
  hook wrote it for that long: a node renamed or gone).

The health check runs it as a post-decision step, at most once per ``every_s`` (a stamp file,
``<state_dir>/retention.stamp``), so its cost is one ``stat`` on almost every run. Nothing is
followed through a symbolic link; what cannot be removed is left for the next time. Nothing
else in the state dir (state, cursors, the outbox of undelivered entries) is touched.
"""
from __future__ import annotations

import os
import stat
import time
from typing import List, Optional

from ..config.settings import Retention
from ..plain import field, plain
from ..safeio.fsutil import atomic_write

DAY = 86400.0
STAMP = "retention.stamp"
JOBS_DIR = "jobs"
EVIDENCE = ("health", (".evidence.jsonl", ".evidence.jsonl.1"))
JOURNALS = ("hook-runs", (".jsonl", ".jsonl.1"))


@plain
class Pruned:
    jobs: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)


def _lstat(path: str) -> Optional[os.stat_result]:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _newest_mtime(directory: str) -> Optional[float]:
    """The newest mtime of the plain files directly in ``directory`` (None: not a plain dir)."""
    info = _lstat(directory)
    if info is None or not stat.S_ISDIR(info.st_mode):
        return None
    newest: Optional[float] = None           # the files' (the directory's own when it is empty)
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
    return info.st_mtime if newest is None else newest


def _remove_job_dir(directory: str) -> bool:
    """Remove a job's directory of plain files (anything else in it: left, and so is the dir)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False) or entry.is_symlink():
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
    try:
        os.rmdir(directory)
    except OSError:
        return False
    return True


def prune(state_dir: str, keep: Retention, now: float) -> Pruned:
    pruned = Pruned()
    if keep.job_records_days > 0:
        jobs = os.path.join(state_dir, JOBS_DIR)
        cutoff = now - keep.job_records_days * DAY
        if (_lstat(jobs) is not None) and stat.S_ISDIR(_lstat(jobs).st_mode):
            with os.scandir(jobs) as entries:
                names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
            for name in sorted(names):
                path = os.path.join(jobs, name)
                newest = _newest_mtime(path)
                if newest is not None and newest < cutoff and _remove_job_dir(path):
                    pruned.jobs.append(name)
    for days, (subdir, suffixes) in ((keep.evidence_days, EVIDENCE), (keep.journal_days, JOURNALS)):
        if days <= 0:
            continue
        directory = os.path.join(state_dir, subdir)
        info = _lstat(directory)
        if info is None or not stat.S_ISDIR(info.st_mode):
            continue
        cutoff = now - days * DAY
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(suffixes) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                        pruned.files.append(os.path.join(subdir, entry.name))
                except OSError:
                    continue
    return pruned


def due(state_dir: str, keep: Retention, now: float) -> bool:
    info = _lstat(os.path.join(state_dir, STAMP))
    return info is None or not stat.S_ISREG(info.st_mode) or now - info.st_mtime >= keep.every_s


def maybe_prune(state_dir: str, keep: Retention, now: Optional[float] = None) -> Optional[Pruned]:
    """Prune when the last pruning is ``every_s`` old (None: not due)."""
    now = time.time() if now is None else now
    if not due(state_dir, keep, now):
        return None
    atomic_write(os.path.join(state_dir, STAMP), f"{now:.0f}\n", durable=False)
    return prune(state_dir, keep, now)
