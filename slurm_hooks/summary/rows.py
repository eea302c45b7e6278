"""One accounting row's fields for the tally: the column positions in ``SACCT_FIELDS``' order,
the GPUs a job held (from AllocTRES), its node list expanded, and rows taken a chunk at a time.
Pure: text in, numbers and names out."""
from __future__ import annotations

import re
from itertools import islice
from typing import Iterable, Iterator, List, Sequence, Tuple

from .accounting import INDEX, NOT_A_COUNT

I_JOBID, I_USER, I_ACCOUNT, I_PARTITION = INDEX["JobID"], INDEX["User"], INDEX["Account"], INDEX["Partition"]
I_STATE, I_START, I_END, I_ELAPSED = INDEX["State"], INDEX["Start"], INDEX["End"], INDEX["ElapsedRaw"]
I_TRES, I_NODELIST, I_ADMIN, I_NAME = INDEX["AllocTRES"], INDEX["NodeList"], INDEX["AdminComment"], INDEX["JobName"]
I_EXIT = INDEX["ExitCode"]

_TYPED_GPU = re.compile(r"gres/gpu:[^=,]+=([^,]*)")
NODE_CACHE_LIMIT = 50_000         # distinct node lists and AllocTRES strings kept expanded
CHUNK_ROWS = 512


def _count(value: str) -> int:
    return int(value) if value.isdigit() and value.isascii() else NOT_A_COUNT


def gpus_of(tres: str) -> int:
    """Allocated GPUs from AllocTRES (``gres/gpu=N``; typed ``gres/gpu:h100=N`` summed when the
    untyped count is absent); ``NOT_A_COUNT`` when a count is not a whole number (``-8``)."""
    at = tres.find("gres/gpu=")
    if at < 0:
        if "gres/gpu:" not in tres:
            return 0
        counts = [_count(value) for value in _TYPED_GPU.findall(tres)]
        return NOT_A_COUNT if NOT_A_COUNT in counts else sum(counts)
    end = tres.find(",", at)
    return _count(tres[at + 9:end] if end >= 0 else tres[at + 9:])


def expand_nodes(nodelist: str) -> Tuple[str, ...]:
    if not nodelist or nodelist.startswith("None"):
        return ()
    if "[" not in nodelist and "," not in nodelist:
        return (nodelist,)
    import hostlist

    try:
        return tuple(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist:
        return (nodelist,)


class GpuCounts(dict):
    """AllocTRES text -> GPUs; the same few strings repeat across a month of jobs."""

    def __missing__(self, tres: str) -> int:
        if len(self) >= NODE_CACHE_LIMIT:
            self.clear()
        gpus = self[tres] = gpus_of(tres)
        return gpus


def chunks(rows: Iterable[Sequence[str]], size: int = CHUNK_ROWS) -> Iterator[List[Sequence[str]]]:
    iterator = iter(rows)
    while True:
        chunk = list(islice(iterator, size))
        if not chunk:
            return
        yield chunk
