"""This tool's entries in a job's AdminComment (``sacct -o AdminComment`` shows them).

An entry is ``SGH1:`` followed by one compact JSON object (ASCII only, no newline)::

    SGH1:{"v":1,"node":"gpu2","class":"GPU_LOST","gpu":3,"xid":79,"t":1764480000}
    SGH1:{"v":1,"node":"*","class":"COMPLETED","nodes":"gpu[1-3]","t":1764480000}

* ``node`` is the node the entry speaks for; ``"*"`` is the job-level entry (EpilogSlurmctld).
* ``class`` is one of ``records.classes.CLASSES``; other keys are compact evidence (``gpu``,
  ``xid``, ``check``, ``exit``, ``signal``, ``msg``); the full evidence stays in the node's record.
* The field is shared: other tools write there too (Princeton's jobstats writes ``JS1:<base64>``).
  ``merge`` keeps every byte that is not one of our entries, replaces our entry for the same
  ``node``, and separates entries by one space. Entries are found by parsing JSON from each
  ``SGH1:``, so a JSON string that contains spaces or "SGH1:" cannot confuse the reader.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

TAG = "SGH1:"
VERSION = 1
_DECODER = json.JSONDecoder()


def encode(entry: Dict[str, Any]) -> str:
    body = {"v": VERSION}
    body.update(entry)
    return TAG + json.dumps(body, separators=(",", ":"), ensure_ascii=True, sort_keys=False)


def _scan(text: str) -> Tuple[List[Dict[str, Any]], List[Tuple[int, int]]]:
    """Our entries in ``text`` and their (start, end) spans."""
    entries, spans = [], []
    position = 0
    while True:
        start = text.find(TAG, position)
        if start < 0:
            break
        try:
            value, end = _DECODER.raw_decode(text, start + len(TAG))
        except ValueError:
            position = start + len(TAG)
            continue
        if isinstance(value, dict) and isinstance(value.get("class"), str):
            entries.append(value)
            spans.append((start, end))
        position = end
    return entries, spans


def parse(text: Optional[str]) -> List[Dict[str, Any]]:
    """Every entry of ours in an AdminComment (oldest first); damaged ones are skipped."""
    return _scan(text or "")[0]


def others(text: Optional[str]) -> str:
    """What the field holds that is not ours (jobstats' blob, an admin's note), verbatim."""
    text = text or ""
    _, spans = _scan(text)
    kept, position = [], 0
    for start, end in spans:
        kept.append(text[position:start])
        position = end
    kept.append(text[position:])
    return " ".join(part.strip() for part in kept if part.strip())


def merge(existing: Optional[str], new_entries: List[Dict[str, Any]]) -> str:
    """The AdminComment after adding ``new_entries``: others' text kept, ours per node replaced."""
    replacing = {str(entry.get("node")) for entry in new_entries}
    kept = [entry for entry in parse(existing) if str(entry.get("node")) not in replacing]
    parts = [others(existing)] + [encode(entry) for entry in kept + list(new_entries)]
    return " ".join(part for part in parts if part)


def contains(text: Optional[str], entry: Dict[str, Any]) -> bool:
    """``entry`` (by node and class) is present: a write that raced with another was kept."""
    return any(str(e.get("node")) == str(entry.get("node")) and e.get("class") == entry.get("class")
               for e in parse(text))
