"""The one bounded subprocess runner: argument lists, stdin from /dev/null, a deadline that kills
the whole process group (grandchildren too), one-line errors."""
from __future__ import annotations

import os
import sys
import time

import pytest

from healthcheck.safeio import programs

# A child that starts a grandchild (in its process group), writes the grandchild's pid, and waits.
FAMILY = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(sys.argv[1], "w") as handle:
    handle.write(str(grandchild.pid))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_output_and_exit_status_come_back():
    done = programs.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], 30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert done.last_line() == "err"


def test_stdin_is_devnull_unless_input_is_given():
    reads = [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"]
    assert programs.run(reads, 30).stdout.strip() == "''"
    assert programs.run(reads, 30, input="abc").stdout.strip() == "'abc'"


def test_arguments_are_never_a_shell_line(tmp_path):
    marker = tmp_path / "pwned"
    done = programs.run([sys.executable, "-c", "import sys; print(sys.argv[1])", f"x; touch {marker}"], 30)
    assert done.stdout.strip() == f"x; touch {marker}"
    assert not marker.exists()


def test_deadline_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    with pytest.raises(programs.CommandError) as caught:
        programs.run([sys.executable, "-c", FAMILY, str(pidfile)], 3)
    assert caught.value.timed_out
    assert "no answer within 3 s" in str(caught.value) and "\n" not in str(caught.value)
    grandchild = int(pidfile.read_text())
    for _ in range(50):                # SIGKILL is delivered at once; reaping by init may lag
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_a_missing_program_is_one_line():
    with pytest.raises(programs.CommandError) as caught:
        programs.run(["/nonexistent/scontrol", "ping"], 5)
    assert not caught.value.timed_out
    assert str(caught.value) == "cannot run /nonexistent/scontrol: No such file or directory"


def test_stream_hands_over_stdout_in_chunks_and_keeps_stderr_short():
    chunks = []
    code, errors = programs.stream([sys.executable, "-c",
                                   "import sys; sys.stdout.write('x' * 200000); sys.stderr.write('e' * 20000)"],
                                  30, chunks.append)
    assert code == 0
    assert sum(len(chunk) for chunk in chunks) == 200000
    assert errors == b"e" * programs.STDERR_KEEP


def test_stream_deadline_kills_the_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    with pytest.raises(programs.CommandError) as caught:
        programs.stream([sys.executable, "-c", FAMILY, str(pidfile)], 3, lambda chunk: None)
    assert caught.value.timed_out
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_describe_names_the_program_not_its_directory():
    assert programs.describe(["/usr/bin/scontrol", "update", "nodename=gpu1", "state=drain", "reason=x"]) == \
        "scontrol update nodename=gpu1 state=drain"


def test_describe_keeps_an_error_on_one_short_line():
    text = programs.describe(["python", "-c", "import os\n" + "x = 1\n" * 50])
    assert "\n" not in text and len(text) < 100


def test_inside_a_runs_watchdog_no_command_outlasts_the_time_the_run_has_left():
    """Issue 34, 3: a command's own timeout (a GPU reset's 20 s, scontrol's) is cut to what the
    whole run has left, less its reserve, so the command fails as its own one-line error and the
    watchdog does not strike in it; outside a run nothing is cut."""
    from healthcheck.hooklib.watchdog import Watchdog, whole_run
    from healthcheck.safeio import run_deadline

    try:
        with whole_run(3.0):
            assert run_deadline.within(20.0) <= 3.0 - 3.0 / 5
            with pytest.raises(programs.CommandError) as cut:
                programs.run(["sleep", "30"], 20.0)
            with pytest.raises(programs.CommandError) as streamed:
                programs.stream(["sleep", "30"], 20.0, lambda chunk: None)
    except Watchdog as fired:                                   # pragma: no cover - the failure
        pytest.fail(f"the watchdog struck in the command: {fired.where}")
    assert cut.value.timed_out and "(the time left in the run)" in str(cut.value)
    assert streamed.value.timed_out and "(the time left in the run)" in str(streamed.value)
    assert run_deadline.within(20.0) == 20.0                    # the run is over: nothing cut
    assert programs.run(["true"], 5).returncode == 0
