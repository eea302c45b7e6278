"""What this project does about an Xid, weakest first, which of two is stronger, and what each
does to a node: data, ``healthcheck/data/xid-actions.tsv`` (the one Xid-to-drain rule every
hook and the job classification use).

The catalog's mapping, ``[xid] actions`` and ``[xid] escalate`` choose among these. Kept apart
from ``events`` (which re-exports them) so that validating a config does not build the
``XidEvent`` class: the prolog and epilog load the config on every job.
"""
from __future__ import annotations

from typing import Dict, Tuple

from ..safeio.datafiles import read_text


FINDINGS = ("none", "evidence", "drain")


def _rows() -> Tuple[Tuple[str, str, str], ...]:
    rows = []
    for line in read_text("xid-actions.tsv").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if cells[0] == "action":
            continue
        if len(cells) != 3 or cells[1] not in FINDINGS:
            raise ValueError(f"xid-actions.tsv: {line!r}: want action, finding ({'|'.join(FINDINGS)}), text")
        rows.append((cells[0], cells[1], cells[2]))
    return tuple(rows)


_ROWS = _rows()
XID_ACTIONS: Tuple[str, ...] = tuple(row[0] for row in _ROWS)
ACTION_TEXT: Dict[str, str] = {action: text for action, _, text in _ROWS}
_FINDING = {action: finding for action, finding, _ in _ROWS}

_STRENGTH = {action: rank for rank, action in enumerate(XID_ACTIONS)}


def finding_for(action: str) -> str:
    """What an Xid whose action is ``action`` becomes: none | evidence | drain (an unknown action
    drains: a code nobody mapped is never ignored)."""
    return _FINDING.get(action, "drain")


def drains(action: str) -> bool:
    """Whether an Xid whose action is ``action`` drains the node."""
    return finding_for(action) == "drain"


def strongest() -> str:
    """The strongest action: what an Xid gets until the catalog says otherwise."""
    return XID_ACTIONS[-1]


def stronger(first: str, second: str) -> str:
    """The stronger of two actions (weakest first in xid-actions.tsv)."""
    return first if _STRENGTH.get(first, len(XID_ACTIONS)) >= _STRENGTH.get(second, len(XID_ACTIONS)) else second


def action_rank(action: str) -> int:
    return _STRENGTH.get(action, len(XID_ACTIONS))
