"""The kernel-log file's doorbell (healthcheck/watch/inotify.py): the idle watcher sleeps until the
file changes instead of a stat every poll_s, and still sees appends, truncation and rotation."""
from __future__ import annotations

import os
import threading
import time

from healthcheck.watch import service
from healthcheck.watch.inotify import open_doorbell


def test_the_bell_rings_for_appends_truncation_and_rotation_and_not_for_a_neighbour(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("a\n")
    bell = open_doorbell(str(log))
    assert bell is not None
    try:
        assert bell.rang() and not bell.rang()          # once at the start, then only on change
        (tmp_path / "syslog").write_text("another file's line\n")
        assert not bell.rang()
        with open(log, "a") as handle:
            handle.write("b\n")
        assert bell.rang()
        os.truncate(log, 0)                              # copytruncate
        assert bell.rang()
        os.rename(log, tmp_path / "kern.log.1")          # rotation: moved away, then a new file
        assert bell.rang()
        log.write_text("c\n")
        assert bell.rang()
        with open(log, "a") as handle:                   # the new file is the one watched now
            handle.write("d\n")
        assert bell.rang()
        with open(tmp_path / "kern.log.1", "a") as handle:
            handle.write("late line of the old file\n")
        assert not bell.rang()
    finally:
        bell.close()


def test_the_idle_wait_sleeps_until_the_file_changes(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("a\n")
    wake = service.FileWake(str(log), open_doorbell(str(log)))
    try:
        assert wake.doorbell and wake.changed() and not wake.changed()
        threading.Timer(0.3, lambda: log.write_text("a\nb\n")).start()
        began = time.monotonic()
        wake.wait(5.0)
        assert time.monotonic() - began < 4.0            # woken by the write, not the timeout
        assert wake.changed()
    finally:
        wake.close()


def test_without_a_bell_the_file_is_stated_every_poll(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("a\n")
    wake = service.FileWake(str(log))
    assert not wake.doorbell and wake.changed() and not wake.changed()
    log.write_text("a\nb\n")
    assert wake.changed()


def test_a_link_is_not_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "logs").symlink_to(real)
    assert open_doorbell(str(tmp_path / "logs" / "kern.log")) is None   # IN_DONTFOLLOW on the directory
