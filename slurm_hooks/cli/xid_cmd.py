"""``slurm-gpu xid scan | explain``: kernel-log Xid events, and what each code means here."""
from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional

import click

from healthcheck.config import node_name

from ..summary.text import terminal_safe
from .common import config_option, fail, load_config, versioned

EXIT_UNREADABLE = 1

_RELATIVE = re.compile(r"-?\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hour|hours|d|day|days)(?:\s+ago)?", re.I)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400}
def parse_time(text: str, now: Optional[float] = None) -> float:
    """``--since``: @EPOCH, EPOCH, 2h / 30m / 1d (ago), or ISO 8601 (local time unless it says)."""
    now = time.time() if now is None else now
    cleaned = text.strip()
    if re.fullmatch(r"@?\d{9,11}(\.\d+)?", cleaned):
        return float(cleaned.lstrip("@"))
    relative = _RELATIVE.fullmatch(cleaned)
    if relative:
        return now - float(relative.group(1)) * _UNITS[relative.group(2).lower()]
    iso = cleaned.replace("Z", "+00:00") if cleaned.endswith("Z") else cleaned
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"--since {text!r}: not a time (use 2025-02-23T16:24:18, @1740327858 or 2h)") from None
    if moment.tzinfo is None:
        return time.mktime(moment.timetuple()) + moment.microsecond / 1e6
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) / timedelta(seconds=1)


def _when(event) -> str:
    if event.first_seen is not None:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(event.first_seen))
    if event.uptime is not None:
        return f"uptime={event.uptime:.6f}"
    return "-"


def format_event(event) -> str:
    where = event.pci or "-"
    if event.gpu is not None:
        where += f" gpu={event.gpu}"
    if event.gpu_instance is not None:
        where += f" gi={event.gpu_instance}"
    if event.compute_instance is not None:
        where += f" ci={event.compute_instance}"
    if event.device:
        where += f" {event.device}"
    parts = [_when(event), event.kind, str(event.code), where, f"action={event.action}",
             event.mnemonic or event.severity or "-"]
    if event.count > 1:
        parts.append(f"count={event.count}")
    if event.pid is not None:
        parts.append(f"pid={event.pid}")
    if event.process:
        parts.append(f"process={event.process}")
    return terminal_safe(" ".join(parts) + ": " + event.message)


@click.group()
def xid() -> None:
    """Scan kernel logs for Xid events and explain Xid codes (docs/xid.md).

    Example: slurm-gpu xid explain 79
    """


@xid.command()
@config_option
@click.option("--node", default=None, help="Whose configured log to read (default: this node).")
@click.argument("path", required=False, metavar="[PATH|-]")
@click.option("--since", "since_text", metavar="TIME",
              help="Only events from TIME on: 2025-02-23T16:24:18, @EPOCH, or 2h / 30m / 1d ago.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def scan(config_path: Optional[str], node: Optional[str], path: Optional[str], since_text: Optional[str],
         as_json: bool) -> None:
    """Print the Xid, SXid and fallen-off-the-bus events in a kernel log.

    PATH is a file (.gz too) or - for stdin; without PATH, this node's configured kernel log.
    Repeats are folded into one line with a count. A one-shot read: the health check's cursor
    is neither used nor moved.

    Example: slurm-gpu xid scan /var/log/kern.log --since 2h
    """
    from healthcheck.kernellog.api import scan_events
    from healthcheck.kernellog.readers import KernelLogError

    try:
        since = parse_time(since_text) if since_text else None
    except ValueError as exc:
        fail(str(exc))
    cfg = load_config(config_path)
    source = path if path else _configured_log(cfg, node)
    try:
        result = scan_events(source, since, config=cfg)
    except KernelLogError as exc:
        fail(terminal_safe(str(exc)), EXIT_UNREADABLE)
    except ValueError as exc:
        fail(terminal_safe(str(exc)))
    for event in result.events:
        click.echo(json.dumps(versioned(event.to_json())) if as_json else format_event(event))
    for problem in result.stats.problems:
        click.echo(f"slurm-gpu: {terminal_safe(problem)}", err=True)
    if result.stats.problems:
        raise click.exceptions.Exit(EXIT_UNREADABLE)


def _configured_log(cfg, node: Optional[str]) -> str:
    from healthcheck.sim.profile import ProfileError
    from healthcheck.sources import node_sources

    try:
        return node_sources(cfg, node_name(node)).kernel_log
    except ProfileError as exc:
        fail(terminal_safe(str(exc).splitlines()[0]))
    except (OSError, ValueError) as exc:
        fail(terminal_safe(f"cannot find this node's kernel log: {exc}"))
    except ImportError as exc:
        fail(f"cannot find this node's kernel log: {exc}")


_CODE = re.compile(r"(?:(sxid)[: ]?)?(\d{1,9})", re.I)


@xid.command()
@config_option
@click.argument("code", metavar="CODE")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (keys v, kind, code, in_catalog, mnemonic, description, nvidia_immediate, "
                   "nvidia_investigatory, action, action_text, why, config_override, escalation, recovery_actions, "
                   "sxid_actions, decode_rows).")
def explain(config_path: Optional[str], code: str, as_json: bool) -> None:
    """Explain an Xid code and what this project does about it.

    CODE is a number such as 79 (NVIDIA's catalog entry is printed), or sxid:20034 for an
    NVSwitch SXid.

    Example: slurm-gpu xid explain 48
    """
    from healthcheck.config.settings import XidSettings
    from healthcheck.xid.catalog import XidCatalog, override_key
    from healthcheck.xid.event_findings import ACTION_TEXT

    match = _CODE.fullmatch(code.strip())
    if not match:
        fail(f"{terminal_safe(code)!s} is not an Xid code: give a number such as 79, or sxid:20034")
    is_sxid, number = bool(match.group(1)), int(match.group(2))
    settings = XidSettings.from_config(load_config(config_path))
    catalog = XidCatalog(settings.overrides)
    lines: List[str] = []
    if is_sxid:
        lines += _explain_sxid(catalog, number)
        key = override_key("sxid", number)
    else:
        lines += _explain_xid(catalog, number)
        key = override_key("xid", number)
    override = settings.overrides.get(key)
    if override:
        meaning = ACTION_TEXT.get(override, "no finding")
        lines.append(f"  config override:      {override} ([xid] actions \"{key}\"), {meaning}")
    rule = settings.escalate.get(key)
    if rule:
        lines.append(f"  escalation:           {rule.count} occurrences on one GPU within {rule.window_s:g} s -> "
                     f"{rule.action} (lines within {rule.burst_s:g} s are one occurrence)")
    if as_json:
        click.echo(json.dumps(versioned(_explain_doc(catalog, is_sxid, number, override, rule)), sort_keys=False))
        return
    for line in lines:
        click.echo(terminal_safe(line))


def _mapped(table) -> Dict[str, Dict[str, str]]:
    return {key: {"action": mapped.action, "why": mapped.why} for key, mapped in table.items()}


def _explain_doc(catalog, is_sxid: bool, code: int, override: Optional[str], rule) -> Dict[str, Any]:
    """``xid explain --json``: the same facts as the text, as data."""
    from healthcheck.xid.event_findings import ACTION_TEXT

    doc: Dict[str, Any] = {"kind": "sxid" if is_sxid else "xid", "code": code}
    if is_sxid:
        doc.update(in_catalog=False, sxid_actions=_mapped(catalog.sxid_actions()))
    else:
        entry = catalog.entry(code)
        action, why = catalog.catalog_action(code)
        doc.update(in_catalog=entry is not None,
                   mnemonic=entry.mnemonic if entry else None,
                   description=entry.description if entry else None,
                   nvidia_immediate=(entry.immediate_action or None) if entry else None,
                   nvidia_investigatory=(entry.investigatory_action or None) if entry else None,
                   action=action, action_text=ACTION_TEXT.get(action, "no finding"), why=why,
                   recovery_actions=_mapped(catalog.recovery_actions()) if code == 154 else None,
                   decode_rows=len(catalog.decode.get(code, [])))
    doc["config_override"] = override or None
    doc["escalation"] = ({"count": rule.count, "window_s": rule.window_s, "burst_s": rule.burst_s,
                          "action": rule.action} if rule else None)
    return doc


def _explain_xid(catalog, code: int) -> List[str]:
    from healthcheck.xid.event_findings import ACTION_TEXT

    entry = catalog.entry(code)
    action, why = catalog.catalog_action(code)
    if entry is None:
        lines = [f"Xid {code}: not in NVIDIA's Xid catalog"]
    else:
        lines = [f"Xid {code}: {entry.mnemonic}",
                 f"  description:          {entry.description}",
                 f"  NVIDIA immediate:     {entry.immediate_action or '(none given)'}",
                 f"  NVIDIA investigatory: {entry.investigatory_action or '(none given)'}"]
    lines.append(f"  this project:         {action} ({ACTION_TEXT.get(action, 'no finding')})")
    lines.append(f"  because:              {why}")
    if code == 154:
        lines.append("  the line carries the new recovery action; this project then does:")
        for value, mapped in sorted(catalog.recovery_actions().items(), key=lambda item: int(item[0])):
            lines.append(f"    {value}: {mapped.action:<16} {mapped.why}")
    if code in catalog.decode:
        rows = catalog.decode[code]
        units = sorted({row.unit for row in rows})
        lines.append(f"  refined per line by the 144-150 decode table ({len(rows)} rows; units {', '.join(units)}):")
        lines.append("    the error status in \"(intrinfo status ...)\" picks the row; no match keeps the action above")
    return lines


def _explain_sxid(catalog, code: int) -> List[str]:
    lines = [f"SXid {code}: an NVSwitch error (NVIDIA's Fabric Manager guide lists SXids; no catalog ships here)",
             "  this project acts on the severity the line gives:"]
    for severity, mapped in catalog.sxid_actions().items():
        lines.append(f"    {severity:<12} {mapped.action:<16} {mapped.why}")
    return lines
