"""The chunked scanner: same lines whatever the chunking, bounded memory, no work on other lines."""
from __future__ import annotations

import io
import random

from healthcheck.kernellog.api import scan_events
from healthcheck.kernellog.scanner import MAX_LINE, LineScanner

NOISE = b"Feb 23 16:24:18 gpu001 systemd[1]: Started Session 12 of user alice.\n"
XID = b"Feb 23 16:24:18 gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
GPU = b"Feb 23 16:24:18 gpu001 kernel: NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.\n"


def collect(data: bytes, sizes) -> list:
    seen = []
    scanner = LineScanner(seen.append)
    position = 0
    for size in sizes:
        scanner.feed(data[position:position + size])
        position += size
    scanner.feed(data[position:])
    scanner.finish()
    return seen


def test_candidate_lines_are_the_same_for_any_chunking():
    data = NOISE * 50 + XID + NOISE * 3 + GPU + XID + b"last line without newline NVRM: Xid (x"
    expected = [XID.rstrip(b"\n"), GPU.rstrip(b"\n"), XID.rstrip(b"\n"), b"last line without newline NVRM: Xid (x"]
    assert collect(data, []) == expected
    rng = random.Random(3)
    for _ in range(200):
        sizes = [rng.randrange(1, 300) for _ in range(rng.randrange(1, 40))]
        assert collect(data, sizes) == expected, sizes


def test_only_lines_holding_a_needle_reach_the_parser(monkeypatch):
    parsed = []
    import healthcheck.kernellog.api as api

    real = api.parse_line_split
    monkeypatch.setattr(api, "parse_line_split", lambda line, clock=None, continued=False: parsed.append(line) or real(line, clock, continued))
    data = NOISE * 1000 + XID + NOISE * 1000
    path_events = scan_events("-", stream=io.BytesIO(data)).events
    assert len(path_events) == 1 and parsed == [XID.rstrip(b"\n")]


def test_overlong_lines_keep_memory_bounded_and_their_head():
    seen = []
    scanner = LineScanner(seen.append)
    long_xid = XID.rstrip(b"\n") + b" " + b"Z" * 300_000 + b"\n"
    long_noise = b"Y" * 250_000 + b" NVRM: Xid (PCI:0000:3b:00): 79, at the far end\n"
    data = long_xid + NOISE + long_noise + XID
    for start in range(0, len(data), 4096):
        scanner.feed(data[start:start + 4096])
        assert len(scanner._pending) <= MAX_LINE
    scanner.finish()
    assert seen[0].startswith(XID.rstrip(b"\n")) and len(seen[0]) <= MAX_LINE
    assert seen[-1] == XID.rstrip(b"\n")
    assert scanner.stats.overlong_lines == 2
    events = scan_events("-", stream=io.BytesIO(data)).events
    # The 100 KB+ Xid line is one event (head parsed); the needle at the far end of a long line is none.
    assert [(event.code, event.count) for event in events] == [(79, 2)]


def test_binary_garbage_gives_no_events(tmp_path):
    rng = random.Random(11)
    blob = bytes(rng.randrange(256) for _ in range(300_000))
    blob += b"\x00Xid (\xff\xfe NVRM: GPU \x00" * 100
    path = tmp_path / "garbage.bin"
    path.write_bytes(blob)
    result = scan_events(str(path))
    assert result.events == [] and result.stats.candidate_lines > 0
