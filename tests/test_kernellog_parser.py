"""The kernel-log parser on real-format lines of every variant, and on lines that must not match."""
from __future__ import annotations

import random
import time

import pytest

from healthcheck.kernellog.parser import Companion, parse_line
from healthcheck.xid.pci import GpuMap, normalise_pci, pci_key
from healthcheck.kernellog.timestamps import PrefixClock

XID79 = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."

# (line, expected fields) -- every form hardware-facts.md lists.
VARIANTS = [
    (XID79, dict(kind="xid", code=79, pci="0000:3b:00", pid=1234, process="python",
                 message="GPU has fallen off the bus.", gpu_instance=None)),
    (b"NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the "
     b"framebuffer at partition 6, subpartition 0.",
     dict(kind="xid", code=48, pid=None, process=None, message="An uncorrectable double bit error (DBE) has been "
          "detected on GPU in the framebuffer at partition 6, subpartition 0.")),
    (b"NVRM: Xid (PCI:0000:3b:00): 95, pid=2371, Uncontained: FBHUB. RST: Yes, D-RST: No",
     dict(code=95, pid=2371, process=None, message="Uncontained: FBHUB. RST: Yes, D-RST: No")),
    (b"NVRM: Xid (PCI:0000:0f:00): 64, pid=57530, Row Remapper Error: (0x00000005d28c03a0) - All reserved rows",
     dict(code=64, pid=57530, process=None, pci="0000:0f:00")),
    (b"NVRM: Xid (PCI:0000:b3:00): 62, pid='<unknown>', name=<unknown>, 0000(0000) 00000000 00000000",
     dict(code=62, pid=None, process=None, message="0000(0000) 00000000 00000000")),
    (b"NVRM: Xid (PCI:0000:b3:00): 119, pid=<unknown>, name='<unknown>', Timeout waiting for RPC from GSP!",
     dict(code=119, pid=None, process=None, message="Timeout waiting for RPC from GSP!")),
    (b"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=99, name=train.py, Graphics SM Warp Exception on "
     b"(GPC 1, TPC 0, SM 0): Out Of Range Address",
     dict(code=13, gpu_instance=1, compute_instance=2, pid=99, process="train.py")),
    (b"NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, pid=7, name=a.out, MMU Fault",
     dict(code=31, gpu_instance=5, compute_instance=None)),
    (b"NVRM: Xid (0000:03:00): 14, Channel 00000001", dict(code=14, pci="0000:03:00", message="Channel 00000001")),
    (b"NVRM: Xid (PCI:0000:04:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
     dict(code=154, recovery_action=2)),
    (b"NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)",
     dict(code=145, nvlink_unit="RLW_REMAP", intrinfo=4, error_status=1)),
    (b"NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
     dict(kind="fallen_off_bus", code=79, pci="0000:29:00", pid=None)),
    (b"NVRM: GPU at PCI:0000:29:00: GPU has fallen off the bus.", dict(kind="fallen_off_bus", code=79, pci="0000:29:00")),
    (b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
     dict(kind="sxid", code=20034, pci="0000:00:00", device="nvidia-nvswitch0", severity="Fatal",
          message="Link 30 LTSSM Fault Up", continuation=False)),
    (b"nvidia-nvswitch4: SXid (PCI:0000:c6:00.0): 19084, Non-fatal, Link 29 AN1 Heartbeat Timeout Error (First)",
     dict(kind="sxid", code=19084, pci="0000:c6:00", severity="Non-fatal")),
    (b"nvidia-nvswitch2: SXid (PCI:0000:c4:00.0): 10002, Severity 5 Engine instance 00 Sub-engine instance 00",
     dict(kind="sxid", code=10002, severity=None, continuation=True)),
    (b"NVRM: Xid (PCI:0001:AB:1F): 43, pid=5, name=x, Ch 00000008", dict(code=43, pci="0001:ab:1f")),
]

PREFIXES = [
    (b"", None, None),
    (b"[12345.678901] ", None, 12345.678901),
    (b"[ 8812.332117] ", None, 8812.332117),
    (b"[Sun Feb 23 16:24:18 2025] ", time.mktime((2025, 2, 23, 16, 24, 18, 0, 0, -1)), None),
    (b"Feb 23 16:24:18 gpu001 kernel: ", time.mktime((2025, 2, 23, 16, 24, 18, 0, 0, -1)), None),
    (b"Feb 23 16:24:18 gpu001 kernel: [ 8812.332117] ", time.mktime((2025, 2, 23, 16, 24, 18, 0, 0, -1)), 8812.332117),
    (b"2025-02-23T16:24:18.500000+01:00 gpu001 kernel: ", 1740324258.5, None),
    (b"2025-02-23T15:24:18Z gpu001 kernel: ", 1740324258.0, None),
    (b"1740324258.123456 gpu001 kernel: ", 1740324258.123456, None),
    (b"kernel: ", None, None),
    (b"6,1234,5678901234,-;", None, 5678.901234),
]

# The reference for syslog's missing year: a day in 2025, so "Feb 23" is 2025's.
REFERENCE = time.mktime((2025, 6, 1, 12, 0, 0, 0, 0, -1))


@pytest.mark.parametrize("line,expected", VARIANTS, ids=lambda value: value[:40] if isinstance(value, bytes) else "")
def test_every_line_form_parses_to_the_right_fields(line, expected):
    event = parse_line(line)
    assert event is not None and not isinstance(event, Companion)
    for name, value in expected.items():
        assert getattr(event, name) == value, (name, getattr(event, name))


@pytest.mark.parametrize("prefix,wall,uptime", PREFIXES, ids=lambda value: value.decode() if isinstance(value, bytes) else "")
def test_prefixes_give_time_and_uptime_and_keep_the_event(prefix, wall, uptime):
    event = parse_line(prefix + XID79, PrefixClock(reference=REFERENCE))
    assert event is not None and event.code == 79 and event.pci == "0000:3b:00" and event.pid == 1234
    assert event.time == pytest.approx(wall) if wall is not None else event.time is None
    assert event.uptime == pytest.approx(uptime) if uptime is not None else event.uptime is None


def test_syslog_year_is_the_reference_years_unless_that_is_in_the_future():
    clock = PrefixClock(reference=time.mktime((2025, 1, 10, 0, 0, 0, 0, 0, -1)))
    wall, _ = clock.parse(b"Dec 31 23:59:59 host kernel: ")
    assert time.localtime(wall).tm_year == 2024


def test_companion_lines_map_address_to_uuid():
    found = parse_line(b"[ 1.0] NVRM: GPU at PCI:0000:9b:00: GPU-509665AD-1234-4c1d-9e2b-8a6f3d0c0003")
    assert found == Companion("0000:9b:00", "GPU-509665ad-1234-4c1d-9e2b-8a6f3d0c0003")
    old = parse_line(b"NVRM: GPU at 0000:03:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7")
    assert old == Companion("0000:03:00", "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7")


@pytest.mark.parametrize("line", [
    b"",
    b"\n",
    b"Feb 23 16:24:18 gpu001 systemd[1]: Started Session 1 of user alice.",
    b"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
    b"NVRM: GPU 0000:29:00.0: RmInitAdapter failed! (0x22:0x56:742)",
    b"NVRM: Xid",
    b"NVRM: Xid (",
    b"NVRM: Xid (PCI:0000:3b:0",
    b"NVRM: Xid (PCI:0000:3b:00)",
    b"NVRM: Xid (PCI:0000:3b:00): ",
    b"NVRM: Xid (PCI:0000:3b:00): 7",             # truncated inside "79": never guess the code
    b"NVRM: Xid (PCI:0000:3b:00): seventy-nine, GPU has fallen off the bus.",
    b"NVRM: Xid (PCI:zzzz:3b:00): 79, GPU has fallen off the bus.",
    b"NVRM: Xid (PCI:0000:3b): 79, x",
    b"SXid (PCI:0000:00:00.0)",
    b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): ",
    b"NVRM: GPU at PCI:0000:9b:00: GPU-5096",     # truncated UUID
    b"Xid Xid Xid (((( NVRM: GPU NVRM: GPU at",
    # Anybody can write to syslog with logger(1): only the kernel's lines count.
    b"Feb 23 16:24:18 gpu001 alice: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    b"Feb 23 16:24:18 gpu001 python3[4242]: nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30",
    b"2025-02-23T16:24:18+00:00 gpu001 bob: NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
])
def test_lines_that_are_not_events_give_none(line):
    assert parse_line(line, PrefixClock()) is None


def test_binary_and_undecodable_bytes_never_raise():
    rng = random.Random(7)
    for _ in range(3000):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        parse_line(blob, PrefixClock())
        parse_line(blob + XID79[rng.randrange(len(XID79)):], PrefixClock())
    # Undecodable bytes inside the kernel text are kept (escaped); before the prefix they are not
    # a source format's prefix, so such a line is not the kernel's (test_kernellog_forged.py).
    event = parse_line(b"[1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=\xff\xfe\x1b, bad \x00\x9b text")
    assert event.code == 31 and event.process == "\\xff\\xfe\x1b" and "\\x9b" in event.message


def test_a_truncated_line_gives_nothing_or_the_true_event():
    """Cut a real line anywhere: the parser may drop it, but never invents another code or GPU."""
    lines = [XID79, b"[ 1.0] " + VARIANTS[6][0], VARIANTS[9][0], VARIANTS[10][0], VARIANTS[13][0], VARIANTS[11][0],
             b"NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000)"]
    for line in lines:
        truth = parse_line(line)
        for cut in range(len(line) + 1):
            event = parse_line(line[:cut])
            if event is not None:
                assert (event.kind, event.code, event.pci) == (truth.kind, truth.code, truth.pci), line[:cut]
                # Details that decide the action are the true ones or absent, never a prefix of them.
                assert event.error_status in (None, truth.error_status), line[:cut]
                assert event.recovery_action in (None, truth.recovery_action), line[:cut]


def test_very_long_lines_are_handled():
    long_message = XID79 + b" " + b"A" * 100_000
    event = parse_line(long_message)
    assert event.code == 79 and len(event.message) <= 2000
    assert parse_line(b"x" * 100_000 + b"Xid (" + b"y" * 100_000) is None


def test_pci_forms_compare_as_numbers():
    assert pci_key("0000:3b:00") == pci_key("00000000:3B:00.0") == pci_key("0000:3b:00.0") == (0, 0x3b, 0)
    assert normalise_pci("00000000:3B:00.0") == "0000:3b:00"
    assert pci_key("PCI:0001:ab:1f") == (1, 0xab, 0x1f)
    assert pci_key("not an address") is None and pci_key(None) is None


def test_gpu_map_uses_nvml_facts_then_companion_lines():
    gpus = [{"index": 3, "uuid": "GPU-aaaa", "pci_bus_id": "00000000:5D:00.0"}]
    gpu_map = GpuMap(gpus)
    assert gpu_map.lookup("0000:5d:00") == (3, "GPU-aaaa", "00000000:5D:00.0")
    gpu_map.learn("0000:9b:00", "GPU-bbbb")
    assert gpu_map.lookup("0000:9b:00.0")[:2] == (None, "GPU-bbbb")
    gpu_map.learn("0000:5d:00", "GPU-stale")         # NVML's facts win over an old companion line
    assert gpu_map.lookup("0000:5d:00")[1] == "GPU-aaaa"
