"""State files under faults and hostile neighbours: writes are whole or absent, modes do not
depend on the umask, a FIFO or device is never opened as a state file, lock waits end."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat

import pytest

from healthcheck.safeio import fsutil
from healthcheck.hooklib import runlog
from healthcheck.counters.history import CounterHistory
from healthcheck.kernellog.cursor import StateStore

from .conftest import run_cli


@contextlib.contextmanager
def hang_guard(seconds: int = 20):
    """A hang (opening a FIFO) becomes a test failure instead of a stalled suite."""
    def hung(signum, frame):
        raise AssertionError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def leftovers(directory) -> list:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


# -- 5: atomic writes that are atomic ------------------------------------------------------------

def test_short_writes_are_continued_until_the_whole_file_is_written(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(fsutil.os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    target = tmp_path / "flood.json"
    payload = b'{"events": [' + b"1, " * 1000 + b"2]}"
    fsutil.atomic_write(str(target), payload)
    assert target.read_bytes() == payload


def disk_that_fills_after(budget: int):
    """os.write of a disk with ``budget`` bytes left: writes what fits, then ENOSPC."""
    real_write, left = os.write, [budget]

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real_write(fd, bytes(data[:left[0]]))
        left[0] -= written
        return written
    return write


@pytest.mark.parametrize("after", [0, 100])
def test_a_full_disk_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch, after):
    target = tmp_path / "flood.json"
    fsutil.atomic_write(str(target), b'{"old": true}')
    monkeypatch.setattr(fsutil.os, "write", disk_that_fills_after(after))
    with pytest.raises(OSError) as caught:
        fsutil.atomic_write(str(target), b'{"new": ' + b"0" * 5000 + b"}")
    assert caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b'{"old": true}'
    assert leftovers(tmp_path) == []


def test_a_line_torn_by_a_full_disk_never_swallows_the_next_append(tmp_path, monkeypatch):
    """Measured in the lab's soak: a journal append on a full state disk wrote part of its line
    (the rest of the file's last page), and the next run's line was glued to it: both lost."""
    import json

    journal = tmp_path / "gpu2.jsonl"
    fsutil.append_line(str(journal), json.dumps({"run": 1}))
    real_write = os.write
    monkeypatch.setattr(fsutil.os, "write", disk_that_fills_after(7))
    with pytest.raises(OSError):
        fsutil.append_line(str(journal), json.dumps({"run": 2, "torn": "by the full disk"}))
    monkeypatch.setattr(fsutil.os, "write", real_write)
    fsutil.append_line(str(journal), json.dumps({"run": 3}))
    lines = journal.read_text().splitlines()
    assert lines[0] == '{"run": 1}' and lines[-1] == '{"run": 3}' and len(lines) == 3
    assert json.loads(lines[-1]) == {"run": 3}


def test_a_write_that_returns_zero_is_an_error_not_a_truncated_file(tmp_path, monkeypatch):
    target = tmp_path / "cursor.json"
    fsutil.atomic_write(str(target), b"old")
    monkeypatch.setattr(fsutil.os, "write", lambda fd, data: 0)
    with pytest.raises(OSError):
        fsutil.atomic_write(str(target), b"new content")
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_a_preplaced_link_at_a_temporary_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    state = tmp_path / "state"
    state.mkdir()
    # The old temporary name was predictable: .<name>.<pid>.tmp
    os.link(victim, state / f".flood.json.{os.getpid()}.tmp")
    os.symlink(victim, state / f".flood.json.{os.getpid() + 1}.tmp")
    fsutil.atomic_write(str(state / "flood.json"), b"{}")
    assert victim.read_bytes() == b"precious"
    assert (state / "flood.json").read_bytes() == b"{}"


def test_temporary_names_are_fresh_and_created_exclusively(tmp_path, monkeypatch):
    opened = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        if str(path).endswith(".tmp"):
            opened.append((os.path.basename(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(fsutil.os, "open", spy)
    for _ in range(3):
        fsutil.atomic_write(str(tmp_path / "x.json"), b"{}")
    names = [name for name, _ in opened]
    assert len(set(names)) == 3
    assert all(flags & os.O_EXCL and flags & os.O_NOFOLLOW and flags & os.O_CREAT for _, flags in opened)


def test_the_data_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(fsutil.os, "fsync", lambda fd: events.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(fsutil.os, "replace", lambda a, b: events.append("replace") or real_replace(a, b))
    fsutil.atomic_write(str(tmp_path / "x.json"), b"{}")
    assert events[:2] == ["fsync", "replace"]


def test_an_output_written_without_fsync_is_still_whole_and_exactly_its_mode(tmp_path, monkeypatch):
    """durable=False (the health check's last result and metrics) skips only the fsyncs."""
    synced = []
    monkeypatch.setattr(fsutil.os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "out" / "metrics.prom"
    fsutil.atomic_write(str(path), "old\n", mode=0o644, durable=False)
    fsutil.atomic_write(str(path), "new\n" * 1000, mode=0o644, durable=False)
    assert synced == []
    assert path.read_text() == "new\n" * 1000 and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(path.parent) == ["metrics.prom"]
    fsutil.atomic_write(str(path), "durable\n")
    assert len(synced) == 2          # the data and the directory entry


def test_a_hook_whose_disk_is_full_exits_zero(tmp_path, monkeypatch, capsys):
    from slurm_hooks import prolog

    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    monkeypatch.setenv("SLURM_GPU_HOOKS_CONFIG", str(config))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsutil.os, "write", full)
    assert prolog.main([]) == 0
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err


# -- 6: modes regardless of umask ----------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_state_dirs_and_files_get_their_modes_whatever_the_umask(tmp_path, mask):
    state = tmp_path / "var" / "lib" / "slurm-gpu-hooks"
    with umask(mask):
        runlog.record_run(str(state), "prolog", "gpu1", "7")
        CounterHistory(str(state), "gpu1").record({"gpu.0.ecc": (1.0, 3600.0)}, 1000.0)
        with StateStore(str(state), "gpu1").lock():
            pass
        fsutil.atomic_write(str(state / "x.json"), "{}")
    for directory in (state, state / "hook-runs", state / "counters", state / "kernellog", state / "kernellog" / "gpu1",
                      tmp_path / "var" / "lib"):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o750, directory
    for path in (state / "hook-runs" / "gpu1.jsonl", state / "counters" / "gpu1.json", state / "x.json",
                 state / "kernellog" / "gpu1" / ".lock"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640, path


def test_an_existing_state_dir_open_to_others_is_tightened(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    runlog.record_run(str(state), "healthcheck", "gpu1")
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o750


def test_an_existing_journal_with_a_loose_mode_is_tightened(tmp_path):
    journal = tmp_path / "state" / "hook-runs" / "gpu1.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("")
    os.chmod(journal, 0o666)
    runlog.record_run(str(tmp_path / "state"), "healthcheck", "gpu1")
    assert stat.S_IMODE(os.stat(journal).st_mode) == 0o640


def test_a_state_dir_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    state = tmp_path / "theirs"
    state.mkdir()
    monkeypatch.setattr(fsutil.os, "geteuid", lambda: os.stat(state).st_uid + 1)
    with pytest.raises(PermissionError) as caught:
        runlog.record_run(str(state), "healthcheck", "gpu1")
    assert "owned by uid" in str(caught.value)
    assert not (state / "hook-runs").exists()


def test_a_symlinked_state_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "state")
    with pytest.raises(OSError):
        runlog.record_run(str(tmp_path / "state"), "healthcheck", "gpu1")
    assert list(real.iterdir()) == []


def special_file(path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))    # /dev/null's numbers


SPECIAL = ["fifo"] + (["device"] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_fifo_or_device_as_the_hook_journal_is_refused_not_hung_on(tmp_path, kind):
    journal = tmp_path / "state" / "hook-runs" / "gpu1.jsonl"
    journal.parent.mkdir(parents=True)
    special_file(journal, kind)
    with hang_guard():
        with pytest.raises(OSError):
            runlog.record_run(str(tmp_path / "state"), "prolog", "gpu1", "7")
        assert list(runlog.read_runs(str(tmp_path / "state"))) == []


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_fifo_or_device_as_a_lock_or_counter_file_is_refused(tmp_path, kind):
    state = tmp_path / "state"
    (state / "counters").mkdir(parents=True)
    special_file(state / "counters" / "gpu1.json", kind)
    special_file(state / "counters" / ".gpu1.lock", kind)
    history = CounterHistory(str(state), "gpu1")
    with hang_guard():
        assert history.load() == {}          # not ours to read: a new baseline, no hang
        with pytest.raises(OSError):
            history.record({"k": (1.0, 60.0)}, 1.0)


# -- 9: lock waits have a deadline ---------------------------------------------------------------

def test_a_lock_held_elsewhere_ends_the_wait_with_an_error(tmp_path):
    path = tmp_path / "state" / ".lock"
    path.parent.mkdir()
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with hang_guard():
            with pytest.raises(fsutil.LockTimeout) as caught:
                with fsutil.locked(str(path), timeout_s=0.2):
                    pass
        assert caught.value.errno == errno.ETIMEDOUT and "held by another process" in str(caught.value)
    finally:
        os.close(holder)
    with fsutil.locked(str(path), timeout_s=0.2):
        pass


def test_check_with_a_held_state_lock_says_so_and_does_not_hang(sim_config, tmp_path, monkeypatch):
    monkeypatch.setattr(fsutil, "LOCK_WAIT_S", 0.3)
    assert run_cli(["check", "--config", sim_config, "--node", "gpu1"]).exit_code == 0
    state = tmp_path / "state"
    holders = []
    for lock in (state / "counters" / ".gpu1.lock", state / "kernellog" / "gpu1.cli.health" / ".lock"):
        if lock.exists():
            fd = os.open(lock, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            holders.append(fd)
    assert holders, "the first run made its lock files"
    try:
        with hang_guard(60):
            result = run_cli(["check", "--config", sim_config, "--node", "gpu1", "--json"])
    finally:
        for fd in holders:
            os.close(fd)
    assert "Traceback" not in result.stderr
    assert "held by another process" in result.stdout + result.stderr
