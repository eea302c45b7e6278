"""One kernel record printed over several lines: its later lines never start an event.

A user's file name can hold newlines; the kernel logs it inside one record (a segfault report,
an exec warning), which /dev/kmsg keeps whole but journalctl, dmesg and the syslog interface
(/proc/kmsg, rsyslog's imklog) print as several lines. The captures in
tests/fixtures/kernellog-continuation/ are real (README.md there): a segfaulting binary whose
file name holds an Xid 79 line. Genuine lines in every format, RFC 5424 and dmesg's relative
time stamps included, are still events.
"""
from __future__ import annotations

import io
import json
import os
import sys

import pytest

from healthcheck.kernellog import readers
from healthcheck.kernellog.api import read_new_events, scan_events
from healthcheck.kernellog.parser import parse_line
from healthcheck.kernellog.timestamps import PrefixClock

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "kernellog-continuation")
CAPTURES = sorted(name for name in os.listdir(HERE) if name.endswith(".txt"))
FORGED_TEXT = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID48 = (b"NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU "
         b"in the framebuffer at partition 6, subpartition 0.")


def capture(name: str) -> bytes:
    with open(os.path.join(HERE, name), "rb") as handle:
        return handle.read()


def scan(data: bytes):
    return scan_events("-", stream=io.BytesIO(data)).events


def test_the_captures_hold_the_forged_line():
    for name in CAPTURES:
        assert FORGED_TEXT in capture(name), name


# dmesg -t prints a record's later lines with no prefix and no indent, and `dmesg -S -T` repeats a
# stamp of whole seconds, which separate records share as often: nothing tells them from a line of
# their own (docs/kernel-log.md says so, `slurm-gpu config check` warns; kmsg and journal are the
# sources to use).
UNTELLABLE = {"dmesg-notime.txt", "dmesg-syslog-notime.txt", "dmesg-syslog-ctime.txt"}


@pytest.mark.parametrize("name", [name for name in CAPTURES if name not in UNTELLABLE])
def test_a_forged_continuation_line_is_no_event(name):
    assert scan(capture(name)) == []


def test_the_untellable_captures_are_the_ones_whose_forged_line_is_read():
    """What the docs and the config check name is what the reader cannot tell (not a test that
    passes for want of trying): in these forms the forged line is read."""
    for name in sorted(UNTELLABLE):
        assert [event.code for event in scan(capture(name))] == [79], name


GENUINE_AFTER = {
    # The same source's genuine Xid 48 right after the forged record (a line of its own).
    "journal-short-unix.txt": b"1796139963.100000 vm kernel: ",
    "journal-short.txt": b"Dec 01 15:45:58 vm kernel: ",
    "journal-short-iso.txt": b"2026-12-01T15:45:58+0000 vm kernel: ",
    "journal-short-precise.txt": b"Dec 01 15:45:58.100000 vm kernel: ",
    "journal-short-monotonic.txt": b"[  219.000001] vm kernel: ",
    "dmesg-plain.txt": b"[  219.000001] ",
    "dmesg-ctime.txt": b"[Tue Dec  1 15:45:58 2026] ",
    "dmesg-decode.txt": b"kern  :warn  : [  219.000001] ",
    "dmesg-raw.txt": b"<4>[  219.000001] ",
    "dmesg-syslog-raw.txt": b"<4>[  219.000001] ",
    # dmesg -S (the syslog interface) in every time format: the record's stamp on every line
    "dmesg-syslog.txt": b"[  219.000001] ",
    "dmesg-syslog-decode.txt": b"kern  :warn  : [  219.000001] ",
    "dmesg-syslog-show-delta.txt": b"[  219.000001 <    0.587820>] ",
    "dmesg-syslog-ctime-delta.txt": b"[Sun Dec  6 07:06:24 2026 <    0.587820>] ",
    "dmesg-syslog-human.txt": b"[  +0.587820] ",
    "dmesg-syslog-reltime.txt": b"[  +0.587820] ",
    "dmesg-syslog-delta.txt": b"[<    0.587820>] ",
    "dmesg-syslog-iso.txt": b"2026-12-06T07:06:24,000001+00:00 ",
    "dmesg-syslog-decode-iso.txt": b"kern  :warn  : 2026-12-06T07:06:24,000001+00:00 ",
    "dmesg-human.txt": b"[  +0.500000] ",
    "dmesg-reltime.txt": b"[Dec 1 15:46] ",
}


@pytest.mark.parametrize("name", sorted(GENUINE_AFTER))
def test_a_genuine_xid_after_the_forged_record_is_one_event(name):
    events = scan(capture(name) + GENUINE_AFTER[name] + XID48 + b"\n")
    assert [(event.code, event.pci) for event in events] == [(48, "0000:3b:00")]


def rsyslog_imklog(raw: bytes) -> bytes:
    """What rsyslog writes from the syslog interface keeping the kernel's stamp: one message per
    line, each with the record's stamp ("<6>[ 218.412166] " -> "Dec  1 15:45:57 vm kernel: [ 218.412166] ")."""
    lines = []
    for line in raw.splitlines(keepends=True):
        lines.append(b"Dec  1 15:45:57 vm kernel: " + line.split(b">", 1)[1])
    return b"".join(lines)


def test_rsyslog_keeping_the_kernel_stamp_forged_line_is_no_event():
    data = rsyslog_imklog(capture("dmesg-syslog-raw.txt"))
    assert b"vm kernel: [  218.412166] " + FORGED_TEXT in data
    assert scan(data) == []
    genuine = data + b"Dec  1 15:45:58 vm kernel: [  219.000001] " + XID48 + b"\n"
    assert [event.code for event in scan(genuine)] == [48]


def test_a_driver_burst_sharing_one_stamp_is_still_read():
    """The driver prints companion, serial number and Xid in one burst; two records can carry the
    same microsecond. A line whose predecessor with the same stamp was a whole driver line counts."""
    stamp = b"Dec  1 15:45:57 vm kernel: [  218.500000] "
    burst = (stamp + b"NVRM: GPU at PCI:0000:3b:00: GPU-509665ad-1111-2222-3333-444455556666\n"
             + stamp + b"NVRM: GPU Board Serial Number: 1650123456789\n"
             + stamp + XID48 + b"\n"
             + stamp + b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
    assert [event.code for event in scan(burst)] == [48, 79]


@pytest.mark.parametrize("zero, later", [
    (b"[  +0.000000] ", b"[  +0.000100] "),                      # dmesg -S -H / --time-format reltime
    (b"[<    0.000000>] ", b"[<    0.000100>] "),                # dmesg -S --time-format delta
])
def test_a_driver_burst_at_a_delta_of_zero_is_still_read(zero, later):
    """The delta formats say "the same time as the line before" for a record's later lines and for
    a driver burst alike: after a whole driver line, a zero delta is a record of its own."""
    burst = (later + b"NVRM: GPU at PCI:0000:3b:00: GPU-509665ad-1111-2222-3333-444455556666\n"
             + zero + XID48 + b"\n")
    assert [event.code for event in scan(burst)] == [48]
    assert scan(later + b"segfault in x\n" + zero + XID48 + b"\n") == []


def test_a_kernel_log_file_in_dmesg_syslog_form_reads_no_forged_xid(tmp_path):
    """kernel_log = a file `dmesg -S` wrote (the finding: it drained the node): the hooks'
    incremental read finds the genuine Xid 48 after the record and not the forged Xid 79."""
    log = tmp_path / "dmesg.log"
    log.write_bytes(capture("dmesg-syslog.txt") + b"[  219.000001] " + XID48 + b"\n")
    read = read_new_events(str(log), str(tmp_path / "state"), "gpu1", now=1796139964.0, booted=0)
    assert [(event.code, event.pci) for event in read.events] == [(48, "0000:3b:00")]


def rsyslog_rfc5424(raw: bytes) -> bytes:
    """What rsyslog writes with RSYSLOG_SyslogProtocol23Format from imklog's defaults (the kernel's
    stamp kept at the start of MSG): "<6>[  218.412166] x" -> "<6>1 TS vm kernel - - - [  218.412166] x"."""
    lines = []
    for line in raw.splitlines(keepends=True):
        pri, msg = line[1:].split(b">", 1)
        lines.append(b"<" + pri + b">1 2026-12-01T15:45:57.906570+00:00 vm kernel - - - " + msg)
    return b"".join(lines)


def test_rfc5424_keeping_the_kernel_stamp_reads_the_real_xid_and_not_the_forged_one():
    """rsyslog's RFC 5424 files as written by default: imklog keeps "[  218.412166] " in MSG. The
    real driver line is an event (it was not: no drain); the forged line of the same form is not."""
    data = rsyslog_rfc5424(capture("dmesg-syslog-raw.txt"))
    assert b"<6>1 2026-12-01T15:45:57.906570+00:00 vm kernel - - - [  218.412166] " + FORGED_TEXT in data
    assert scan(data) == []
    genuine = b"<4>1 2026-12-01T15:45:58.100000+00:00 vm kernel - - - [  219.000001] " + XID48 + b"\n"
    events = scan(data + genuine)
    assert [(event.code, event.pci, event.uptime) for event in events] == [(48, "0000:3b:00", 219.000001)]
    assert events[0].time == 1796139958.1


def test_a_continuation_line_never_starts_an_event_but_completes_the_lost_gpu_message():
    lost = (b"1796139962.906570 vm kernel: NVRM: The NVIDIA GPU 0000:5d:00.0\n"
            b"                             NVRM: (PCI ID: 10de:2330) installed in this system has\n"
            b"                             NVRM: fallen off the bus and is not responding to commands.\n")
    assert [(event.kind, event.pci) for event in scan(lost)] == [("fallen_off_bus", "0000:5d:00")]
    for indent in (b" ", b"\t", b"                             "):
        assert parse_line(indent + XID48, PrefixClock()) is None
        assert parse_line(indent + b"[ 12.000000] " + XID48, PrefixClock()) is None


@pytest.mark.parametrize("line", [
    b"<4>1 2026-12-01T10:00:00.123456+00:00 host kernel - - - " + FORGED_TEXT,      # rsyslog RFC 5424
    b"<3>1 2026-12-01T10:00:00Z host kernel - - - " + FORGED_TEXT,
    b"[  +0.000003] " + FORGED_TEXT,                                                 # dmesg -H / --reltime
    b"[Dec 1 10:00] " + FORGED_TEXT,                                                 # ... its minute line
    b"[  218.412181 <    0.000015>] " + FORGED_TEXT,                                 # dmesg -d
    b"<4>[  218.412181] " + FORGED_TEXT,                                             # dmesg -r, /proc/kmsg
])
def test_genuine_formats_yield_their_xid(line):
    event = parse_line(line, PrefixClock())
    assert event is not None and (event.code, event.pci) == (79, "0000:3b:00")


def test_rfc5424_time_is_read():
    event = parse_line(b"<4>1 2026-12-01T10:00:00.5+00:00 host kernel - - - " + FORGED_TEXT, PrefixClock())
    assert event.time == 1796119200.5


@pytest.mark.parametrize("line", [
    b"<14>1 2026-12-01T10:00:00Z host kernel - - - " + FORGED_TEXT,     # facility user (1): logger
    b"<13>1 2026-12-01T10:00:00Z host alice - - - " + FORGED_TEXT,
    b"<4>1 2026-12-01T10:00:00Z host alice - - - " + FORGED_TEXT,       # not the kernel's APP-NAME
    b"<12>[  218.412181] " + FORGED_TEXT,                                 # syslog interface, user facility
])
def test_syslog_framing_of_another_writer_is_no_event(line):
    assert parse_line(line, PrefixClock()) is None


FAKE_JOURNALCTL = """#!{python}
import sys
with open({capture!r}, "rb") as handle:
    sys.stdout.buffer.write(handle.read())
sys.stdout.buffer.write(b"1796139963.100000 vm kernel: " + {genuine!r} + b"\\n")
print("-- cursor: s=1")
"""


def test_the_journal_source_reads_no_forged_xid_and_the_genuine_one(tmp_path, monkeypatch):
    """kernel_log = "journal", the hooks' incremental read: journalctl's real output shape."""
    script = tmp_path / "journalctl"
    script.write_text(FAKE_JOURNALCTL.format(python=sys.executable, capture=os.path.join(HERE, "journal-short-unix.txt"),
                                             genuine=XID48))
    script.chmod(0o755)
    monkeypatch.setattr(readers, "JOURNALCTL_PATHS", (str(script),))
    read = read_new_events("journal", str(tmp_path / "state"), "gpu1", now=1796139964.0, booted=0)
    assert [(event.code, event.pci) for event in read.events] == [(48, "0000:3b:00")]


def config_check(tmp_path, log_path):
    from .conftest import run_cli

    config = tmp_path / "config.toml"
    config.write_text(f'[paths]\nkernel_log = "{log_path}"\n')
    return str(config), run_cli(["config", "check", str(config)]), run_cli(["config", "check", "--json", str(config)])


@pytest.mark.parametrize("name", CAPTURES)
def test_the_config_check_warns_when_kernel_log_is_a_file_in_a_form_that_cannot_tell(tmp_path, name):
    """`slurm-gpu config check` names the forms in which a user's text can count as a driver line
    (the captures whose forged line is read, above) and says nothing of the others."""
    path, text, as_json = config_check(tmp_path, os.path.join(HERE, name))
    assert text.exit_code == 0 and as_json.exit_code == 0, text.output
    warnings = json.loads(as_json.stdout)["warnings"]
    assert text.stderr.splitlines() == warnings
    if name in UNTELLABLE:
        (line,) = warnings
        assert line.startswith(f"{path}: paths.kernel_log: {os.path.join(HERE, name)} holds ")
        assert ('use "kmsg" or "journal"') in line
    else:
        assert warnings == []


def test_the_config_check_warns_of_syslog_lines_without_the_kernel_stamp(tmp_path):
    """rsyslog told to parse the kernel's stamp away (ParseKernelTimestamp on): a record's later
    lines carry the same prefix as lines of their own. Kept: no warning."""
    stripped = b"".join(b"Dec  1 15:45:57 vm kernel: " + line.split(b"] ", 1)[1]
                        for line in capture("dmesg-syslog-raw.txt").splitlines(keepends=True))
    log = tmp_path / "kern.log"
    log.write_bytes(b"Dec  1 15:45:50 vm systemd[1]: Started Session 4 of user alice.\n" * 20 + stripped)
    _, text, _ = config_check(tmp_path, log)
    assert "syslog lines with neither the kernel's [uptime] stamp nor an indent" in text.stderr
    log.write_bytes(rsyslog_imklog(capture("dmesg-syslog-raw.txt")))
    _, text, _ = config_check(tmp_path, log)
    assert text.stderr == ""


@pytest.mark.parametrize("name", ["dmesg-syslog.txt", "dmesg-syslog-raw.txt", "dmesg-syslog-human.txt"])
def test_a_read_that_starts_on_a_records_later_line_still_tells_it(tmp_path, name):
    """A file written a line at a time: a hook's read can end after a record's first line, and the
    next read then starts on its forged later line. The line before the cursor is read back, so
    the stamp it shares with that line still tells it."""
    data = capture(name)
    first = data.rindex(b"\n", 0, data.index(FORGED_TEXT)) + 1       # the read ends just before the forged line
    log = tmp_path / "dmesg.log"
    state = str(tmp_path / "state")
    log.write_bytes(data[:first])
    assert read_new_events(str(log), state, "gpu1", now=1796139964.0, booted=0).events == []
    read_new_events(str(log), state, "gpu1", now=1796139964.0, booted=0).commit()
    with open(log, "ab") as handle:
        handle.write(data[first:])
    later = read_new_events(str(log), state, "gpu1", now=1796139965.0, booted=0)
    assert later.rescan is None and later.stats.bytes_read == len(data) - first
    assert later.events == []


def test_a_driver_burst_split_by_a_read_is_still_read(tmp_path):
    """The line before a read's first byte vouches as a whole driver line when it starts its own
    record (another stamp before it): the driver's burst that one stamp covers is still read."""
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    stamp = b"Dec  1 15:45:57 vm kernel: [  218.500000] "
    log.write_bytes(b"Dec  1 15:45:57 vm kernel: [  218.400000] pcieport 0000:00:01.0: AER: Uncorrected error\n"
                    + stamp + b"NVRM: GPU at PCI:0000:3b:00: GPU-509665ad-1111-2222-3333-444455556666\n")
    read_new_events(str(log), state, "gpu1", now=1796139964.0, booted=0).commit()
    with open(log, "ab") as handle:
        handle.write(stamp + XID48 + b"\n")
    later = read_new_events(str(log), state, "gpu1", now=1796139965.0, booted=0)
    assert later.rescan is None and [event.code for event in later.events] == [48]
