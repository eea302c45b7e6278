"""What this project does about an Xid, weakest first, and which of two is stronger.

The catalog's mapping, ``[xid] actions`` and ``[xid] escalate`` choose among these. Kept apart
from ``events`` (which re-exports them) so that validating a config does not build the
``XidEvent`` class: the prolog and epilog load the config on every job.
"""
from __future__ import annotations

XID_ACTIONS = ("ignore", "job", "reset_gpu", "reboot", "contact_support")

_STRENGTH = {action: rank for rank, action in enumerate(XID_ACTIONS)}


def stronger(first: str, second: str) -> str:
    """The stronger of two actions (ignore < job < reset_gpu < reboot < contact_support)."""
    return first if _STRENGTH.get(first, len(XID_ACTIONS)) >= _STRENGTH.get(second, len(XID_ACTIONS)) else second


def action_rank(action: str) -> int:
    return _STRENGTH.get(action, len(XID_ACTIONS))
