"""A journal of hook runs: one JSON line per Prolog/Epilog/HealthCheckProgram run.

It is how an admin (and the lab's tests) can see that a hook really ran, on which node,
for which job, and what it concluded. One file per node keeps appends from several
slurmd on one host apart.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Iterator, Optional

from .fsutil import append_line, ensure_dir

JOURNAL_DIR = "hook-runs"


def journal_path(state_dir: str, node: str) -> str:
    safe = node.replace("/", "_") or "unknown"
    return os.path.join(state_dir, JOURNAL_DIR, f"{safe}.jsonl")


def record_run(state_dir: str, hook: str, node: str, job_id: Optional[str] = None,
               **detail: Any) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"time": round(time.time(), 3), "hook": hook, "node": node,
                             "job_id": job_id, "pid": os.getpid()}
    entry.update(detail)
    path = journal_path(state_dir, node)
    ensure_dir(os.path.dirname(path))
    append_line(path, json.dumps(entry, sort_keys=True))
    return entry


def read_runs(state_dir: str) -> Iterator[Dict[str, Any]]:
    directory = os.path.join(state_dir, JOURNAL_DIR)
    if not os.path.isdir(directory):
        return
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn line from a crash is skipped, not fatal
