"""This tool's entries in a job's AdminComment (``sacct -o AdminComment`` shows them).

An entry is ``SGH1:`` followed by one compact JSON object (ASCII only, no newline)::

    SGH1:{"v":1,"node":"gpu2","class":"GPU_LOST","gpu":3,"xid":79,"t":1764480000}
    SGH1:{"v":1,"node":"*","class":"COMPLETED","nodes":"gpu[1-3]","t":1764480000}

* ``node`` is the node the entry speaks for; ``"*"`` is the job-level entry (EpilogSlurmctld).
  ``run`` (absent for a job's first run) is the restart count of a requeued job's later run: each
  run's ending is its own entry (one per node and run).
* ``class`` is one of ``records.classes.CLASSES``; other keys are compact evidence (``gpu``,
  ``xid``, ``check``, ``exit``, ``signal``, ``msg``, ``oom``: which GPU out-of-memory message);
  the full evidence stays in the node's record.
* ``sacctmgr`` (the only way to set it once the job is COMPLETING) stores the value lower-cased
  with every ``"`` and ``'`` turned into a backtick (measured on 22.05.8). ``encode`` escapes
  backticks and apostrophes inside strings, so a stored entry reads back exactly: the reader
  finds the tag in any case, takes backticks for quotes, and upper-cases ``class``. Strings
  (node names, messages) come back lower-cased.
* The field is shared: other tools write there too (Princeton's jobstats writes ``JS1:<base64>``).
  ``merge`` keeps every byte that is not one of our entries, replaces our entry for the same
  ``node`` and ``run``, and separates entries by one space. Entries are found by parsing JSON from each
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
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=True, sort_keys=False)
    # Only strings can hold these; escaped, a backtick in the stored text is always a quote.
    return TAG + text.replace("`", "\\u0060").replace("'", "\\u0027")


def _scan(text: str) -> Tuple[List[Dict[str, Any]], List[Tuple[int, int]]]:
    """Our entries in ``text`` and their (start, end) spans."""
    entries, spans = [], []
    position = 0
    folded = text.lower()
    quoted = text.replace("`", '"')         # sacctmgr's form; same length, so spans hold
    tag = TAG.lower()
    while True:
        start = folded.find(tag, position)
        if start < 0:
            break
        try:
            value, end = _DECODER.raw_decode(quoted, start + len(TAG))
        except ValueError:
            position = start + len(TAG)
            continue
        if isinstance(value, dict) and isinstance(value.get("class"), str):
            value["class"] = value["class"].upper()
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
    replacing = {_node(entry) for entry in new_entries}
    kept = [entry for entry in parse(existing) if _node(entry) not in replacing]
    parts = [others(existing)] + [encode(entry) for entry in kept + list(new_entries)]
    return " ".join(part for part in parts if part)


def contains(text: Optional[str], entry: Dict[str, Any]) -> bool:
    """``entry`` (by node and class) is present: a write that raced with another was kept."""
    return any(_node(e) == _node(entry) and e.get("class") == str(entry.get("class")).upper()
               for e in parse(text))


def _node(entry: Dict[str, Any]) -> str:
    """What one entry speaks for: its node, and its run for a requeued job's later runs (``run``)."""
    run = entry.get("run") or 0
    return str(entry.get("node")).lower() + (f"#{run}" if run else "")


def as_stored_by_sacctmgr(text: str) -> str:
    """What ``sacctmgr ... set AdminComment=TEXT`` stores on 22.05 (lower case, quotes as backticks):
    the writer compares against this, and tests use it as the real format."""
    return text.lower().replace('"', "`").replace("'", "`")
