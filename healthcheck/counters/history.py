"""Counter history between runs: ``<state_dir>/counters/<node>.json``, the state file behind
the growth checks (the arithmetic is ``healthcheck/counters/growth_rate.py``).

``{"version": 1, "series": {KEY: [[unix_time, value], ...]}}``. Reading and saving are apart:
the runner loads the series for the checks, and the samples of this run are added only when
the caller commits, after it has acted on what the checks found.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ..safeio.fsutil import FILE_MODE, atomic_write, ensure_dir, ensure_state_dir, locked, path_component, read_state_json
from .growth_rate import Series, add_samples
from ..safeio.jsontypes import is_number

VERSION = 1        # of the file's format; a newer one (a rollback) is left as it is


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


class CounterHistory:
    """One node's counter history in the state dir (mode 0640, never through a symlink)."""

    def __init__(self, state_dir: str, node: str):
        self.dir = os.path.join(state_dir, "counters")
        self.path = os.path.join(self.dir, f"{path_component(node)}.json")
        self._lock = os.path.join(self.dir, f".{node}.lock")
        self._loaded: Optional[Tuple[Tuple[int, ...], Dict[str, Series]]] = None

    def _identity(self) -> Optional[Tuple[int, ...]]:
        """What changes when the file is replaced, rewritten, re-owned or chmod-ed (ctime: also
        when its mtime was set back); None when there is nothing there."""
        try:
            info = os.lstat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino, info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def load(self) -> Dict[str, Series]:
        """The saved series; none (a new baseline) when the file is absent or not ours, or set
        aside as ``<file>.corrupt`` when it does not match its schema. A newer format raises
        ``NewerFormat`` (an OSError): growth is not judged, and nothing is written over it."""
        identity = self._identity()
        doc = read_state_json(self.path, history_problem, newest=VERSION)
        if doc is None:
            self._loaded = None
            return {}
        series = {key: [[float(t), float(v)] for t, v in value] for key, value in doc["series"].items()}
        # Kept for ``record``: the same file (the commit of this run) is not read and checked again.
        self._loaded = (identity, series) if identity is not None else None
        return {key: [sample[:] for sample in value] for key, value in series.items()}

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
            atomic_write(self.path, json.dumps({"version": VERSION, "series": series}, separators=(",", ":")),
                         mode=FILE_MODE)
