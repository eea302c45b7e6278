"""Lines an unprivileged user can put into the kernel log must never become Xids.

The kernel itself logs text a user chooses: the name of a file exec'd with a NULL argv, and the
comm and file name of a process that segfaults. A syslog file also holds every program's lines.
The driver's lines start the kernel message, right after the one prefix each source format
writes; text anywhere else is not believed. The real driver lines (hardware-facts.md) still are.
"""
from __future__ import annotations

import os

import pytest

from healthcheck.kernellog import api
from healthcheck.kernellog.parser import message_start, parse_line, prefix_is_kernel
from healthcheck.kernellog.timestamps import PrefixClock

XID79 = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID48 = (b"NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU "
         b"in the framebuffer at partition 6, subpartition 0.")
FALLEN = b"NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."
SXID = b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
REAL = [XID79, XID48, FALLEN, SXID]

# The prefix of each source format, for a kernel line.
FORMATS = {
    "bare": b"",
    "dmesg": b"[ 8812.332117] ",
    "dmesg -T": b"[Sun Feb 23 16:24:18 2025] ",
    "dmesg -x": b"kern  :warn  : [ 8812.332117] ",
    "syslog": b"Feb 23 16:24:18 gpu001 kernel: ",
    "syslog+uptime": b"Feb 23 16:24:18 gpu001 kernel: [ 8812.332117] ",
    "rfc3339": b"2025-02-23T16:24:18.500000+01:00 gpu001 kernel: ",
    "journal short-unix": b"1740324258.123456 gpu001 kernel: ",
    "journal short-monotonic": b"[ 8812.332117] gpu001 kernel: ",
    "kmsg": b"4,1234,8812332117,-;",
}


def null_argv(payload: bytes) -> bytes:
    # fs/exec.c: pr_warn_once("process '%s' launched '%s' with NULL argv: empty string added\n", comm, filename)
    return b"process 'sh' launched '/tmp/" + payload + b"' with NULL argv: empty string added"


def segfault(payload: bytes) -> bytes:
    # arch/x86/mm/fault.c show_signal_msg: "%s[%d]: segfault at %lx ip %px sp %px error %lx in %s[%lx+%lx]".
    # The comm is at most 15 bytes: exactly "NVRM: Xid (PCI:" or "NVRM: GPU 0000:".
    return (payload[:15] + b"[4242]: segfault at 0 ip 00007f0000001000 sp 00007ffc00000000 error 4 in "
            + payload + b"[55d000000000+1000] likely on CPU 3 (core 3, socket 0)")


FORGERIES = {
    "null-argv": null_argv,
    "segfault": segfault,
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("line", REAL, ids=lambda line: line[:16].decode())
def test_real_driver_lines_are_read_in_every_format(fmt, line):
    event = parse_line(FORMATS[fmt] + line, PrefixClock())
    truth = parse_line(line)
    assert event is not None and (event.kind, event.code, event.pci) == (truth.kind, truth.code, truth.pci)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("forge", sorted(FORGERIES))
@pytest.mark.parametrize("payload", REAL, ids=lambda line: line[:16].decode())
def test_user_chosen_text_inside_a_kernel_message_is_not_an_event(fmt, forge, payload):
    line = FORMATS[fmt] + FORGERIES[forge](payload)
    assert parse_line(line, PrefixClock()) is None, line


@pytest.mark.parametrize("line", [
    b"Feb 23 16:24:18 gpu001 alice[77]: hi kernel: " + XID79,
    b"Feb 23 16:24:18 gpu001 alice[77]: kernel: " + XID79,
    b"2025-02-23T16:24:18+00:00 gpu001 alice[77]: x kernel: [ 1.0] " + XID79,
    b"1740324258.123456 gpu001 alice[77]: hi kernel: " + SXID,
    b"Feb 23 16:24:18 gpu001 bob: kernel: " + FALLEN,
    b"Feb 23 16:24:18 gpu001 kernel: alice says " + XID79,
    # /dev/kmsg records of another facility than the kernel's (userspace writes user=1, daemon=3)
    b"12,1234,8812332117,-;" + XID79,
    b"30,1234,8812332117,-;" + SXID,
    # dmesg -x shows the facility: only kern counts
    b"user  :warn  : [ 8812.332117] " + XID79,
    # junk before the prefix is no format's prefix
    b"\xff\xfe[1.0] " + XID79,
    b"hello " + XID79,
])
def test_lines_not_written_by_the_kernel_are_not_events(line):
    assert parse_line(line, PrefixClock()) is None, line


def test_the_prefix_rule_names_where_the_kernel_message_starts():
    for prefix in FORMATS.values():
        assert message_start(prefix + XID79) == len(prefix)
        assert prefix_is_kernel(prefix)
    assert not prefix_is_kernel(b"Feb 23 16:24:18 gpu001 alice[77]: hi kernel: ")
    assert not prefix_is_kernel(b"12,1234,8812332117,-;")
    assert message_start(b"12,1234,8812332117,-;" + XID79) == -1


def test_a_flood_of_real_lines_does_not_vouch_for_a_forged_line_that_ends_alike(tmp_path):
    """The reader counts repeats of a flood line by its ending; a line whose prefix is not the
    kernel's is parsed (and refused), not counted as one more repeat."""
    log = tmp_path / "kern.log"
    real = [b"Feb 23 16:24:%02d gpu001 kernel: %s\n" % (second, XID48) for second in range(3)]
    forged = b"Feb 23 16:24:09 gpu001 alice[77]: say kernel: " + XID48 + b"\n"
    log.write_bytes(b"".join(real) + forged * 5)
    os.utime(log, (1740400000, 1740400000))
    read = api.scan_events(str(log))
    assert sum(event.count for event in read.events) == 3
