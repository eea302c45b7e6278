"""The IMEX probe: the node's IMEX daemon (``nvidia-imex-ctl -q``, one word: READY when the
node's part of the IMEX domain is usable) and its IMEX channels (the device files
``<dev>/nvidia-caps-imex-channels/channelN`` jobs open to share GPU memory across the domain).

Reads and judges nothing else; run only where ``[[nodes]] imex_owned`` is true. The program runs
with an argument list, in its own session, killed as a group at the deadline.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional

from ..facts import ImexFacts
from ..safeio import programs

PROGRAM = "nvidia-imex-ctl"
CHANNELS_DIR = "nvidia-caps-imex-channels"
_CHANNEL = re.compile(r"channel(\d{1,4})")
_STATE = re.compile(r"[A-Z_]{1,40}")


def probe_imex(dev_root: str, timeout_s: float, programs_dir: Optional[str] = None) -> ImexFacts:
    facts = ImexFacts(channels=channels(dev_root))
    program = programs.find_program(PROGRAM, programs_dir)
    if program is None:
        facts.status, facts.message = "not_installed", f"{PROGRAM} not found"
        return facts
    try:
        done = programs.run([program, "-q"], timeout_s)
    except programs.CommandError as exc:
        facts.status, facts.message = ("timeout" if exc.timed_out else "error"), str(exc)
        return facts
    words = done.stdout.split()
    if not words or not _STATE.fullmatch(words[0]):
        facts.status = "error"
        facts.message = f"{PROGRAM} -q: exit {done.returncode}: {done.last_line()}"[:200]
        return facts
    facts.daemon = words[0]
    return facts


def channels(dev_root: str) -> List[int]:
    """N of every ``channelN`` under ``<dev_root>/nvidia-caps-imex-channels`` (names only: no
    device is opened)."""
    try:
        names = os.listdir(os.path.join(dev_root, CHANNELS_DIR))
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in (_CHANNEL.fullmatch(name) for name in names) if m)
