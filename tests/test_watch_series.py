"""slurm-gpu-watch's own metrics (healthcheck/watch/series.py): the textfile it writes beside the
health check's, with the health check's writer (atomic, 0644 whatever the umask), what each series
says for a working, a triggering, an idle and a broken watcher, and that writing it added no
wake-up to an idle watcher (issue 30: at most one a second)."""
from __future__ import annotations

import os
import re
import stat
import types

from healthcheck.watch import series, service

from .conftest import ROOT
from .test_health_metrics import samples
from .test_watch import NOW, XID13, XID79, Node

WATCH_SERIES = {"slurm_gpu_watch_last_look_timestamp_seconds", "slurm_gpu_watch_last_line_timestamp_seconds",
                "slurm_gpu_watch_lines_read_total", "slurm_gpu_watch_triggers_total",
                "slurm_gpu_watch_read_errors_total"}


def read_series(path) -> dict:
    """{name: value} of the watcher's textfile, each sample labelled node="gpu7" and nothing else."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    found = samples(text)
    assert all(labels == frozenset({("node", "gpu7")}) for _, labels in found), text
    for name, _ in found:
        assert f"# TYPE {name} " in text, name
    return {name: value for (name, _), value in found.items()}


class Clocks:
    """The watcher's monotonic and wall clocks, moved by hand."""

    def __init__(self, mono: float = 100.0, wall: float = 1_700_000_000.0):
        self.mono, self.wall_now = mono, wall

    def clock(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.wall_now

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall_now += seconds


def looked_once(tmp_path):
    """A node on a clock moved by hand whose watcher has looked at its log once: (node, clocks,
    watcher, the watcher's textfile)."""
    node = Node(tmp_path)
    clocks = Clocks()
    watcher = node.watcher(clock=clocks.clock, wall=clocks.wall)
    watcher.run(service.FileWake(str(node.log)), once=True)
    return node, clocks, watcher, node.metrics / "slurm_gpu_watch_gpu7.prom"


def test_the_watcher_writes_its_series_0644_whatever_the_umask(tmp_path):
    node = Node(tmp_path)
    clocks = Clocks()
    watcher = node.watcher(clock=clocks.clock, wall=clocks.wall)
    node.append(f"{NOW} gpu001 kernel: usb 1-1: new high-speed USB device", XID13, XID79)
    old = os.umask(0o077)
    try:
        watcher.run(service.FileWake(str(node.log)), once=True)
    finally:
        os.umask(old)
    assert len(node.runs()) == 1
    path = node.metrics / "slurm_gpu_watch_gpu7.prom"
    assert os.listdir(node.metrics) == [path.name]          # by rename: no temporary left
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(node.metrics).st_mode) == 0o755
    assert read_series(path) == {
        "slurm_gpu_watch_last_look_timestamp_seconds": clocks.wall_now,
        "slurm_gpu_watch_last_line_timestamp_seconds": clocks.wall_now,
        "slurm_gpu_watch_lines_read_total": 3,
        "slurm_gpu_watch_triggers_total": 1,
        "slurm_gpu_watch_read_errors_total": 0,
    }


def test_a_run_it_starts_is_written_at_once_and_an_idle_look_within_a_minute(tmp_path):
    node, clocks, watcher, path = looked_once(tmp_path)
    first = clocks.wall_now
    assert read_series(path)["slurm_gpu_watch_triggers_total"] == 0
    clocks.advance(10)
    node.append(XID79)
    watcher.run(service.FileWake(str(node.log)), once=True)     # 10 s later, but a run started
    now = read_series(path)
    assert now["slurm_gpu_watch_triggers_total"] == 1 and now["slurm_gpu_watch_lines_read_total"] == 1
    assert now["slurm_gpu_watch_last_line_timestamp_seconds"] == first + 10
    clocks.advance(30)
    watcher.run(service.FileWake(str(node.log)), once=True)     # nothing new, 30 s on: not rewritten
    assert read_series(path)["slurm_gpu_watch_last_look_timestamp_seconds"] == first + 10
    clocks.advance(31)
    watcher.run(service.FileWake(str(node.log)), once=True)     # nothing new, a minute on: in order now
    later = read_series(path)
    assert later["slurm_gpu_watch_last_look_timestamp_seconds"] == first + 71
    assert later["slurm_gpu_watch_last_line_timestamp_seconds"] == first + 10
    assert watcher.series.writes == 3


def test_a_watcher_that_cannot_read_the_log_keeps_its_last_look_and_counts_the_errors(tmp_path, capsys):
    node, clocks, watcher, path = looked_once(tmp_path)
    good = clocks.wall_now
    os.unlink(node.log)
    os.mkdir(node.log)                       # not a file: the reader refuses it
    for _ in range(3):                       # three minutes of failing looks, each file written
        clocks.advance(61)
        watcher.run(service.FileWake(str(node.log)), once=True)
    broken = read_series(path)
    assert broken["slurm_gpu_watch_last_look_timestamp_seconds"] == good      # what the alert sees age
    assert broken["slurm_gpu_watch_read_errors_total"] == 3
    assert "cannot follow the kernel log" in capsys.readouterr().err


def test_a_textfile_that_cannot_be_written_is_said_once_and_the_watcher_goes_on(tmp_path, capsys):
    (tmp_path / "not-a-dir").write_text("")
    node = Node(tmp_path, extra="")
    node.config_path.write_text(node.config_path.read_text().replace(str(node.metrics), str(tmp_path / "not-a-dir")))
    clocks = Clocks()
    watcher = node.watcher(clock=clocks.clock, wall=clocks.wall)
    node.append(XID79)
    for _ in range(3):
        watcher.run(service.FileWake(str(node.log)), once=True)
        clocks.advance(61)
    assert len(node.runs()) == 1 and watcher.series.writes == 3
    said = [line for line in capsys.readouterr().err.splitlines() if "metrics textfile" in line]
    assert len(said) == 1 and "not written" in said[0] and "Traceback" not in said[0]


def test_without_a_textfile_dir_it_goes_under_the_state_dir_as_the_health_checks(tmp_path):
    node = Node(tmp_path)
    node.config_path.write_text(node.config_path.read_text().replace(f'textfile_dir = "{node.metrics}"',
                                                                     'textfile_dir = ""'))
    watcher = node.watcher()
    watcher.run(service.FileWake(str(node.log)), once=True)
    path = node.state / "health" / "slurm_gpu_watch_gpu7.prom"
    assert set(read_series(path)) == WATCH_SERIES
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(node.state / "health").st_mode) == 0o750


class _IdleDoorbell:
    """/dev/kmsg on an idle node: never rings; each wait moves the clocks by its timeout."""

    doorbell = True

    def __init__(self, watcher, clocks: Clocks, turns: int):
        self.watcher, self.clocks, self.turns, self.waits = watcher, clocks, turns, []

    def changed(self) -> bool:
        return False

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)
        self.clocks.advance(timeout)
        if len(self.waits) >= self.turns:
            self.watcher.stopping = True

    def close(self) -> None:
        pass


def test_an_idle_watcher_writes_once_a_minute_in_turns_it_takes_anyway(tmp_path, monkeypatch):
    """Ten minutes idle on a doorbell: every wait is still IDLE_S (issue 30: 0.5 wake-ups a
    second, no timer of the metrics' own), the file is written once a minute, and its last look
    follows the clock though the log was read once."""
    node = Node(tmp_path)
    clocks = Clocks()
    sleeps = []

    def sleep(seconds: float) -> None:          # the duty cycle's pause after the first read
        sleeps.append(seconds)
        clocks.advance(seconds)

    monkeypatch.setattr(service, "time", types.SimpleNamespace(sleep=sleep, time=clocks.wall, monotonic=clocks.clock))
    watcher = node.watcher(clock=clocks.clock, wall=clocks.wall)
    started = clocks.wall_now
    wake = _IdleDoorbell(watcher, clocks, turns=300)
    written = []
    real_write = watcher.series.write

    def write(now, snapshot):
        written.append(now)
        real_write(now, snapshot)

    watcher.series.write = write
    watcher.run(wake)
    assert service.IDLE_S == service.BOOT_LOOK_S == 2.0
    assert set(wake.waits) == {service.IDLE_S} and len(wake.waits) == 300
    assert len(sleeps) <= 1 and sum(sleeps) <= watcher.settings.poll_s
    elapsed = clocks.wall_now - started
    assert 590 <= elapsed <= 602
    assert len(written) == 10 and all(b - a >= series.WRITE_EVERY_S for a, b in zip(written, written[1:]))
    assert watcher.looks == 1
    last = read_series(node.metrics / "slurm_gpu_watch_gpu7.prom")["slurm_gpu_watch_last_look_timestamp_seconds"]
    assert last >= started + 9 * series.WRITE_EVERY_S


def test_docs_list_exactly_the_watchers_series():
    with open(os.path.join(ROOT, "docs", "healthcheck.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(slurm_gpu_watch_[a-z_]+)` \|", section, flags=re.M))
    assert rows == WATCH_SERIES == {family.name for family in series.families(series.Snapshot())}
