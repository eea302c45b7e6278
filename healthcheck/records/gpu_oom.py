"""GPU out-of-memory evidence in a job's own output: known messages, matched as data. Pure.

The driver and NVML report nothing when a CUDA allocation fails: it is an error code returned
to the application (``cudaErrorMemoryAllocation``), not an Xid (NVIDIA's catalog has none for
memory exhaustion; Xid 31 is a page fault, 94/95 are ECC errors). So the only witness is what
the application printed. ``healthcheck/data/gpu-oom-signatures.tsv`` lists the messages of
PyTorch, the CUDA runtime and driver API, and NCCL; a line of the job's output that contains
one of them (a plain substring: no regular expression runs on what a user wrote) is evidence::

    {"kind": "gpu_oom", "source": "job_output", "stream": "stderr", "signature": "pytorch",
     "line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. ..."}

The line is kept escaped (control characters as ``\\xNN``) and cut to ``LINE_SHOWN`` characters:
it is the user's text, shown later on an admin's terminal.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..safeio import datafiles

SIGNATURES_FILE = "gpu-oom-signatures.tsv"
LINE_SHOWN = 200
KIND = "gpu_oom"
SOURCE_JOB_OUTPUT = "job_output"


@dataclass(frozen=True)
class Signature:
    name: str
    text: str


def parse_signatures(text: str) -> Tuple[Signature, ...]:
    """``name<TAB>text`` lines; ``#`` comments and blank lines skipped. A malformed line is an error
    (the file ships with the package: a broken one is a bug to see, not to skip)."""
    found: List[Signature] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, needle = line.partition("\t")
        if not sep or not name.strip() or not needle.strip():
            raise ValueError(f"{SIGNATURES_FILE}:{number}: expected 'name<TAB>text'")
        found.append(Signature(name.strip(), needle.strip()))
    return tuple(found)


@functools.lru_cache(maxsize=1)
def signatures() -> Tuple[Signature, ...]:
    return parse_signatures(datafiles.read_text(SIGNATURES_FILE))


def shown(line: str, limit: int = LINE_SHOWN) -> str:
    """``line`` safe to print: control and other unprintable characters escaped, at most ``limit``
    characters (an ellipsis marks a cut)."""
    out = []
    for char in line.strip():
        if char.isprintable():
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}")
    text = "".join(out)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def lines_of(tail: bytes, truncated: bool) -> List[str]:
    """The whole lines of a file's tail. When the tail starts inside the file its first line is a
    fragment and is dropped. Carriage returns (progress bars) split lines too."""
    text = tail.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if truncated and lines:
        lines = lines[1:]
    return lines


def find(tail: bytes, truncated: bool, stream: str,
         known: Optional[Sequence[Signature]] = None) -> Optional[Dict[str, Any]]:
    """The evidence of the last line in ``tail`` that holds a known GPU OOM message, or None."""
    known = signatures() if known is None else known
    for line in reversed(lines_of(tail, truncated)):
        for signature in known:
            if signature.text in line:
                return {"kind": KIND, "source": SOURCE_JOB_OUTPUT, "stream": stream,
                        "signature": signature.name, "line": shown(line)}
    return None
