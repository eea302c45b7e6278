"""node_exporter's textfile: the Prometheus exposition lines of a node's metric families and
their one writer. The health check (``health/outputs.py``) and ``slurm-gpu-watch``
(``watch/series.py``) each write their own file into ``[health] textfile_dir`` through it, so
both files have the same format, the same atomic write and the same modes: the watcher may not
import the health check's code (it decides nothing), hence this home below both.
"""
from __future__ import annotations

import os
import stat
from typing import Dict, List, Optional, Tuple

from ..plain import plain
from .fsutil import DIR_MODE, atomic_write, ensure_dir

TEXTFILE_MODE = 0o644          # node_exporter runs as its own user
TEXTFILE_DIR_MODE = 0o755      # ... and must traverse the directory

Sample = Tuple[Dict[str, str], float]


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(node: str, labels: Dict[str, str]) -> str:
    # "node", as Slurm's own OpenMetrics endpoint names it, first on every sample.
    return ",".join(f'{key}="{_label(val)}"' for key, val in {"node": node, **labels}.items())


def number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


@plain
class Family:
    name: str
    kind: str                    # gauge | counter | histogram
    help: str
    samples: List[Sample]        # a histogram's: its cumulative buckets, each labelled le
    # A histogram's sum and count (its _sum and _count series).
    observed: Optional[Tuple[float, int]] = None

    def series_names(self) -> List[str]:
        """The names its samples have in the textfile (a histogram's three series)."""
        if self.kind == "histogram":
            return [f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count"]
        return [self.name]

    def lines(self, node: str) -> List[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        name = self.series_names()[0]
        for labels, value in self.samples:
            out.append(f"{name}{{{_labels(node, labels)}}} {number(value)}")
        if self.observed is not None:
            total, count = self.observed
            out += [f"{self.name}_sum{{{_labels(node, {})}}} {number(total)}",
                    f"{self.name}_count{{{_labels(node, {})}}} {number(count)}"]
        return out


def exposition(families: List[Family], node: str) -> str:
    """The textfile's content: every family's HELP, TYPE and samples, each labelled ``node``."""
    lines: List[str] = []
    for family in families:
        lines += family.lines(node)
    return "\n".join(lines) + "\n"


def publish(directory: str, filename: str, text: str, explicit: bool = True) -> List[str]:
    """Write ``text`` as ``directory/filename`` atomically (node_exporter never reads half of it),
    mode 0644 whatever the umask. A configured directory that is missing is made 0755
    (node_exporter runs as its own user and must traverse it); one it cannot traverse is
    returned as a problem (one line) each time. ``explicit=False``: the fallback under the
    state dir, made 0750 like the rest of it. Raises OSError when the file cannot be written."""
    ensure_dir(directory, TEXTFILE_DIR_MODE if explicit else DIR_MODE)
    atomic_write(os.path.join(directory, filename), text, mode=TEXTFILE_MODE, durable=False)
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if explicit and mode & 0o005 != 0o005:
        return [f"metrics textfile directory {directory} is mode {mode:04o}: node_exporter (its own user) "
                "cannot read it; make it 0755"]
    return []
