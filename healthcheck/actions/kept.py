"""What must outlive a boot, kept with the node in Slurm: the reboots remediation asked, per fault
signature, in the node's ``Extra`` field.

A stateless node (``/var`` in RAM, as Warewulf boots it) loses the remediation ledger at every
boot, and with it the count that stops a lemon GPU after ``max_reboots``. Slurm keeps a node's
``Extra`` across the node's reboots and slurmctld's restarts (measured per release:
docs/slurm-versions.md), and only root sets it, so the count lives there too; the ledger stays a
local cache of it. Ours is one token of the field, ``sgh-reboots:<sig>@<t>.<t>/<sig>@<t>``
(``<sig>``: 8 hex digits of the signature's SHA-256, ``<t>``: whole seconds since the epoch),
merged into what is there: another tool's words are kept as they are, in their order; a field
that is a JSON object (``--extra`` constraints) gets our token as its ``sgh-reboots`` key.

Pure: the caller reads the field (``NodeInfo.extra``) and writes it through the gate.
"""
from __future__ import annotations

import json
import re
from typing import Dict, List, Sequence

from ..safeio.sha256 import sha256

KEY = "sgh-reboots"
TOKEN = KEY + ":"
# Signatures kept, and times per signature: the field stays short whatever happens (a window
# holds at most max_reboots times that count).
MAX_SIGNATURES = 4
MAX_TIMES = 8
_BODY = re.compile(r"^[0-9a-f]{8}@[0-9]{1,12}(\.[0-9]{1,12})*(/[0-9a-f]{8}@[0-9]{1,12}(\.[0-9]{1,12})*)*$")

Kept = Dict[str, List[int]]        # signature key -> reboot times


def key_of(signature: str) -> str:
    """The signature as the field holds it (a GPU UUID and a cause would not fit)."""
    return sha256(signature.encode("utf-8", "replace")).hexdigest()[:8]


def _json_object(extra: str):
    text = extra.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _parse_body(body: str) -> Kept:
    if not _BODY.match(body):
        return {}
    kept: Kept = {}
    for part in body.split("/"):
        sig, _, times = part.partition("@")
        kept[sig] = [int(t) for t in times.split(".")]
    return kept


def reboots_kept(extra: str) -> Kept:
    """Our reboot times per signature key from the node's Extra ({} when none, or not ours)."""
    obj = _json_object(extra)
    if obj is not None:
        value = obj.get(KEY)
        return _parse_body(value) if isinstance(value, str) else {}
    for word in extra.split():
        if word.startswith(TOKEN):
            return _parse_body(word[len(TOKEN):])
    return {}


def times_for(extra: str, signature: str) -> List[int]:
    return list(reboots_kept(extra).get(key_of(signature), []))


def _body(kept: Kept) -> str:
    return "/".join(f"{sig}@{'.'.join(str(t) for t in times)}" for sig, times in kept.items() if times)


def with_reboots(extra: str, kept: Kept) -> str:
    """The node's Extra with our token replaced by ``kept`` (removed when it holds nothing)."""
    trimmed = {sig: sorted(times)[-MAX_TIMES:] for sig, times in kept.items() if times}
    newest = sorted(trimmed, key=lambda sig: trimmed[sig][-1])[-MAX_SIGNATURES:]
    body = _body({sig: trimmed[sig] for sig in trimmed if sig in newest})
    obj = _json_object(extra)
    if obj is not None:
        obj.pop(KEY, None)
        if body:
            obj[KEY] = body
        return json.dumps(obj, separators=(",", ":")) if obj else ""
    words = [word for word in extra.split() if not word.startswith(TOKEN)]
    if body:
        words.append(TOKEN + body)
    return " ".join(words)


def noting_reboot(extra: str, signature: str, at: float, window_s: float) -> str:
    """The field once a reboot for ``signature`` is asked at ``at``: that signature's times within
    the window, plus this one; other signatures' times outside the window go."""
    kept = {sig: [t for t in times if at - t < window_s] for sig, times in reboots_kept(extra).items()}
    kept.setdefault(key_of(signature), []).append(int(at))
    return with_reboots(extra, kept)


def forgetting(extra: str, signatures: Sequence[str] = ()) -> str:
    """The field once an admin looked (``slurm-gpu resume``): those signatures' counts go (all of
    ours when none is named)."""
    if not signatures:
        return with_reboots(extra, {})
    drop = {key_of(signature) for signature in signatures}
    return with_reboots(extra, {sig: times for sig, times in reboots_kept(extra).items() if sig not in drop})
