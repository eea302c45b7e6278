"""The lab's end-to-end tests: they bring the real cluster up with ``slurm-gpu lab up`` and
FAIL (never skip) when it cannot start. The scenarios run once per session and every test
reads their results. ``test_lab_down.py`` runs last and leaves the lab down."""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Dict, List

import pytest

from slurm_hooks.lab.paths import NODES, TESTS_LOCK, LabPaths, lab_dir
from slurm_hooks.lab.commands import slurm_gpu_argv
from slurm_hooks.lab import LabError, releases
from slurm_hooks.lab.releases import RELEASE_ENV, default_version

UP_TIMEOUT = 900        # includes apt-get install on a fresh machine
LOCK_WAIT = 1200        # another test session may hold the lab this long
SCENARIOS_TIMEOUT = 600


def slurm_gpu(*args: str, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*slurm_gpu_argv(), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)


def lab_up_clean(*extra: str) -> None:
    """`slurm-gpu lab up --clean EXTRA...`: a test that reshapes the lab (GB200 trays, a MIG
    node) and puts the three H100 nodes back with no arguments."""
    done = slurm_gpu("lab", "up", "--clean", *extra, timeout=UP_TIMEOUT)
    if done.returncode != 0:
        pytest.fail(f"`slurm-gpu lab up --clean {' '.join(extra)}` failed:\n{tail(done.stdout)}\n{tail(done.stderr)}",
                    pytrace=False)


def wait_for(what: str, probe, timeout: float = 60, every: float = 0.5):
    """Poll ``probe`` until it returns something true (returned) or fail the test after ``timeout``
    seconds. For polling only: no test asserts how long anything took."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}", pytrace=False)
        time.sleep(every)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Lab:
    paths: LabPaths
    env: Dict[str, str]          # os.environ + what `slurm-gpu lab env` exports
    started_at: float

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env,
                              stdin=subprocess.DEVNULL)


# Set (to anything) to run every lab test on a release other than the default.
ALL_TESTS_ENV = "SLURM_GPU_LAB_ALL_TESTS"


def lab_release() -> str:
    """The Slurm release this session's lab runs: $SLURM_GPU_LAB_RELEASE, else the default
    (``slurm-gpu lab up`` reads the same variable)."""
    return os.environ.get(RELEASE_ENV) or default_version()


def pytest_report_header(config):
    return f"slurm lab release: {lab_release()} (set {RELEASE_ENV} to choose)"


def pytest_collection_modifyitems(session, config, items):
    """`lab down` must be the last lab test (it stops what the others use)."""
    # On a release other than the default, the lab tests marked `every_release` run (the
    # scenario table, the records round trip, a health-check drain and resume, the prolog
    # refusing a bad GPU, the drain gate's acceptance, the MIG node, lab down); the default release runs them
    # all, and so does any release with $SLURM_GPU_LAB_ALL_TESTS set.
    # A test marked `rootfs_release` installs into the release's Debian root filesystem: a release
    # run from the host's own packages (22.05) has none, and the test is not collected there.
    try:
        host_packages = not releases.get(lab_release()).rootfs
    except LabError:        # an unknown release: `lab up` says so, in the lab fixture
        host_packages = False
    if host_packages:
        kept = [item for item in items if item.get_closest_marker("rootfs_release") is None]
        if len(kept) != len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
    if lab_release() != default_version() and not os.environ.get(ALL_TESTS_ENV):
        kept, dropped = [], []
        for item in items:
            in_lab = "tests/lab/" in item.nodeid.replace("\\", "/")
            (dropped if in_lab and item.get_closest_marker("every_release") is None else kept).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    # The health-check tests inject faults, reboot simulated nodes and leave Xid history in the
    # lab's state: they run after the scenario and job-class tests, whose classes such leftovers
    # would change (a GPU still lost made node-fail and nvlink-down jobs GPU_LOST), then `lab down`.
    # The job-class, Actions and storm tests inject faults too, and a fault found within
    # `late_evidence_window_s` of a job's end may amend that job's class: they run after the
    # tests that read the scenario jobs' classes. So does the TaskProlog test (an IB port down).
    # The soak (faults, reboots, daemon restarts, all of it at once), the GB200 trays, the MIG
    # node and the 32-node test (each restarts the lab twice: reshaped, then the three H100
    # nodes) run last before `lab down`.
    def group(item) -> int:
        for rank, module in enumerate(("test_lab_job_classes", "test_lab_actions", "test_lab_gate", "test_lab_served_hooks", "test_lab_taskprolog",
                                       "test_lab_storm", "test_lab_monitoring", "test_lab_healthcheck", "test_lab_remediate",
                                       "test_lab_boot_check",
                                       "test_lab_watch",
                                       "test_lab_soak",
                                       "test_lab_gb200",
                                       "test_lab_mig",
                                       "test_lab_scale",
                                       "test_lab_down"), start=1):
            if module in item.nodeid:
                return rank
        return 0
    items.sort(key=group)       # stable: each group keeps its order
    # The lab is a real cluster on a shared 2-core machine, with slurmd's own health checks acting
    # on their interval beside each test: a test that loses such a race once runs again (twice at
    # most). A lab that cannot start still fails every time, and so does anything deterministic.
    # The long ones (the soak, the 32-node test: 5-10 minutes a run) run again once at most.
    # $SLURM_GPU_LAB_RERUNS (a number) sets the reruns instead: 0 shows each failure (debugging).
    chosen = os.environ.get("SLURM_GPU_LAB_RERUNS", "")
    for item in items:
        if "tests/lab/" in item.nodeid.replace("\\", "/") and "test_lab_down" not in item.nodeid:
            long_one = any(name in item.nodeid for name in ("test_lab_soak", "test_lab_scale"))
            reruns = int(chosen) if chosen.isdigit() else 1 if long_one else 2
            item.add_marker(pytest.mark.flaky(reruns=reruns, reruns_delay=5))


@pytest.fixture(scope="session")
def cli():
    """Run ``slurm-gpu ARGS...``: cli("lab", "status") -> CompletedProcess."""
    return slurm_gpu


@pytest.fixture(scope="session")
def lab_session_lock():
    """One test session at a time uses the lab: a second one (another checkout, another
    terminal) waits here instead of cancelling the first one's jobs or taking it down."""
    path = TESTS_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    # A blocking flock (in a thread, to bound the wait) queues behind the sessions already
    # waiting, as `flock(1)` does; polling with LOCK_NB lost every hand-over to them.
    taken = threading.Event()

    def take() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken.set()
    threading.Thread(target=take, name="lab-session-lock", daemon=True).start()
    if not taken.wait(LOCK_WAIT):
        pytest.fail(f"another test session held the lab ({path}) for {LOCK_WAIT} s", pytrace=False)
    yield path
    os.close(fd)


@pytest.fixture(scope="session")
def lab(lab_session_lock) -> Lab:
    started_at = time.time()
    paths = LabPaths(lab_dir())
    try:
        # --clean: a test session never inherits what an earlier one (or earlier lab use) left:
        # undeliverable or malformed outbox entries, drained nodes, job ids, accounting rows.
        result = slurm_gpu("lab", "up", "--clean", timeout=UP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`slurm-gpu lab up` did not finish within {UP_TIMEOUT} s", pytrace=False)
    if result.returncode != 0:
        log = ""
        if os.path.isfile(paths.lab_log):
            with open(paths.lab_log, encoding="utf-8", errors="replace") as handle:
                log = tail(handle.read(), 20)
        pytest.fail(f"the lab cannot start (`slurm-gpu lab up` rc {result.returncode}):\n"
                    f"{tail(result.stdout)}\n{tail(result.stderr)}\n--- {paths.lab_log}:\n{log}", pytrace=False)
    exported = slurm_gpu("lab", "env")
    env = dict(os.environ)
    for line in exported.stdout.splitlines():
        assert line.startswith("export "), line
        key, _, value = line[len("export "):].partition("=")
        words = shlex.split(value.replace('"$PATH"', shlex.quote(os.environ.get("PATH", ""))))
        assert len(words) == 1, line
        env[key] = words[0]
    lab = Lab(paths, env, started_at)
    _back_in_service(lab)
    return lab


def _back_in_service(lab: Lab) -> None:
    """Every session starts from healthy simulated nodes, all in service. slurmctld keeps node
    states across restarts (StateSaveLocation), and the lab's health check drains for real, so a
    session that was killed (or another checkout's) can leave a node drained or a fault injected."""
    for node in NODES:
        result = slurm_gpu("sim", "reset", node, env=lab.env)
        if result.returncode != 0:
            pytest.fail(f"`slurm-gpu sim reset {node}` failed: {tail(result.stderr)}", pytrace=False)
    deadline = time.monotonic() + 60
    while True:
        states = {}
        for node in NODES:
            shown = lab.run("sinfo", "-h", "-n", node, "-o", "%T")
            states[node] = shown.stdout.strip()
            if any(word in states[node] for word in ("drain", "down", "fail")):
                lab.run("scontrol", "update", f"nodename={node}", "state=resume")
        if all(state in ("idle", "mixed", "allocated") for state in states.values()):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"lab nodes not back in service: {states}", pytrace=False)
        time.sleep(1)


@pytest.fixture(scope="session")
def scenario_run(lab: Lab) -> Dict[str, object]:
    """`slurm-gpu lab scenarios --json`, once: {"results": [...], "by_name": {...}, "seconds": s}."""
    began = time.monotonic()
    try:
        result = slurm_gpu("lab", "scenarios", "--json", timeout=SCENARIOS_TIMEOUT + 60)
    except subprocess.TimeoutExpired:
        pytest.fail("`slurm-gpu lab scenarios` did not finish", pytrace=False)
    seconds = time.monotonic() - began
    try:
        results = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"`slurm-gpu lab scenarios --json` rc {result.returncode} printed no JSON:\n"
                    f"{tail(result.stdout)}\n{tail(result.stderr)}", pytrace=False)
    by_name: Dict[str, List[dict]] = {}
    for row in results:
        by_name.setdefault(row["scenario"], []).append(row)
    return {"results": results, "by_name": by_name, "seconds": seconds, "rc": result.returncode}
