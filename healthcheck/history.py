"""Counter history between runs: ``<state_dir>/counters/<node>.json``, the state file behind
the growth checks (the arithmetic is ``healthcheck/growth.py``).

``{"version": 1, "series": {KEY: [[unix_time, value], ...]}}``. Reading and saving are apart:
the runner loads the series for the checks, and the samples of this run are added only when
the caller commits, after it has acted on what the checks found.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Mapping, Tuple

from .fsutil import FILE_MODE, atomic_write, ensure_dir, locked, path_component, read_state_json
from .growth import Series, add_samples


class CounterHistory:
    """One node's counter history in the state dir (mode 0640, never through a symlink)."""

    def __init__(self, state_dir: str, node: str):
        self.dir = os.path.join(state_dir, "counters")
        self.path = os.path.join(self.dir, f"{path_component(node)}.json")
        self._lock = os.path.join(self.dir, f".{node}.lock")

    def load(self) -> Dict[str, Series]:
        """The saved series; none (a new baseline) when the file is absent, torn or not ours."""
        doc = read_state_json(self.path)
        series = doc.get("series") if doc is not None else None
        if not isinstance(series, dict):
            return {}
        return {key: [list(map(float, s)) for s in value if isinstance(s, list) and len(s) == 2]
                for key, value in series.items() if isinstance(value, list)}

    def record(self, samples: Mapping[str, Tuple[float, float]], now: float) -> None:
        """Add ``{key: (value, window_s)}`` at ``now`` (the commit of one run's samples)."""
        ensure_dir(self.dir)
        with locked(self._lock):
            series = add_samples(self.load(), samples, now)
            atomic_write(self.path, json.dumps({"version": 1, "series": series}, separators=(",", ":")),
                         mode=FILE_MODE)
