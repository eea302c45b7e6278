"""What remediation did on a node, ever: the counters and the back-in-service histogram that the
health check writes every run (``health/outputs.py``). They live in the remediation ledger's file
under ``totals``: ``actions/ledger.py`` adds to them as it notes a reboot, a GPU reset, an
inspection or a return to service, and keeps them when an admin's resume starts the ledger's
counts again. Read here without the ledger's code (dataclasses, ~25 ms): a quiet health-check run
pays one open() of a file that most nodes do not have.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional

from ..plain import field, plain
from ..safeio.fsutil import path_component, read_state_json
from ..safeio.jsontypes import is_count

VERSION = 1          # the ledger file's format
# Upper bounds (seconds) of the back-in-service histogram's buckets: a reboot's minutes to a week
# in the repair queue; beyond the last, +Inf.
BACK_IN_SERVICE_BUCKETS = (600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0, 604800.0)
COUNTS = ("reboots", "resets", "inspections")


def ledger_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "remediate")


def ledger_path(state_dir: str, node: str) -> str:
    return os.path.join(ledger_dir(state_dir), f"{path_component(node)}.json")


def _empty_buckets() -> List[int]:
    return [0] * (len(BACK_IN_SERVICE_BUCKETS) + 1)


@plain
class RemedyTotals:
    reboots: int = 0                    # reboots asked
    resets: int = 0                     # GPU resets tried
    inspections: int = 0                # drains handed to a person (remediation gave up)
    back_in_service: List[int] = field(default_factory=_empty_buckets)   # per bucket, not cumulative; last +Inf
    back_in_service_sum: float = 0.0    # seconds from our drain to back in service, summed

    def observe_back_in_service(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        index = next((i for i, bound in enumerate(BACK_IN_SERVICE_BUCKETS) if seconds <= bound),
                     len(BACK_IN_SERVICE_BUCKETS))
        self.back_in_service[index] += 1
        self.back_in_service_sum += seconds

    def to_json(self) -> dict:
        return {"reboots": self.reboots, "resets": self.resets, "inspections": self.inspections,
                "back_in_service": list(self.back_in_service), "back_in_service_sum": self.back_in_service_sum}

    @classmethod
    def from_json(cls, data: Any) -> "RemedyTotals":
        """The totals a ledger file holds; what is missing or malformed starts at zero (never raises)."""
        if not isinstance(data, dict):
            return cls()
        totals = cls(**{name: data[name] for name in COUNTS if is_count(data.get(name))})
        buckets, total = data.get("back_in_service"), data.get("back_in_service_sum")
        if isinstance(buckets, list) and len(buckets) == len(totals.back_in_service) \
                and all(is_count(n) for n in buckets) and isinstance(total, (int, float)) \
                and not isinstance(total, bool) and total >= 0:
            totals.back_in_service, totals.back_in_service_sum = list(buckets), float(total)
        return totals


def read_totals(state_dir: str, node: str) -> RemedyTotals:
    """The node's totals, read only (a corrupt ledger is its writer's to set aside)."""
    data: Optional[dict] = read_state_json(ledger_path(state_dir, node), read_only=True, newest=VERSION)
    return RemedyTotals.from_json(data.get("totals") if data is not None else None)
