"""The kernel-log readers: Xid, SXid and fallen-off-the-bus events, read incrementally and flood-proof.

One module per concern: ``parser`` (a line -> an event), ``timestamps`` (line prefixes),
``scanner`` (finding candidate lines at grep speed), ``readers`` (choosing the source;
the readers ``kmsg``, ``journal`` and ``logfiles``),
``cursor`` (state between runs), ``flood`` (repeats and escalation) and ``api`` (what the health
check, the epilog and the CLI call). What an event means (the catalog, our Xid actions, events ->
findings) is in ``healthcheck/xid/``. See docs/kernel-log.md.

Names below load on first use, so importing one submodule does not import them all.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "read_new_events": "api", "events_between": "api", "scan_events": "api", "KernelLogRead": "api",
    "XidSettings": "api", "KernelLogError": "readers", "parse_line": "parser",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
