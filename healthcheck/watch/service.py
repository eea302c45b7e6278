"""``slurm-gpu-watch``: one small resident process per node that runs the health check as
soon as the kernel log says a GPU broke, instead of at the next HealthCheckInterval.

It follows the node's kernel log with the kernel-log reader (``kernellog.api.read_new_events``,
its own reader ``<node>.watch``: the same sources, forgery rules, flood folding and read
budget as the hooks) and judges what is new with ``xid.event_findings.xid_findings``, the code
the health check judges with. When a finding asks for a drain, it starts the HealthCheckProgram itself, as slurmd does (no
environment but ``SLURMD_NODENAME``), so the run takes the same lock, decision, drain budget
and confirmation as slurmd's. The watcher decides nothing, never calls Slurm and never opens NVML: a resident process
that held the GPUs open would make a GPU reset refuse, and the kernel log carries every Xid
(docs/kernel-log.md, "The watcher and NVML events").

Bounded: at most one run at a time and ``[watch] min_interval_s`` between starts
(``trigger.Trigger``); a flood of one Xid starts one run (``trigger.Seen``); its reads take at
most ``[watch] max_cpu`` of one core (``trigger.DutyCycle``), each at most ``[xid]
read_budget_bytes``. When the watcher itself is broken (the log unreadable, its state dir
unusable, a bug), it says so on stderr and runs nothing; when it is not running at all, the
periodic health check goes on as before: nothing depends on it.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..config.settings import WatchSettings
from .inotify import Doorbell, open_doorbell
from .series import Series, Snapshot, textfile_place
from .trigger import AFTER_BOOT_EVERY_MIN_S, AfterBoot, DutyCycle, Seen, Trigger, after_boot_every, wants_check

from . import PROG, say
READER = "watch"                 # the cursor's reader: <node>.watch
RUN_TIMEOUT_S = 60.0             # slurmd's own kill of a HealthCheckProgram
REPEAT_S = 60.0                  # the same event starts another run only after this
ERROR_BACKOFF_MAX_S = 60.0
BOOT_LOOK_S = 2.0                # how often the boot id is read (a small file)
# An idle watcher with a doorbell (/dev/kmsg) wakes only for its duties, this often at most: the
# boot id (BOOT_LOOK_S). Issue 30's target: at most 1 wake-up a second on an idle node.
IDLE_S = BOOT_LOOK_S
# With a file's doorbell, a stat this often all the same (an event lost in a rotation).
BELL_CHECK_S = 30.0


# -- knowing when the log may hold something new ----------------------------------------------------
class FileWake:
    """A file source: something new when its inode, size or mtime moved (a stat). With a doorbell
    (inotify: ``watch/inotify.py``) the stat waits for the kernel to say the file changed, and
    the idle watcher sleeps until then or its next duty; without one, a stat every poll_s."""

    def __init__(self, path: str, bell: Optional["Doorbell"] = None):
        self.path = path
        self._last: Optional[tuple] = None
        self._bell = bell
        self.doorbell = bell is not None
        self._checked = 0.0

    def changed(self) -> bool:
        if self._bell is not None and not self._bell.rang():
            # A missed event (a watch lost in a rotation) costs at most this long: a stat anyway.
            if time.monotonic() - self._checked < BELL_CHECK_S:
                return False
        self._checked = time.monotonic()
        try:
            info = os.stat(self.path)
            now = (info.st_ino, info.st_size, info.st_mtime_ns)
        except OSError:
            now = None
        moved, self._last = now != self._last, now
        return moved

    def wait(self, timeout: float) -> None:
        if self._bell is not None:
            self._bell.wait(timeout)
        else:
            time.sleep(max(0.0, timeout))

    def close(self) -> None:
        if self._bell is not None:
            self._bell.close()


class KmsgWake:
    """``/dev/kmsg``: the kernel wakes ``poll`` when a record is added. The watcher's own
    descriptor is only a doorbell (read and dropped); the reader reads from its cursor. Idle, the
    watcher sleeps in ``poll`` until a record or its next duty (``IDLE_S``), not every poll_s."""

    doorbell = True

    def __init__(self, path: str = "/dev/kmsg"):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            pass
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)
        self._rang = True               # look once at the start

    def _drain(self) -> None:
        for _ in range(4096):           # at most the ring buffer's records; the reader has them
            try:
                if not os.read(self.fd, 16384):
                    return
            except BrokenPipeError:
                continue                # records overwritten before we read them
            except OSError:
                return

    def changed(self) -> bool:
        if not self._rang and self.poller.poll(0):
            self._rang = True
        if self._rang:
            self._drain()
        rang, self._rang = self._rang, False
        return rang

    def wait(self, timeout: float) -> None:
        if self.poller.poll(max(0, int(timeout * 1000))):
            self._rang = True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class TimedWake:
    """journalctl: no doorbell worth its cost here; look every poll."""

    doorbell = False

    def changed(self) -> bool:
        return True

    def wait(self, timeout: float) -> None:
        time.sleep(max(0.0, timeout))

    def close(self) -> None:
        pass


def make_wake(kernel_log: str):
    from ..kernellog import readers

    source = readers.resolve(kernel_log)
    if source == "kmsg":
        try:
            return KmsgWake(readers.KMSG)
        except OSError:
            return TimedWake()
    if source == "journal":
        return TimedWake()
    return FileWake(source, open_doorbell(source))


# -- the watcher ------------------------------------------------------------------------------------
class Watcher:
    def __init__(self, config: Any, node: str, kernel_log: str, state_dir: str, program: Sequence[str],
                 child_env: Dict[str, str], settings: WatchSettings, boot_id_path: str = "/proc/sys/kernel/random/boot_id",
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.config, self.node, self.kernel_log, self.state_dir = config, node, kernel_log, state_dir
        self.program, self.child_env, self.settings = list(program), dict(child_env), settings
        self.boot_id_path = boot_id_path
        self.clock, self.wall = clock, wall
        self.trigger = Trigger(settings.min_interval_s)
        self.duty = DutyCycle(settings.max_cpu, settings.poll_s)
        self.seen = Seen(REPEAT_S)
        self.child: Optional[subprocess.Popen] = None
        self.child_started = 0.0
        self.stopping = False
        self.looks = 0
        self.errors = 0
        self._boot: Optional[str] = None
        self._last_error: Optional[str] = None
        self._more = True               # the last read stopped early, or none yet: read again
        self.after_boot = AfterBoot(settings.after_boot_s, after_boot_every(settings.min_interval_s))
        self._boot_looked = -BOOT_LOOK_S            # when the boot id was last read (monotonic)
        # Its own metrics (series.py): what it read and started, and when it last had the log in order.
        self.lines_read = 0
        self.looked_at: Optional[float] = None      # wall clock
        self.line_at: Optional[float] = None
        from ..actions.state import health_dir

        self.series = Series(node, *textfile_place(config, health_dir(state_dir)))

    # one look at the log ------------------------------------------------------------------
    def look(self) -> List[Any]:
        """Read what is new, judge it, commit; request a run for a new drain-asking finding.
        Returns the findings that asked for a run."""
        from ..kernellog.api import read_new_events
        from ..xid.event_findings import xid_findings
        from ..xid.xid_actions import action_rank, strongest

        self._check_boot()
        read = read_new_events(self.kernel_log, self.state_dir, f"{self.node}.{READER}", config=self.config)
        findings = [f for f in xid_findings(read.events, (), self.config) if wants_check([f])]
        now = self.clock()
        fresh = [f for f in findings
                 if self.seen.new((f.check, f.evidence.get("code"), f.evidence.get("pci")),
                                  action_rank(f.evidence.get("xid_action") or strongest()), now)]
        read.commit()
        self._more = read.capped is not None and read.stats.bytes_read > 0
        self.looks += 1
        self.looked_at = self.wall()
        self.lines_read += read.stats.lines_read
        if read.stats.lines_read:
            self.line_at = self.looked_at
        if fresh:
            self.trigger.request(now)
            say(f"{self.node}: {fresh[0].check}: {fresh[0].message}"
                + (f" (+{len(fresh) - 1} more)" if len(fresh) > 1 else "") + ": running the health check")
        return fresh

    def _check_boot(self) -> None:
        from ..actions.state import waits_for_a_reboot      # read only: the health check keeps it

        try:
            with open(self.boot_id_path, encoding="ascii", errors="replace") as handle:
                boot = handle.read(128).strip()
        except OSError:
            boot = ""
        self._boot_looked = self.clock()
        if boot == self._boot:
            return
        if self._boot is not None:
            self.seen.forget()
        self._boot = boot
        if boot and waits_for_a_reboot(self.state_dir, self.node, boot):
            self.after_boot.begin(self.clock(), time.time())
            say(f"{self.node}: a new boot, and a drain of ours waits for one: running the health check "
                "until it has judged the node as Slurm has it back")

    def follow_boot(self) -> None:
        """The boot id read every ``BOOT_LOOK_S`` (a new boot under a running watcher: the lab's
        RebootProgram; on a node the watcher starts with its boot); a run asked while a boot
        waits to be judged (``AfterBoot``)."""
        from ..actions.state import last_judgement

        now = self.clock()
        if now - self._boot_looked >= BOOT_LOOK_S:
            self._check_boot()
        if self.after_boot.active and self.child is None and not self.trigger.pending \
                and self.after_boot.wants_run(now, last_judgement(self.state_dir, self.node)):
            self.trigger.request(now)

    # the health check ---------------------------------------------------------------------
    def start_run(self) -> None:
        now = self.clock()
        try:
            self.child = subprocess.Popen(self.program, env=self.child_env, stdin=subprocess.DEVNULL,
                                          cwd="/", start_new_session=True, close_fds=True)
        except OSError as exc:
            say(f"{self.node}: cannot start the health check {self.program[0]}: {exc.strerror or exc}")
            self.child = None
            self.trigger.started(now)
            self.trigger.finished(now)
            return
        self.child_started = now
        self.trigger.started(now)

    def reap(self) -> None:
        if self.child is None:
            return
        code = self.child.poll()
        if code is None and self.clock() - self.child_started > RUN_TIMEOUT_S:
            say(f"{self.node}: the health check ran past {RUN_TIMEOUT_S:g} s; stopping it")
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except OSError:
                pass
            code = self.child.wait()
        if code is None:
            return
        if code != 0:
            say(f"{self.node}: the health check exited with status {code}")
        self.child = None
        self.trigger.finished(self.clock())

    # its metrics ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot(looked_at=self.looked_at, line_at=self.line_at, lines_read=self.lines_read,
                        triggers=self.trigger.runs, errors=self.errors)

    def publish(self) -> None:
        """The textfile, when due: a ``series.WRITE_EVERY_S`` since the last, or a run started since."""
        now = self.clock()
        if self.series.due(now, self.trigger.runs):
            self.series.write(now, self.snapshot())

    # the loop -------------------------------------------------------------------------------
    def run(self, wake: Any, once: bool = False) -> int:
        next_look = self.clock()
        backoff = 0.0
        while not self.stopping:
            now = self.clock()
            self.reap()
            self.follow_boot()
            if self.trigger.due(now):
                self.start_run()
            if now >= next_look and (self._more or wake.changed()):
                began = self.clock()
                try:
                    self.look()
                    backoff, self._last_error = 0.0, None
                    next_look = self.clock() + self.duty.pause_after(self.clock() - began)
                except Exception as exc:  # noqa: BLE001 - the watcher being broken is never the node being broken
                    self.errors += 1
                    text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                    if text != self._last_error:
                        say(f"{self.node}: cannot follow the kernel log ({text}); running nothing for it, "
                            "the periodic health check still runs")
                    self._last_error = text
                    backoff = min(ERROR_BACKOFF_MAX_S, max(1.0, backoff * 2))
                    self._more = False
                    next_look = self.clock() + backoff
            elif now >= next_look and self._last_error is None:
                # Asked the source (a stat, a poll) and nothing is new since a read that worked: the
                # log is in order as of now, which its metrics say (an idle node's last read may be
                # hours old). After a failed read, only a read that works says so again.
                self.looked_at = self.wall()
            if once:
                if self.trigger.due(self.clock()):
                    self.start_run()
                while self.child is not None:
                    time.sleep(0.05)
                    self.reap()
                self.publish()
                return 0
            # In this turn, which happens anyway: no wake-up of its own.
            self.publish()
            now = self.clock()
            timeout = IDLE_S if wake.doorbell else self.settings.poll_s
            due = self.trigger.wait_s(now)
            if due is not None:
                timeout = min(timeout, due)
            if self.child is not None:
                timeout = min(timeout, 0.1)
            if next_look > now:
                time.sleep(max(0.0, min(timeout, next_look - now)))
            elif not self._more:
                wake.wait(timeout)
        if self.child is not None:
            try:
                self.child.wait(RUN_TIMEOUT_S)      # a run in progress finishes: it may be mid-decision
            except subprocess.TimeoutExpired:
                os.killpg(self.child.pid, signal.SIGKILL)
        return 0


# -- the command ------------------------------------------------------------------------------------
def after_boot_note(settings: WatchSettings) -> Optional[str]:
    """The line said at start when ``[watch] min_interval_s`` is below the floor of the runs
    after a boot (``trigger.AFTER_BOOT_EVERY_MIN_S``): the key keeps its meaning for the runs an
    Xid starts, and the runs after a boot are clamped."""
    if settings.after_boot_s <= 0 or settings.min_interval_s >= AFTER_BOOT_EVERY_MIN_S:
        return None
    return (f"[watch] min_interval_s = {settings.min_interval_s:g} with after_boot_s = {settings.after_boot_s:g}: "
            f"the health checks after a boot run {AFTER_BOOT_EVERY_MIN_S:g} s apart (each asks slurmctld)")


def default_program() -> List[str]:
    """``slurm-gpu-healthcheck`` beside this command (or this Python), as slurm.conf names it."""
    for folder in (os.path.dirname(os.path.abspath(sys.argv[0])), os.path.dirname(os.path.abspath(sys.executable))):
        path = os.path.join(folder, "slurm-gpu-healthcheck")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return [path]
    return [sys.executable, "-I", "-c", "import sys; from healthcheck.healthcheck import main; sys.exit(main())"]


def child_environment(node: str, config_path: Optional[str], env: Dict[str, str]) -> Dict[str, str]:
    """What slurmd gives a HealthCheckProgram (``SLURMD_NODENAME`` only), plus the config this
    watcher uses and ``SLURM_CONF`` when the watcher was given them."""
    child = {"SLURMD_NODENAME": node}
    config = config_path or env.get("SLURM_GPU_HOOKS_CONFIG")
    if config:
        child["SLURM_GPU_HOOKS_CONFIG"] = os.path.abspath(config)
    if env.get("SLURM_CONF"):
        child["SLURM_CONF"] = env["SLURM_CONF"]
    return child


def parse(argv: Optional[Sequence[str]]):
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:          # one line, exit 2
            print(f"{PROG}: {message}", file=sys.stderr)
            sys.exit(2)

    parser = _Parser(prog=PROG, description="Run the health check as soon as the kernel log reports a GPU fault "
                     "(one per node, resident; the periodic health check does not depend on it).")
    parser.add_argument("--config", help="config file (default: $SLURM_GPU_HOOKS_CONFIG, else "
                        "/etc/slurm-gpu-hooks/config.toml)")
    parser.add_argument("--node", help="node name (default: $SLURMD_NODENAME, else the short hostname)")
    parser.add_argument("--program", help="the health check to run (default: [watch] program, else "
                        "slurm-gpu-healthcheck beside this command)")
    parser.add_argument("--pidfile", help="write this process's pid here (replaced atomically)")
    parser.add_argument("--once", action="store_true", help="look at the log once, run the health check if it "
                        "asks for one, wait for it, exit")
    return parser.parse_args(list(sys.argv[1:] if argv is None else argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    from ..config import node_name
    from ..hooklib.skeleton import config_or_exit

    config = config_or_exit(PROG, args.config, os.environ, cached=True)
    if isinstance(config, int):
        return config
    try:
        node = node_name(args.node, os.environ)
        from ..safeio.fsutil import path_component

        path_component(node)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    settings = config.typed(WatchSettings)
    program = [args.program] if args.program else [settings.program] if settings.program else default_program()
    try:
        from ..sources import node_sources

        sources = node_sources(config, node)
        wake = make_wake(sources.kernel_log)
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback; systemd restarts us
        print(f"{PROG}: {node}: cannot follow the kernel log: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    watcher = Watcher(config, node, sources.kernel_log, sources.state_dir, program,
                      child_environment(node, args.config, dict(os.environ)), settings,
                      boot_id_path=sources.boot_id_path)

    def stop(_signum, _frame) -> None:
        watcher.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.pidfile:
        from ..safeio.fsutil import atomic_write

        atomic_write(args.pidfile, f"{os.getpid()}\n", mode=0o644)
    say(f"{node}: following {sources.kernel_log}; the health check is {program[0]}")
    clamped = after_boot_note(settings)
    if clamped:
        say(f"{node}: {clamped}")
    try:
        return watcher.run(wake, once=args.once)
    finally:
        wake.close()
        if args.pidfile:
            try:
                with open(args.pidfile, encoding="ascii") as handle:
                    if handle.read().strip() == str(os.getpid()):
                        os.unlink(args.pidfile)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
