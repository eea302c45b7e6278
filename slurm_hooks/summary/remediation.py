"""Time back in service, per cause, from the remediation ledgers (``[remediate]``,
``healthcheck/actions/ledger.py``): how many of our drains ended back in service by
themselves, how many were drained for inspection, the reboots spent, and the median time from
the drain to back in service. Pure aggregation (``rows``) plus the one reader of the ledgers
under a state dir (``load_ledgers``): the ledgers are each node's, so the summary sees the nodes
whose state dir it can read (in the lab, every node; on a cluster, where state dirs are shared
or collected).
"""
from __future__ import annotations

import glob
import os
from statistics import median
from typing import Any, Dict, Iterable, List, Optional, Tuple


def load_ledgers(state_dir: str) -> List[Tuple[str, Any]]:
    """(node, Ledger) of every ledger under ``<state_dir>/remediate/``."""
    from healthcheck.actions import ledger as ledgers

    found = []
    for path in sorted(glob.glob(os.path.join(ledgers.ledger_dir(state_dir), "*.json"))):
        node = os.path.basename(path)[:-len(".json")]
        try:
            found.append((node, ledgers.load(state_dir, node)))
        except ValueError:          # a file name that is no node name
            continue
    return found


def rows(ledgers: Iterable[Tuple[str, Any]], since: Optional[float] = None,
         until: Optional[float] = None) -> Dict[str, Dict[str, Any]]:
    """Per cause (the drain's check id): drains that began in [since, until), how they ended."""
    by_cause: Dict[str, Dict[str, Any]] = {}
    spans: Dict[str, List[float]] = {}
    for _node, ledger in ledgers:
        for entry in ledger.entries.values():
            check = entry.cause.split(" ", 1)[0]
            for episode in entry.episodes:
                if (since is not None and episode.drained_at < since) or \
                        (until is not None and episode.drained_at >= until):
                    continue
                row = by_cause.setdefault(check, {"drains": 0, "back_in_service": 0, "inspect": 0, "open": 0,
                                                  "reboots": 0, "resets": 0})
                row["drains"] += 1
                row["reboots"] += len(episode.reboots)
                row["resets"] += len(episode.resets)
                if episode.outcome == "resumed" and episode.resumed_at is not None:
                    row["back_in_service"] += 1
                    spans.setdefault(check, []).append(max(0.0, episode.resumed_at - episode.drained_at))
                elif episode.outcome == "inspect":
                    row["inspect"] += 1
                else:
                    row["open"] += 1
    for check, row in by_cause.items():
        ended = row["back_in_service"] + row["inspect"]
        row["worked_share"] = round(row["back_in_service"] / ended, 4) if ended else None
        row["median_drain_to_service_s"] = round(median(spans[check]), 1) if spans.get(check) else None
    return dict(sorted(by_cause.items(), key=lambda item: (-item[1]["drains"], item[0])))
