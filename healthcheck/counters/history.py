"""Counter history between runs: ``<state_dir>/counters/<node>.json``, the state file behind
the growth checks (the arithmetic is ``healthcheck/counters/growth_rate.py``).

``{"version": 1, "series": {KEY: [[unix_time, value], ...]}}``. Reading and saving are apart:
the runner loads the series for the checks, and the samples of this run are added only when
the caller commits, after it has acted on what the checks found.

Served (``healthcheck/watch/hookserver.py``): the hook server keeps the series of the files its
health-check children read, parsed and checked (``PARSED``, refreshed by ``refresh`` in the server
between requests), and a child forked from it takes them instead of parsing the file again only
when the file holds exactly the bytes they were parsed from: a copy is never stale, it is unused.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..safeio.fsutil import (FILE_MODE, atomic_write, ensure_dir, ensure_state_dir, locked, path_component,
                             read_state_bytes, state_json)
from .growth_rate import Series, add_samples
from ..safeio.jsontypes import is_number


def history_problem(doc: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a saved history; None when every sample is [time, value], both numbers."""
    series = doc.get("series")
    if not isinstance(series, dict):
        return "'series' is not an object"
    for key, samples in series.items():
        if not isinstance(samples, list):
            return f"series {key!r} is not a list"
        for sample in samples:
            if not (isinstance(sample, list) and len(sample) == 2 and all(is_number(x) for x in sample)):
                return f"series {key!r} holds {sample!r}, not [time, value]"
    return None


# The hook server's parsed copies: path -> (the file's bytes, the series parsed from exactly them).
PARSED: Dict[str, Tuple[bytes, Dict[str, Series]]] = {}
MAX_PARSED = 16
# path -> the file's lstat (``_stat_identity``) taken just before the bytes in PARSED were read:
# the server's idle refresh reads a file again only when that changed. Only the server's cost
# rides on it; what a child uses is decided by comparing bytes (``CounterHistory.load``).
SEEN: Dict[str, Tuple[int, ...]] = {}
READ: List[str] = []        # the histories this process loaded (a server's child tells the server)


def parse(doc: Dict[str, Any]) -> Dict[str, Series]:
    """The series of a checked history document."""
    return {key: [[float(t), float(v)] for t, v in value] for key, value in doc["series"].items()}


def refresh(paths) -> int:
    """In the hook server, between requests: keep each history's series parsed, for the bytes the
    file holds now (read as a run reads it; a file that is not a history is dropped, never set
    aside: that is its writer's). A file whose lstat is what it was when its kept bytes were read
    is not read again (the server refreshes twice a second when idle: a node's history is ~90 KB).
    Returns how many were parsed afresh."""
    parsed = 0
    for path in dict.fromkeys(paths):
        identity = _stat_identity(path)
        kept = PARSED.pop(path, None)
        seen = SEEN.pop(path, None)
        if identity is None:
            continue
        if kept is None or seen != identity:
            # Taken before the read: a write after it changes the lstat, and the next refresh reads.
            raw, _problem = read_state_bytes(path)
            if raw is None:
                continue
            if kept is None or kept[0] != raw:
                doc = state_json(path, raw, None, history_problem, read_only=True)
                if doc is None:
                    continue
                kept = (raw, parse(doc))
                parsed += 1
        PARSED[path], SEEN[path] = kept, identity
        while len(PARSED) > MAX_PARSED:
            oldest = next(iter(PARSED))
            PARSED.pop(oldest)
            SEEN.pop(oldest, None)
    return parsed


def _stat_identity(path: str) -> Optional[Tuple[int, ...]]:
    """What changes when a file is replaced, rewritten, re-owned or chmod-ed (ctime: also when its
    mtime was set back); None when there is nothing there."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _copy(series: Dict[str, Series]) -> Dict[str, Series]:
    return {key: [sample[:] for sample in value] for key, value in series.items()}


class CounterHistory:
    """One node's counter history in the state dir (mode 0640, never through a symlink)."""

    def __init__(self, state_dir: str, node: str):
        self.dir = os.path.join(state_dir, "counters")
        self.path = os.path.join(self.dir, f"{path_component(node)}.json")
        self._lock = os.path.join(self.dir, f".{node}.lock")
        self._loaded: Optional[Tuple[Tuple[int, ...], Dict[str, Series]]] = None

    def _identity(self) -> Optional[Tuple[int, ...]]:
        return _stat_identity(self.path)

    def load(self) -> Dict[str, Series]:
        """The saved series; none (a new baseline) when the file is absent or not ours, or set
        aside as ``<file>.corrupt`` when it does not match its schema."""
        identity = self._identity()
        raw, problem = read_state_bytes(self.path)
        if self.path not in READ:
            READ.append(self.path)
        kept = PARSED.get(self.path)
        if raw is not None and kept is not None and kept[0] == raw:
            series = _copy(kept[1])          # parsed and checked from these very bytes
        else:
            doc = state_json(self.path, raw, problem, history_problem)
            if doc is None:
                self._loaded = None
                return {}
            series = parse(doc)
        # Kept for ``record``: the same file (the commit of this run) is not read and checked again.
        self._loaded = (identity, series) if identity is not None else None
        return _copy(series)

    def record(self, samples: Mapping[str, Tuple[float, float]], now: float) -> None:
        """Add ``{key: (value, window_s)}`` at ``now`` (the commit of one run's samples). The file
        this instance loaded, when it is still the one there (same inode, size and mtime: every
        write replaces it), is not read again; any other is."""
        ensure_state_dir(os.path.dirname(self.dir))
        ensure_dir(self.dir)
        with locked(self._lock):
            loaded, self._loaded = self._loaded, None
            if loaded is not None and loaded[0] == self._identity():
                current = loaded[1]
            else:
                current = self.load()
                self._loaded = None
            series = add_samples(current, samples, now)
            atomic_write(self.path, json.dumps({"version": 1, "series": series}, separators=(",", ":")),
                         mode=FILE_MODE)
