"""The drain reason this tool writes into Slurm, and reading it back.

Format (version 1), one line, at most ``max_len`` characters (default 120, so ``sinfo -R -o %E``
shows it whole)::

    <prefix> v1 <check> <subject>[ <key>:<value>]...; <summary>
    gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; GPU 3 (0000:1b:00.0) has 2 double-bit ECC errors
    gpu-hooks: v1 kernel.xid gpu5 xid:79; Xid 79 (GPU fell off the bus) on GPU 5

* ``prefix`` is ``[drain] reason_prefix`` (default ``gpu-hooks:``): it alone says "ours".
* ``subject`` is ``gpuN``, ``<hca>:<port>``, or ``node`` for node-wide causes.
* ``key:value`` tokens carry the key number (``dbe:2``, ``xid:79``, ``rate:100``). No token
  holds ``=`` or spaces: ``scontrol show node -o`` splits its record at `` word=``.
* Everything after ``; `` is for people and may be cut to fit; it holds no ``=`` (written as ``:``).

A reason that starts with the prefix but does not parse is still ours (an older version wrote
it); its cause is then unknown (``check`` None).

Slurm adds to a reason of its own accord: ``scontrol reboot ASAP reason=<ours>`` shows
``<ours> : reboot issued`` once slurmctld has sent the reboot, and keeps it after the boot when
the drain survives (measured on 22.05.8, 24.11.5 and 26.05.5). Read back, that suffix is Slurm's,
not part of our summary (``SLURM_SUFFIXES``).
"""
from __future__ import annotations

import re
from .plain import field, plain
from typing import Dict, Optional

VERSION = "v1"

_TOKEN_SAFE = re.compile(r"[^A-Za-z0-9_.:/\-]")
# What slurmctld appends to a node's reason (measured in the lab: docs/slurm-versions.md).
SLURM_SUFFIXES = (" : reboot issued",)
_HEAD = re.compile(r"^v(?P<version>\d+) (?P<check>[a-z0-9_.]+) (?P<subject>\S+)(?P<keys>(?: [a-z_]+:\S+)*)(?:; (?P<summary>.*))?$")


@plain
class DrainReason:
    check: Optional[str]                      # None: ours, but not a format we can read
    subject: str = "node"
    keys: Dict[str, str] = field(default_factory=dict)
    summary: str = ""
    version: int = 1

    @property
    def xid(self) -> Optional[int]:
        value = self.keys.get("xid")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def cause(self) -> str:
        """What identifies one cause: the same cause is never drained twice."""
        return f"{self.check} {self.subject}" + (f" xid:{self.xid}" if self.xid is not None else "")


def _token(text: str) -> str:
    return _TOKEN_SAFE.sub("_", str(text)) or "_"


def format_reason(reason: DrainReason, prefix: str, max_len: int) -> str:
    """The reason text for ``scontrol update ... Reason=``; never longer than ``max_len`` (``prefix``
    and ``max_len``: ``[drain]``, ``config.settings.DrainSettings``)."""
    head = _head(reason, prefix, max_len)
    summary = " ".join(str(reason.summary).split())      # one line, no control characters
    summary = "".join(ch for ch in summary if ch.isprintable())
    # "scontrol show node -o" starts a new field at " word=": a summary that quotes text a user
    # chose (a process name) must not add fields (" State=IDLE") to what Slurm prints back.
    summary = summary.replace("=", ":")
    text = f"{head}; {summary}" if summary else head
    if len(text) <= max_len:
        return text
    room = max_len - len(head) - len("; ...")
    return f"{head}; {summary[:room].rstrip()}..." if room > 0 else head


def _head(reason: DrainReason, prefix: str, max_len: int) -> str:
    """``<prefix> v1 <check> <subject>[ <key>:<value>]...`` in at most ``max_len`` characters: the
    subject is cut to fit and a key token that does not fit whole is left out, so what is written
    still parses back to its check."""
    base = f"{prefix} {VERSION} {_token(reason.check or 'unknown')} "
    head = base + _token(reason.subject)[:max(1, max_len - len(base))]
    for key, value in reason.keys.items():
        token = f" {_token(key).lower()}:{_token(value)}"
        if len(head) + len(token) <= max_len:
            head += token
    return head[:max_len]


def is_ours(text: Optional[str], prefix: str) -> bool:
    return bool(text) and bool(prefix) and text.startswith(prefix)


def without_slurm_suffix(text: str) -> str:
    """``text`` without what slurmctld appended to it (``SLURM_SUFFIXES``, repeated or not)."""
    stripped = True
    while stripped:
        stripped = False
        for suffix in SLURM_SUFFIXES:
            if text.endswith(suffix):
                text, stripped = text[:-len(suffix)].rstrip(), True
    return text


def parse_reason(text: Optional[str], prefix: str) -> Optional[DrainReason]:
    """Our reason read back; None when ``text`` is not ours."""
    if not is_ours(text, prefix):
        return None
    rest = without_slurm_suffix(text[len(prefix):].strip())
    match = _HEAD.match(rest)
    if match is None:
        return DrainReason(check=None, subject="node", summary=rest, version=0)
    keys = {}
    for token in match.group("keys").split():
        key, _, value = token.partition(":")
        keys[key] = value
    return DrainReason(check=match.group("check"), subject=match.group("subject"), keys=keys,
                       summary=(match.group("summary") or "").rstrip("."), version=int(match.group("version")))
