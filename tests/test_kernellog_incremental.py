"""Incremental reads: a cursor per source in the state dir, bounded rescans, kmsg and journal."""
from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest

from healthcheck.kernellog import cursor as cursor_module
from healthcheck.kernellog import kmsg, readers
from healthcheck.kernellog.api import KernelLogError, read_new_events
from healthcheck.sim.node import SimNode

from .conftest import run_cli

# Syslog lines carry no year; stamping them "now" keeps them inside the flood window.
NOW = float(int(time.time()))
STAMP = time.strftime("%b %d %H:%M:%S", time.localtime(NOW)).replace("{", "").replace("}", "")
NOISE = STAMP + " gpu001 systemd[1]: Started Session {n} of user alice.\n"
XID13 = STAMP + " gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid={n}, name=python, Graphics Exception\n"
XID79 = "[ 8812.332117] NVRM: Xid (PCI:0000:5d:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n"


def write(path, text, mode="a"):
    with open(path, mode, encoding="utf-8") as handle:
        handle.write(text)


def lines(template, count, start=0):
    return "".join(template.format(n=n) for n in range(start, start + count))


def test_second_read_reads_exactly_the_appended_lines(tmp_path):
    log = tmp_path / "kern.log"
    write(log, lines(NOISE, 5000) + XID13.format(n=1))
    first = read_and_commit(str(log), str(tmp_path / "state"), "gpu1", now=NOW)
    assert first.rescan == "no cursor yet" and first.stats.lines_read == 5001
    appended = lines(NOISE, 37, 9000) + XID13.format(n=2) + lines(NOISE, 12, 9100)
    write(log, appended)
    second = read_and_commit(str(log), str(tmp_path / "state"), "gpu1", now=NOW + 10)
    assert second.rescan is None
    assert second.stats.lines_read == 50 and second.stats.bytes_read == len(appended.encode())
    assert [(event.code, event.count, event.count_new) for event in second.events] == [(13, 2, 1)]
    third = read_and_commit(str(log), str(tmp_path / "state"), "gpu1", now=NOW + 20)
    assert third.stats.bytes_read == 0 and third.events == []
    assert [event.code for event in third.active] == [13]      # still inside the flood window


def test_a_line_being_written_is_read_when_it_is_complete(tmp_path):
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    write(log, NOISE.format(n=1))
    read_and_commit(str(log), state, "gpu1", now=NOW)
    partial = XID79[:40]
    write(log, partial)
    half = read_and_commit(str(log), state, "gpu1", now=NOW + 1)
    assert half.events == []
    write(log, XID79[40:])
    whole = read_and_commit(str(log), state, "gpu1", now=NOW + 2)
    assert [event.code for event in whole.events] == [79] and whole.stats.lines_read == 1


def test_first_read_of_a_big_log_is_bounded(tmp_path):
    log = tmp_path / "kern.log"
    write(log, lines(NOISE, 40_000) + XID13.format(n=7))
    config = _config(tmp_path, rescan_bytes=65536)
    result = read_and_commit(str(log), str(tmp_path / "state"), "gpu1", config=config, now=NOW)
    assert result.stats.bytes_read <= 65536 + 1 < os.path.getsize(log)
    assert [event.code for event in result.events] == [13]


def test_truncation_leads_to_a_bounded_rescan(tmp_path):
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    config = _config(tmp_path, rescan_bytes=4096)
    write(log, lines(NOISE, 2000))
    read_and_commit(str(log), state, "gpu1", config=config, now=NOW)
    write(log, lines(NOISE, 10) + XID79, mode="w")               # shorter: like a reboot
    result = read_and_commit(str(log), state, "gpu1", config=config, now=NOW + 5)
    assert result.rescan == "the file was truncated"
    assert [event.code for event in result.events] == [79]
    write(log, lines(NOISE, 3000, 50) + XID13.format(n=3), mode="w")   # rewritten, longer than before
    result = read_and_commit(str(log), state, "gpu1", config=config, now=NOW + 6)
    assert result.rescan == "the file was rewritten" and result.stats.bytes_read <= 4097
    assert [event.code for event in result.events] == [13]


def test_rotation_finishes_the_old_file_then_reads_the_new(tmp_path):
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    write(log, lines(NOISE, 100))
    read_and_commit(str(log), state, "gpu1", now=NOW)
    write(log, XID13.format(n=1))                         # written before the rotation, not yet read
    os.rename(log, tmp_path / "kern.log.1")
    write(log, lines(NOISE, 3) + XID79)
    result = read_and_commit(str(log), state, "gpu1", now=NOW + 5)
    assert result.rescan == "the file was rotated or replaced"
    assert sorted(event.code for event in result.events) == [13, 79]
    assert result.stats.bytes_read == len((XID13.format(n=1) + lines(NOISE, 3) + XID79).encode())


def test_cursor_state_is_private_and_links_are_not_followed(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "state"
    write(log, lines(NOISE, 10))
    read_and_commit(str(log), str(state), "gpu1", now=NOW)
    directory = state / "kernellog" / "gpu1"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o750
    files = sorted(name for name in os.listdir(directory) if not name.startswith("."))
    assert files[0].startswith("cursor-file-") and "flood.json" in files
    for name in files:
        assert stat.S_IMODE(os.stat(directory / name).st_mode) == 0o640
    cursor_path = directory / files[0]
    saved = json.loads(cursor_path.read_text())
    assert saved["offset"] == os.path.getsize(log) and saved["source"] == str(log)
    # A link where the cursor was (someone pointing it elsewhere) is not believed: bounded rescan.
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps(dict(saved, offset=0)))
    os.unlink(cursor_path)
    os.symlink(elsewhere, cursor_path)
    assert cursor_module.read_json(str(cursor_path)) is None
    with pytest.raises(ValueError):
        read_and_commit(str(log), str(state), "../escape", now=NOW)


def test_sim_inject_and_reset_are_read_incrementally(tmp_path, sim_config, isolated_env):
    state = str(tmp_path / "state")
    node = SimNode(state, "gpu2", os.path.join(str(tmp_path), "sim", "h100-xid79-gpu-lost.toml"))
    node.ensure()
    first = read_and_commit(node.kernel_log_path, state, "gpu2", now=NOW)
    assert [event.code for event in first.events] == [79]
    assert first.events[0].uuid == "GPU-2f7c1e4a-0003-4c1d-9e2b-8a6f3d0c0003"      # from the companion line
    done = run_cli(["sim", "inject", "--config", sim_config, "gpu2", "--log",
                    "[ 9000.1] NVRM: Xid (PCI:0000:5d:00): 48, An uncorrectable double bit error (DBE)"])
    assert done.exit_code == 0, done.output
    second = read_and_commit(node.kernel_log_path, state, "gpu2", now=NOW + 1)
    assert [event.code for event in second.events] == [48] and second.stats.lines_read == 1
    assert second.events[0].uuid == "GPU-2f7c1e4a-0003-4c1d-9e2b-8a6f3d0c0003"      # remembered between runs
    assert run_cli(["sim", "reset", "--config", sim_config, "gpu2"]).exit_code == 0
    third = read_and_commit(node.kernel_log_path, state, "gpu2", now=NOW + 2)
    assert third.rescan is not None and [event.code for event in third.events] == [79]


# -- /dev/kmsg ---------------------------------------------------------------------------------

def kmsg_record(seq: int, text: str, usec: int = 5_000_000) -> str:
    return f"4,{seq},{usec + seq},-;{text}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"


def test_kmsg_sequence_numbers_are_the_cursor(tmp_path, monkeypatch):
    fake = tmp_path / "kmsg"
    monkeypatch.setattr(readers, "KMSG", str(fake))
    monkeypatch.setattr(kmsg, "boot_id", lambda: "boot-1")
    monkeypatch.setattr(kmsg, "boot_time", lambda: 1_700_000_000.0)
    write(fake, kmsg_record(1, "NVRM: loading") + kmsg_record(2, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
    state = str(tmp_path / "state")
    first = read_and_commit("kmsg", state, "gpu1", now=NOW)
    assert [event.code for event in first.events] == [79]
    assert first.events[0].time == pytest.approx(1_700_000_000.0 + 5.000002)
    # The ring buffer still holds the old records; only higher sequence numbers are new.
    write(fake, kmsg_record(3, "NVRM: Xid (PCI:0000:3b:00): 48, DBE"))
    second = read_and_commit("kmsg", state, "gpu1", now=NOW + 1)
    assert [event.code for event in second.events] == [48] and second.rescan is None
    monkeypatch.setattr(kmsg, "boot_id", lambda: "boot-2")
    after_reboot = read_and_commit("kmsg", state, "gpu1", now=NOW + 2)
    assert after_reboot.rescan == "the node rebooted"


# -- journalctl ----------------------------------------------------------------------------------

FAKE_JOURNALCTL = """#!{python}
import os, sys, time
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(" ".join(args) + "\\n")
if os.path.exists({log!r} + ".hang"):
    time.sleep(30)
if os.path.exists({log!r} + ".empty"):      # journalctl 252: nothing to show with --show-cursor is exit 1
    print("-- No entries --")
    sys.exit(1)
after = [a for a in args if a.startswith("--after-cursor=")]
if after and after[0] == "--after-cursor=bad":
    sys.stderr.write("Failed to seek to cursor: Invalid argument\\n")
    sys.exit(1)
if after:
    print("1800000001.500000 gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 48, DBE")
    print("-- cursor: s=2")
else:
    print("1800000000.250000 gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    print("-- cursor: s=1")
"""


def read_and_commit(*args, **kwargs):
    """A hook's whole cycle: read, then commit (nothing acts in between here)."""
    read = read_new_events(*args, **kwargs)
    read.commit()
    return read


@pytest.fixture
def fake_journal(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    script = tmp_path / "journalctl"
    script.write_text(FAKE_JOURNALCTL.format(python=sys.executable, log=str(calls)))
    script.chmod(0o755)
    monkeypatch.setattr(readers, "JOURNALCTL_PATHS", (str(script),))
    return calls


def test_journal_cursor_is_passed_and_a_bad_one_means_a_bounded_rescan(tmp_path, fake_journal):
    state = str(tmp_path / "state")
    first = read_and_commit("journal", state, "gpu1", now=NOW)
    assert [event.code for event in first.events] == [79] and first.events[0].time == 1800000000.25
    assert "-b -n" in fake_journal.read_text().splitlines()[0]          # bounded: this boot, last N lines
    second = read_and_commit("journal", state, "gpu1", now=NOW + 1)
    assert [event.code for event in second.events] == [48]
    assert "--after-cursor=s=1" in fake_journal.read_text().splitlines()[1]
    store = cursor_module.StateStore(state, "gpu1")
    store.save_cursor("journal", "journal", {"cursor": "bad"})
    third = read_and_commit("journal", state, "gpu1", now=NOW + 2)
    assert third.rescan == "journalctl refused the cursor"


def test_an_empty_journal_is_no_events_not_an_error(tmp_path, fake_journal):
    (tmp_path / "calls.empty").write_text("")
    result = read_and_commit("journal", str(tmp_path / "state"), "gpu1", now=NOW)
    assert result.events == [] and result.rescan == "no cursor yet"


def test_a_hanging_journalctl_is_killed_at_the_deadline(tmp_path, fake_journal):
    (tmp_path / "calls.hang").write_text("")
    config = _config(tmp_path, source_timeout_s=1)
    with pytest.raises(KernelLogError, match="did not finish within 1 s"):
        read_and_commit("journal", str(tmp_path / "state"), "gpu1", config=config, now=NOW)


def test_unreadable_sources_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(KernelLogError, match="cannot read .*missing"):
        read_and_commit(str(tmp_path / "missing"), str(tmp_path / "state"), "gpu1", now=NOW)
    with pytest.raises(KernelLogError, match="not a regular file"):
        read_and_commit(str(tmp_path), str(tmp_path / "state"), "gpu1", now=NOW)
    monkeypatch.setattr(readers, "JOURNALCTL_PATHS", ())
    monkeypatch.setattr(readers.shutil, "which", lambda name: None)
    with pytest.raises(KernelLogError, match="journalctl not found"):
        read_and_commit("journal", str(tmp_path / "state"), "gpu1", now=NOW)


def _config(tmp_path, **xid):
    from healthcheck.config import Config

    return Config.from_document({"paths": {"state_dir": str(tmp_path / "state")}, "xid": xid}, None)



def test_an_unusable_state_dir_is_a_one_line_error(tmp_path):
    log = tmp_path / "kern.log"
    write(log, XID79)
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    with pytest.raises(KernelLogError, match="cannot use the state dir"):
        read_and_commit(str(log), str(blocker), "gpu1", now=NOW)


def test_a_time_window_read_of_a_big_file_starts_near_the_window(tmp_path):
    """The epilog's read: bisection on line times, not a read of the whole file."""
    from healthcheck.kernellog.api import events_between

    start = 1_700_000_000
    noise = "{t:.6f} gpu001 systemd[1]: Started Session {n} of user alice.\n"
    xid = "{t:.6f} gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=python, fault\n"
    chunks = [xid.format(t=start, code=31)]
    chunks += [noise.format(t=start + n * 0.01, n=n) for n in range(150_000)]
    chunks.append(xid.format(t=start + 1499.0, code=48))
    chunks += [noise.format(t=start + 1500 + n * 0.01, n=n) for n in range(1000)]
    log = tmp_path / "kern.log"
    write(log, "".join(chunks))
    size = os.path.getsize(log)
    found = events_between(str(log), start + 1490, start + 1600)
    assert [event.code for event in found] == [48]
    from healthcheck.kernellog.api import scan_events

    window = scan_events(str(log), start + 1490)
    assert window.stats.bytes_read < size / 2, (window.stats.bytes_read, size)
    everything = scan_events(str(log))
    assert [event.code for event in everything.events] == [31, 48] and everything.stats.bytes_read == size


@pytest.mark.parametrize("tail", ["", XID79[:40]], ids=["ends-on-a-line", "line-being-written"])
def test_starting_at_the_end_saves_the_cursor_a_read_to_the_end_would(tmp_path, tail):
    """The prolog's shortcut (a stat and one short read, no scan) places a job's reader where
    reading the whole log and committing would, and the next read gets exactly what follows."""
    log = tmp_path / "kern.log"
    write(log, lines(NOISE, 3000) + XID13.format(n=1) + tail)
    state = str(tmp_path / "state")
    read_and_commit(str(log), state, "gpu1.read", now=NOW)
    assert cursor_module.start_file_at_end(str(log), state, "gpu1.job.7") is True
    saved = {}
    for reader in ("gpu1.read", "gpu1.job.7"):
        folder = tmp_path / "state" / "kernellog" / reader
        saved[reader] = {p.name: json.loads(p.read_text()) for p in folder.glob("cursor-*.json")}
    assert saved["gpu1.job.7"] == saved["gpu1.read"] and len(saved["gpu1.read"]) == 1
    write(log, XID79[len(tail):] + lines(NOISE, 3, 9000))
    after = read_and_commit(str(log), state, "gpu1.job.7", now=NOW + 5)
    assert after.rescan is None and [event.code for event in after.events] == [79]


def test_starting_at_the_end_leaves_no_flood_state_of_an_earlier_reader(tmp_path):
    """A reader name used before (a job id again) starts with no flood state: the old file is
    removed (absent reads as empty) instead of an empty one being written and synced."""
    log = tmp_path / "kern.log"
    write(log, lines(NOISE, 30))
    state = str(tmp_path / "state")
    folder = tmp_path / "state" / "kernellog" / "gpu1.job.7"
    assert cursor_module.start_file_at_end(str(log), state, "gpu1.job.7") is True
    assert not (folder / "flood.json").exists()
    (folder / "flood.json").write_text('{"stale": 1}')
    os.chmod(folder / "flood.json", 0o640)
    assert cursor_module.start_file_at_end(str(log), state, "gpu1.job.7") is True
    assert not (folder / "flood.json").exists()
    assert cursor_module.StateStore(state, "gpu1.job.7").load_flood() == {}


def test_starting_at_the_end_declines_what_it_cannot_place(tmp_path):
    """A compressed file or one without a line end near its end: False, and the caller reads."""
    state = str(tmp_path / "state")
    packed = tmp_path / "kern.log.gz"
    packed.write_bytes(b"\x1f\x8b" + b"\0" * 64)
    assert cursor_module.start_file_at_end(str(packed), state, "gpu1.job.1") is False
    endless = tmp_path / "endless.log"
    endless.write_bytes(b"x" * (70 * 1024))
    assert cursor_module.start_file_at_end(str(endless), state, "gpu1.job.1") is False
    with pytest.raises(OSError):
        cursor_module.start_file_at_end(str(tmp_path / "missing.log"), state, "gpu1.job.1")
    assert not (tmp_path / "state" / "kernellog" / "gpu1.job.1").exists()


def test_a_reader_at_the_end_of_an_unchanged_file_is_told_so_and_nothing_else_is(tmp_path):
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    write(log, lines(NOISE, 100))
    assert cursor_module.file_unchanged(str(log), state, "gpu1.job.9") is False      # no cursor yet
    assert cursor_module.start_file_at_end(str(log), state, "gpu1.job.9")
    assert cursor_module.file_unchanged(str(log), state, "gpu1.job.9") is True
    write(log, XID79[:20])                                                              # a line being written
    assert cursor_module.file_unchanged(str(log), state, "gpu1.job.9") is False
    write(log, lines(NOISE, 100), mode="w")
    assert cursor_module.start_file_at_end(str(log), state, "gpu1.job.9")
    log.write_bytes(log.read_bytes()[:-2] + b"!\n")                                      # same size, rewritten
    assert cursor_module.file_unchanged(str(log), state, "gpu1.job.9") is False


def test_a_hook_read_of_an_unchanged_log_neither_loads_the_reader_nor_misses_what_comes_next(tmp_path, monkeypatch):
    from healthcheck.config import Config
    from healthcheck.probes.xid_events import probe_kernel_log

    config = Config.load(None, {})
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    write(log, lines(NOISE, 50) + XID13.format(n=1))
    first = probe_kernel_log(str(log), state, "gpu1", "health", config, now=NOW)
    assert [event.code for event in first.events] == [13] and first.read is not None
    first.read.commit()
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "healthcheck.kernellog.api", None)      # importing it would fail
        quiet = probe_kernel_log(str(log), state, "gpu1", "health", config, now=NOW + 60)
    assert quiet.status == "ok" and quiet.events == [] and quiet.read is None
    assert quiet.source == os.path.abspath(log)
    write(log, XID79)
    after = probe_kernel_log(str(log), state, "gpu1", "health", config, now=NOW + 120)
    assert [event.code for event in after.events] == [79]


def rewrite_in_place(log, at, xid, noise):
    """copytruncate, then the same lines again with ``xid`` among them: the lines from the first
    line boundary after byte ``at`` on that ``xid`` and a padding line fill exactly, every other
    byte as before (the file's first 4 KiB, the 64 bytes before the old offset), then new lines."""
    old = log.read_bytes()
    first = old.index(b"\n", at) + 1
    last = first
    while last - first < len(xid) + 1:
        last = old.index(b"\n", last) + 1
    middle = xid.encode() + b"x" * (last - first - len(xid) - 1) + b"\n"
    rewritten = old[:first] + middle + old[last:] + noise.encode() * 3
    assert first >= 4096 and last <= len(old) - 64 and len(middle) == last - first
    with open(log, "r+b") as handle:
        handle.truncate(0)
        handle.write(rewritten)


def test_copytruncate_rewritten_with_identical_lines_beyond_the_hashed_head_is_seen(tmp_path):
    """issue 34 finding 9: rewritten in place with byte-identical lines, so that the first 4 KiB
    and the 64 bytes before the old offset are the same; the new Xid 79 lies between them. The
    cursor's hash of the bytes before its offset tells, and the rescan reads the Xid."""
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    noise = NOISE.format(n=7)
    write(log, noise * 400)
    read_and_commit(str(log), state, "gpu1", now=NOW)
    rewrite_in_place(log, len(noise) * 150, XID79, noise)
    result = read_and_commit(str(log), state, "gpu1", now=NOW + 1)
    assert result.rescan == "the file was rewritten"
    assert [event.code for event in result.events] == [79]


def test_the_span_hash_reads_nothing_twice_when_lines_are_only_appended(tmp_path):
    """The normal append case under the same hashes: a read takes exactly the appended bytes, and a
    file longer than the hashed span ([xid] rescan_bytes) is followed the same way."""
    from healthcheck.config import Config

    config = Config.load(None, {"xid": {"rescan_bytes": 8192}})
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    noise = NOISE.format(n=7)
    write(log, noise * 2000)
    read_and_commit(str(log), state, "gpu1", config=config, now=NOW)
    for round_ in range(3):
        appended = lines(NOISE, 40, 100 * round_) + XID13.format(n=round_)
        write(log, appended)
        read = read_and_commit(str(log), state, "gpu1", config=config, now=NOW + 10 + round_)
        assert read.rescan is None and read.stats.bytes_read == len(appended.encode())
        assert [(event.code, event.count_new) for event in read.events] == [(13, 1)]
    quiet = read_and_commit(str(log), state, "gpu1", config=config, now=NOW + 20)
    assert quiet.rescan is None and quiet.stats.bytes_read == 0 and quiet.events == []
    # A rewrite within the span, beyond the head, is seen there too.
    rewrite_in_place(log, log.stat().st_size - 4096, XID79, noise)
    seen = read_and_commit(str(log), state, "gpu1", config=config, now=NOW + 30)
    assert seen.rescan == "the file was rewritten" and 79 in [event.code for event in seen.events]


def test_copytruncate_rewritten_with_the_same_bytes_before_the_old_offset_is_seen(tmp_path):
    """A log truncated in place and written again so that the 64 bytes before the old offset are
    byte-identical (aligned repeated lines) still counts as rewritten: the Xid 79 in it is read."""
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    noise = NOISE.format(n=7)
    write(log, noise * 200)
    read_and_commit(str(log), state, "gpu1", now=NOW)
    size = log.stat().st_size
    # copytruncate, then new lines: an Xid 79 and enough lines after it that the file ends, as
    # before, in the same line, aligned with the old offset.
    xid = XID79
    filler = size - len(xid) - len(noise)
    rewritten = "x" * (filler - 1) + "\n" + xid + noise
    assert len(rewritten) == size
    with open(log, "r+", encoding="utf-8") as handle:
        handle.truncate(0)
        handle.write(rewritten)
    result = read_and_commit(str(log), state, "gpu1", now=NOW + 1)
    assert result.rescan == "the file was rewritten"
    assert [event.code for event in result.events] == [79]
