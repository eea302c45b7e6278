"""fastfind.find gives bytes.find's answers (glibc memmem where it exists), and the scanner fed
one reused buffer hands on what it hands on for fresh bytes."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from healthcheck.kernellog import fastfind
from healthcheck.kernellog.fastfind import _py_find, find
from healthcheck.kernellog.scanner import LineScanner

from .test_kernellog_scanner import GPU, NOISE, XID


def test_find_answers_like_bytes_find():
    rng = random.Random(11)
    alphabet = b"Xid (NVRM: \n\x00ab"
    needles = [b"Xid (", b"NVRM: GPU ", b"d", b"\n", b"Xid (PCI:0000:3b:00): 79", b"zz"]
    for _ in range(2000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 200)))
        needle = rng.choice(needles)
        start = rng.randrange(-3, len(data) + 3)
        end = rng.randrange(-3, len(data) + 5)
        for buffer in (data, bytearray(data)):
            assert find(buffer, needle, start, end) == data.find(needle, start, end), (data, needle, start, end)


def test_find_in_a_large_buffer_and_at_its_edges():
    data = bytearray(NOISE * 40000)
    data[-len(XID):] = XID
    hit = len(data) - len(XID) + XID.index(b"Xid (")
    assert find(data, b"Xid (", 0, len(data)) == hit
    assert find(data, b"Xid (", hit, len(data)) == hit
    assert find(data, b"Xid (", hit + 1, len(data)) == -1
    assert find(data, b"Xid (", 0, hit + 4) == -1                      # the end bound is respected
    assert find(bytes(data), b"Xid (", 0, 10 ** 9) == hit


def test_the_fallback_is_bytes_find():
    assert _py_find(b"abcXid (", b"Xid (", 0, 8) == 3
    # glibc's memmem on this (Debian) machine; proven against bytes.find before it is used.
    assert fastfind.fast() is True


@pytest.mark.parametrize("kind", [bytes, bytearray])
@pytest.mark.parametrize("size", [len(XID) * 3, fastfind.SMALL + len(XID) * 7])
def test_small_and_large_spans_answer_as_bytes_find(kind, size):
    buffer = kind((XID * (size // len(XID) + 1))[:size])
    for needle in (b"Xid (", b"\n", b"79", b"absent"):
        for start, end in ((0, size), (5, size - 3), (size // 2, size), (size - 4, size + 10), (0, 3)):
            assert find(buffer, needle, start, end) == bytes(buffer).find(needle, start, end), (needle, start, end)


def test_a_small_span_does_not_load_ctypes():
    """A periodic run reads a few lines past its cursor: importing ctypes (~10 ms) for them
    would cost more than the search."""
    code = ("import sys\nfrom healthcheck.kernellog import fastfind\n"
            "assert fastfind.find(b'a Xid (x', b'Xid (', 0, 8) == 2\n"
            "print('ctypes' in sys.modules)\n"
            "fastfind.fast()\nprint('ctypes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_scanner_fed_one_reused_buffer_keeps_nothing_of_it():
    data = NOISE * 300 + XID + NOISE * 7 + GPU + NOISE * 300 + XID
    expected = [XID.rstrip(b"\n"), GPU.rstrip(b"\n"), XID.rstrip(b"\n")]
    for size in (7, 64, 1000, 4096):
        seen = []
        scanner = LineScanner(seen.append)
        buffer = bytearray(size)
        for position in range(0, len(data), size):
            piece = data[position:position + size]
            if len(piece) == size:
                buffer[:] = piece
                scanner.feed(buffer)
                buffer[:] = b"\xff" * size                        # the reader fills it again
            else:
                scanner.feed(piece)
        scanner.finish()
        assert seen == expected, size
        assert all(type(line) is bytes for line in seen)


def test_a_file_read_in_small_reused_chunks_gives_the_same_events(tmp_path, monkeypatch):
    import io

    from healthcheck.kernellog import logfiles
    from healthcheck.kernellog.api import scan_events

    data = NOISE * 500 + XID + NOISE * 13 + GPU + NOISE * 200 + XID.replace(b"79", b"48")
    path = tmp_path / "kern.log"
    path.write_bytes(data)

    def summary(read):
        return sorted((e.code, e.pci, e.count) for e in read.events)

    whole = summary(scan_events(str(path)))
    assert len(whole) == 3
    for size in (97, 4096):
        monkeypatch.setattr(logfiles, "CHUNK", size)
        assert summary(scan_events(str(path))) == whole, size
        assert summary(scan_events("-", stream=io.BufferedReader(io.BytesIO(data)))) == whole, size
