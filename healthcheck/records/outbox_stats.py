"""What monitoring reads of the outbox (``outbox``: the queue of AdminComment entries), kept apart
so that the health check, which says it in its metrics every run, loads nothing of the delivery:
the directory listing, one lstat per queued entry, and the count of failed deliveries that the
delivery keeps beside the queue."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from ..plain import plain
from ..safeio import fsutil
from ..safeio.jsontypes import is_count

OUTBOX_DIR = "outbox"


def outbox_dir(state_dir: str) -> str:
    return os.path.join(state_dir, OUTBOX_DIR)


def is_queue_file(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")



FAILURES_FILE = ".failures.json"
FAILURES_VERSION = 1


@plain
class QueueStats:
    """The queue as the health check's metrics say it: entries waiting, the age of the oldest (its
    file's mtime: when it was queued, or queued again for an amended record) and the deliveries
    that failed on this host, ever (``FAILURES_FILE``)."""
    entries: int = 0
    oldest_age_s: float = 0.0
    failures: int = 0


def queue_stats(state_dir: str, now: Optional[float] = None) -> QueueStats:
    """The directory listing, one lstat per queued entry and the failure count's small file: never
    an entry's JSON (the health check runs this every run; an empty queue costs one listdir)."""
    directory = outbox_dir(state_dir)
    try:
        names = os.listdir(directory)
    except OSError:
        return QueueStats()
    queued: List[float] = []
    for name in names:
        if is_queue_file(name):
            try:
                queued.append(os.lstat(os.path.join(directory, name)).st_mtime)
            except OSError:
                pass            # delivered meanwhile
    failures = _read_failures(state_dir) if FAILURES_FILE in names else 0
    now = time.time() if now is None else now
    return QueueStats(len(queued), max(0.0, now - min(queued)) if queued else 0.0, failures)


def _failures_path(state_dir: str) -> str:
    return os.path.join(outbox_dir(state_dir), FAILURES_FILE)


def _failures_problem(data: Dict[str, Any]) -> Optional[str]:
    return None if is_count(data.get("failures")) else "failures is not a count"


def _read_failures(state_dir: str) -> int:
    data = fsutil.read_state_json(_failures_path(state_dir), _failures_problem, read_only=True,
                                  newest=FAILURES_VERSION)
    return data["failures"] if data is not None else 0


def count_failures(state_dir: str, failed: int) -> None:
    """Add ``failed`` to the host's delivery failures (under the queue's lock). A full disk loses
    the count, never an entry; a newer version's file is left as it is."""
    path = _failures_path(state_dir)
    try:
        data = fsutil.read_state_json(path, _failures_problem, newest=FAILURES_VERSION) or {}
        fsutil.atomic_write(path, json.dumps({"version": FAILURES_VERSION,
                                              "failures": data.get("failures", 0) + failed}) + "\n", durable=False)
    except OSError as exc:
        print(f"slurm-gpu-hooks: outbox failure count not saved: {exc}", file=sys.stderr)
