"""``find(buffer, needle, start, end)``: ``bytes.find`` at memory speed.

The kernel-log scanner spends its time looking for a few needles in large buffers. CPython's
``bytes.find`` does about 1 GB/s on the scanner's short needles (its skip table helps little
when the needle's bytes are common: " (", "d "), and one pass per needle adds up. glibc's
``memmem`` does the same search three to four times faster, and a ctypes call costs about a
microsecond, paid once per needle per chunk. The search reads only ``buffer[start:end]``
(bounds are checked here), and nothing is written.

Where ``memmem`` cannot be had (no glibc, ctypes unusable), ``find`` is ``bytes.find``: the
same answers, at the old speed. ``fast()`` says which one is in use.

A span under ``SMALL`` bytes (what a periodic run reads past its cursor) is searched with
``bytes.find``: there the ctypes call saves nothing, and importing ctypes (about 10 ms) would be
the largest part of the search. ctypes is loaded on the first large span.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

Buffer = Union[bytes, bytearray]


def _py_find(buffer: Buffer, needle: bytes, start: int, end: int) -> int:
    return buffer.find(needle, start, end)


def _load() -> Callable[[Buffer, bytes, int, int], int]:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        memmem = libc.memmem
    except (ImportError, OSError, AttributeError):
        return _py_find
    memmem.restype = ctypes.c_void_p
    memmem.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    char_p, void_p, from_buffer = ctypes.c_char_p, ctypes.c_void_p, (ctypes.c_char * 1).from_buffer
    cast, addressof = ctypes.cast, ctypes.addressof

    def address(buffer: Buffer) -> int:
        if isinstance(buffer, bytes):
            return cast(char_p(buffer), void_p).value or 0   # the bytes object's own storage
        return addressof(from_buffer(buffer))                 # a bytearray's storage

    def find(buffer: Buffer, needle: bytes, start: int, end: int) -> int:
        length = len(buffer)
        if end > length:
            end = length
        if start < 0 or not needle or end - start < len(needle) or not buffer:
            return _py_find(buffer, needle, start, end)
        base = address(buffer)
        hit = memmem(base + start, end - start, needle, len(needle))
        return -1 if hit is None else hit - base

    # Proof before use: the same answers as bytes.find on a few cases, else the plain one.
    sample = b"ab\nNVRM: Xid (PCI:0000:01:00): 79\nXid (x"
    for buf in (sample, bytearray(sample)):
        for needle, start, end in ((b"Xid (", 0, len(sample)), (b"Xid (", 20, len(sample)), (b"Xid (", 0, 12),
                                   (b"zz", 0, len(sample)), (b"\n", 3, 40)):
            try:
                if find(buf, needle, start, end) != sample.find(needle, start, end):
                    return _py_find
            except (TypeError, ValueError, OSError):
                return _py_find
    return find


SMALL = 1 << 20
_memmem: Optional[Callable[[Buffer, bytes, int, int], int]] = None


def find(buffer: Buffer, needle: bytes, start: int, end: int) -> int:
    if end - start < SMALL:
        return buffer.find(needle, start, end)
    return (_memmem or _load_once())(buffer, needle, start, end)


def _load_once() -> Callable[[Buffer, bytes, int, int], int]:
    global _memmem
    _memmem = _load()
    return _memmem


def fast() -> bool:
    """Whether large spans are searched with glibc's memmem."""
    return (_memmem or _load_once()) is not _py_find
