"""The driver's three-line lost-GPU message, and process names holding ", "."""
from __future__ import annotations

import pytest

from healthcheck.kernellog.api import scan_events
from healthcheck.kernellog.parser import LostIntro, LostTail, parse_line

# As the driver prints it (one printk with two embedded newlines): dmesg shows three lines.
DMESG = (b"[ 8812.332101] NVRM: The NVIDIA GPU 0000:5d:00.0\n"
         b"[ 8812.332103] NVRM: (PCI ID: 10de:2330) installed in this system has\n"
         b"[ 8812.332104] NVRM: fallen off the bus and is not responding to commands.\n")
# /dev/kmsg keeps it one record and escapes the newlines.
KMSG = (b"3,1843,8812332101,-;NVRM: The NVIDIA GPU 0000:5d:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this "
        b"system has\\x0aNVRM: fallen off the bus and is not responding to commands.\\x0a")
# journalctl -k indents a record's continuation lines.
JOURNAL = (b"Nov 30 14:02:11 gpu7 kernel: NVRM: The NVIDIA GPU 0000:5d:00.0\n"
           b"                             NVRM: (PCI ID: 10de:2330) installed in this system has\n"
           b"                             NVRM: fallen off the bus and is not responding to commands.\n")


def scan(tmp_path, data: bytes):
    log = tmp_path / "kern.log"
    log.write_bytes(data)
    return scan_events(str(log)).events


@pytest.mark.parametrize("data", [DMESG, KMSG + b"\n", JOURNAL], ids=["dmesg", "kmsg-record", "journal"])
def test_the_three_line_message_is_a_fallen_off_the_bus_event(tmp_path, data):
    [event] = scan(tmp_path, data)
    assert (event.kind, event.code, event.pci) == ("fallen_off_bus", 79, "0000:5d:00")
    assert "fallen off the bus" in event.message


def test_the_kmsg_record_parses_alone():
    event = parse_line(KMSG)
    assert (event.kind, event.pci) == ("fallen_off_bus", "0000:5d:00")


def test_first_and_last_lines_alone_are_halves():
    assert isinstance(parse_line(b"[ 1.0] NVRM: The NVIDIA GPU 0000:5d:00.0"), LostIntro)
    assert isinstance(parse_line(b"[ 1.0] NVRM: fallen off the bus and is not responding to commands."), LostTail)


def test_the_same_opening_for_an_unsupported_gpu_is_no_event(tmp_path):
    data = (b"[ 5.1] NVRM: The NVIDIA GPU 0000:5d:00.0\n"
            b"[ 5.1] NVRM: (PCI ID: 10de:1b80) installed in this system is\n"
            b"[ 5.1] NVRM: not supported by the NVIDIA 550.90.07 driver release.\n")
    assert scan(tmp_path, data) == []


def test_a_tail_after_another_driver_line_is_not_paired(tmp_path):
    data = (b"[ 5.1] NVRM: The NVIDIA GPU 0000:5d:00.0\n"
            b"[ 5.2] NVRM: GPU at PCI:0000:5d:00: GPU-2f7c1e4a-0003-4c1d-9e2b-8a6f3d0c0003\n"
            b"[ 5.3] NVRM: fallen off the bus and is not responding to commands.\n")
    assert scan(tmp_path, data) == []


def test_another_programs_copy_is_not_believed(tmp_path):
    data = b"Nov 30 14:02:11 gpu7 alice[77]: NVRM: The NVIDIA GPU 0000:5d:00.0\\x0aNVRM: (PCI ID: 10de:2330) " \
           b"installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n"
    assert scan(tmp_path, data) == []


@pytest.mark.parametrize("line,process,message", [
    (b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=my, job, GPU has fallen off the bus.",
     "my, job", "GPU has fallen off the bus."),
    (b"NVRM: Xid (PCI:0000:3b:00): 43, pid=77, name=a, b, c, Ch 00000008",
     "a, b, c", "Ch 00000008"),
    (b"NVRM: Xid (PCI:0000:3b:00): 13, pid=99, name=train, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0)",
     "train", "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0)"),
    (b"NVRM: Xid (PCI:0000:3b:00): 31, pid=7, name=py, Ch 00000010, intr 10000000. MMU Fault",
     "py", "Ch 00000010, intr 10000000. MMU Fault"),
    (b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     "python", "GPU has fallen off the bus."),
])
def test_a_process_name_holding_a_comma_does_not_shift_the_message(line, process, message):
    event = parse_line(line)
    assert (event.code, event.process, event.message) == (int(line.split(b"): ")[1].split(b",")[0]), process, message)
