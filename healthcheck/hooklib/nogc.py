"""A hook is one short process: no cyclic garbage collection while it works, none at its exit.

The collector would walk the heap again and again while a hook imports some 190 modules, and
the interpreter's final collections walk everything the hook loaded (15-30 ms of a 150 ms run:
docs/performance.md). Reference counting still frees what a hook drops. Imports nothing but
the standard library's ``gc`` and ``atexit``: a hook's ``main`` enters it before its imports.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
from typing import Iterator

_FREEZE_REGISTERED = []


@contextlib.contextmanager
def short_process() -> Iterator[None]:
    """The collector off inside (back on afterwards for a caller that goes on: a test, the
    ``slurm-gpu`` CLI), and ``gc.freeze`` registered to run at exit, once: atexit handlers run
    before the interpreter's final collections, which then find nothing to walk."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        if not _FREEZE_REGISTERED:
            atexit.register(gc.freeze)
            _FREEZE_REGISTERED.append(True)
