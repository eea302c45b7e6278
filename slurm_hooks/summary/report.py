"""A finished tally as the summary's JSON object (a contract: ``window``, ``jobs``,
``by_cause`` {CAUSE: {jobs, gpu_hours}}, ``by_node``, ``by_xid``, ``drained``; more keys may be
added, none renamed). Pure apart from reading the Xid catalog's data files."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from healthcheck.records.classes import is_hardware

from .offenders import OffenderRules, fleet_rates, rank_nodes
from .tally import Tally

DAY_BUCKETS_AFTER_HOURS = 72     # longer windows are drawn per day, shorter ones per hour


def _hours(seconds: float) -> float:
    return round(seconds / 3600.0, 3)


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def over_time(tally: Tally) -> Dict[str, Any]:
    """Endings per cause per hour, or per day for long windows (ordered by time)."""
    by_hour = tally.by_hour            # computed on each access: once here
    hours = sorted(by_hour)
    bucket, width = ("hour", 13) if len(hours) <= DAY_BUCKETS_AFTER_HOURS else ("day", 10)
    rows: Dict[str, Dict[str, List[float]]] = {}
    for hour in hours:
        row = rows.setdefault(hour[:width], {})
        for cause, (jobs, gpu_seconds, _) in by_hour[hour].items():
            cell = row.setdefault(cause, [0, 0.0])
            cell[0] += jobs
            cell[1] += gpu_seconds
    return {"bucket": bucket,
            "rows": [{"t": key, "jobs": {cause: int(cell[0]) for cause, cell in sorted(row.items())},
                      "gpu_hours": {cause: _hours(cell[1]) for cause, cell in sorted(row.items())}}
                     for key, row in rows.items()]}


def xid_rows(tally: Tally) -> List[Dict[str, Any]]:
    from healthcheck.xid.catalog import XidCatalog
    from healthcheck.xid.event_findings import ACTION_TEXT

    catalog = XidCatalog()
    rows = []
    for code, xid in tally.xids.items():
        entry = catalog.entry(code)
        action, _why = catalog.catalog_action(code)
        rows.append({"xid": code, "jobs": xid.jobs, "gpu_hours": _hours(xid.gpu_seconds),
                     "nodes": dict(sorted(xid.nodes.items(), key=lambda item: (-item[1], item[0]))),
                     "mnemonic": entry.mnemonic if entry else "not in NVIDIA's Xid catalog",
                     "description": entry.description if entry else "",
                     "action": action, "action_text": ACTION_TEXT.get(action, "no finding")})
    rows.sort(key=lambda row: (-row["jobs"], row["xid"]))
    return rows


def gpu_rows(tally: Tally) -> List[Dict[str, Any]]:
    rows = []
    for (node, gpu), per_xid in tally.gpus.items():
        rows.append({"node": node, "gpu": gpu, "endings": sum(per_xid.values()),
                     "xids": {str(code): count for code, count in sorted(per_xid.items()) if code >= 0}})
    rows.sort(key=lambda row: (-row["endings"], row["node"], row["gpu"]))
    return rows


def build(tally: Tally, window: Dict[str, Any], drained: List[Dict[str, Any]], notes: List[str],
          rules: Optional[OffenderRules] = None, source: str = "sacct") -> Dict[str, Any]:
    """The summary's JSON; ``rules``: ``[summary]``'s offender rules (None: the built-in ones)."""
    if rules is None:
        from healthcheck.config import Config

        rules = OffenderRules.from_config(Config.builtin())
    tally.finish()
    total_gpu = tally.gpu_seconds
    by_cause = {}
    causes = tally.by_cause             # computed on each access: once here
    for cause, (jobs, gpu_seconds, from_accounting) in sorted(causes.items(),
                                                                key=lambda item: (-item[1][0], item[0])):
        by_cause[cause] = {"jobs": int(jobs), "gpu_hours": _hours(gpu_seconds),
                           "hardware": is_hardware(cause),
                           "from_accounting": int(from_accounting),
                           "share_jobs": _share(jobs, tally.jobs),
                           "share_gpu_hours": _share(gpu_seconds, total_gpu)}
    window = dict(window)
    window.update({"first_end": tally.first_end or None, "last_end": tally.last_end or None})
    losses = sorted(tally.losses, reverse=True)
    return {
        "window": window,
        "jobs": tally.jobs,
        "by_cause": by_cause,
        "by_node": rank_nodes(tally.nodes, rules),
        "by_xid": xid_rows(tally),
        "drained": drained,
        "gpu_hours": _hours(total_gpu),
        "hardware": {"jobs": tally.hardware_jobs, "gpu_hours": _hours(tally.hardware_gpu_seconds),
                     "share_jobs": _share(tally.hardware_jobs, tally.jobs),
                     "share_gpu_hours": _share(tally.hardware_gpu_seconds, total_gpu)},
        "from_accounting": int(sum(slot[2] for slot in causes.values())),
        "by_gpu": gpu_rows(tally),
        "fleet": fleet_rates(tally.nodes),
        "offender_rules": {"min_events": rules.min_events, "ratio": rules.ratio, "max_p": rules.max_p},
        "over_time": over_time(tally),
        "largest_hardware_losses": [
            {"job": job, "name": name, "user": user, "nodes": nodes, "cause": cause,
             "gpu_hours": _hours(gpu_seconds)}
            for gpu_seconds, job, name, user, nodes, cause in losses],
        "unfinished": tally.unfinished,
        "filtered_out": tally.filtered_out,
        "set_aside": dict(sorted(tally.set_aside.items())),
        "source": source,
        "notes": list(notes),
    }


def top(rows: List[Dict[str, Any]], n: Optional[int]) -> List[Dict[str, Any]]:
    return rows if n is None else rows[:n]
