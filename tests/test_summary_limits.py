"""slurm-gpu summary against inputs that would cost it its memory (issue 34, findings 7, 8 and 10):
endless or huge saved documents, job names that grow when escaped, and sacct values no job can
have. Each runs the command as a site would; the endless ones in a child process under a memory
limit (RLIMIT_AS), where a traceback, not just a wrong answer, is what used to come out."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from tests.conftest import run_cli

DATA = os.path.join(os.path.dirname(__file__), "data", "summary")
LAB_SACCT = os.path.join(DATA, "sacct-lab-scenarios.txt")
LAB_SINFO = os.path.join(DATA, "sinfo-lab.json")
LAB_EVENTS = os.path.join(DATA, "sacctmgr-events-lab.txt")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_LIMIT = 1 << 30              # the child's address space: the CLI needs about a quarter of it


def run(*args):
    return run_cli(["summary", *args])


def _limit(limit):
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limited


def run_limited(*args, timeout=120, limit=MEMORY_LIMIT):
    """``slurm-gpu summary ARGS`` in a child whose address space is capped at ``limit``."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("SLURM_GPU_HOOKS_CONFIG", None)
    return subprocess.run([sys.executable, "-c", "from slurm_hooks.cli import main; main()", "summary", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                          preexec_fn=_limit(limit), cwd=ROOT)


def _one_line_refusal(result, option):
    lines = result.stderr.splitlines()
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"slurm-gpu: summary: {option} "), lines


# -- finding 7: saved documents are read with a cap --------------------------------------------------
@pytest.mark.parametrize("option", ["--sinfo-json", "--events"])
def test_an_endless_device_is_one_line_and_exit_1_under_a_memory_limit(option):
    result = run_limited("--input", LAB_SACCT, option, "/dev/zero", "--json")
    _one_line_refusal(result, option)
    assert "not a regular file" in result.stderr


@pytest.mark.parametrize("option", ["--sinfo-json", "--events"])
def test_an_endless_fifo_is_one_line_and_exit_1_under_a_memory_limit(tmp_path, option):
    fifo = str(tmp_path / "endless")
    os.mkfifo(fifo)
    # A writer that never stops (no newline either): what `--events <(yes x | tr -d '\n')` would be.
    writer = subprocess.Popen([sys.executable, "-c",
                               "import sys\nwith open(sys.argv[1], 'wb') as f:\n"
                               "    while True: f.write(b'x' * 65536)\n", fifo],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = run_limited("--input", LAB_SACCT, option, fifo, "--json")
    finally:
        writer.kill()
        writer.wait()
    _one_line_refusal(result, option)


@pytest.mark.parametrize("option", ["--sinfo-json", "--events"])
def test_a_file_over_the_cap_is_refused_without_being_read(tmp_path, option):
    from slurm_hooks.summary.drains import MAX_DOCUMENT_BYTES

    big = tmp_path / "big"
    with open(big, "wb") as handle:
        handle.truncate(MAX_DOCUMENT_BYTES + 1)             # sparse: costs no disk
    result = run("--input", LAB_SACCT, option, str(big), "--json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"slurm-gpu: summary: {option} {big}: larger than {MAX_DOCUMENT_BYTES} bytes "
        f"(a saved file of at most {MAX_DOCUMENT_BYTES} bytes is read)"]
    assert result.stdout == ""


def test_saved_documents_under_the_cap_still_count():
    result = run("--input", LAB_SACCT, "--sinfo-json", LAB_SINFO, "--events", LAB_EVENTS, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [d["node"] for d in report["drained"]] == ["gpu2"]
    assert {n["node"]: n["drains"] for n in report["by_node"] if n["drains"]} == {"gpu1": 1, "gpu2": 2, "gpu3": 2}


def test_a_missing_document_is_still_a_note():
    result = run("--input", LAB_SACCT, "--events", "/nonexistent/events.txt", "--json")
    assert result.exit_code == 0
    assert "drains per node: not counted (/nonexistent/events.txt: No such file or directory)" in \
        json.loads(result.stdout)["notes"]


def test_an_empty_exception_message_is_still_one_line():
    """The error path that used to raise IndexError on ``MemoryError()`` (no message)."""
    from slurm_hooks.cli.summary_cmd import _first_line

    assert _first_line(MemoryError()) == "MemoryError"
    assert _first_line(ValueError("a\nb")) == "a"


def test_the_docs_state_the_document_cap():
    from slurm_hooks.summary.drains import MAX_DOCUMENT_BYTES

    with open(os.path.join(ROOT, "docs", "summary.md"), encoding="utf-8") as handle:
        text = " ".join(handle.read().split())
    assert MAX_DOCUMENT_BYTES == 64 * 1024 * 1024
    assert "(`MAX_DOCUMENT_BYTES` in `slurm_hooks/summary/drains.py`, 64 MiB," in text


# -- finding 10: sacct values no job can have are set aside, per reason, and said ---------------------
IMPOSSIBLE = os.path.join(DATA, "sacct-impossible-values.txt")
EXPECTED_ASIDE = {"elapsed_not_a_number": 2, "end_not_a_time": 3, "gpus_not_a_count": 2}


def _lab_with_impossible(tmp_path):
    """The lab's capture with the impossible rows (real sacct -P lines, header and all) after it:
    two sacct runs' files put together, as a site does."""
    path = tmp_path / "sacct.txt"
    with open(LAB_SACCT, encoding="utf-8") as lab, open(IMPOSSIBLE, encoding="utf-8") as bad:
        path.write_text(lab.read() + bad.read())
    return path


def test_impossible_rows_are_set_aside_with_their_reason(tmp_path):
    path = _lab_with_impossible(tmp_path)
    result = run("--input", str(path), "--json")
    clean = json.loads(run("--input", LAB_SACCT, "--json").stdout)
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    # Nothing of them counted: not as jobs, GPU-hours or causes, and not as the report's window.
    for key in ("jobs", "gpu_hours", "by_cause", "window", "by_node"):
        assert report[key] == clean[key], key
    assert report["window"]["first_end"] == "2026-11-30T14:38:11"
    assert report["window"]["last_end"] == "2026-11-30T14:39:38"
    assert report["set_aside"] == EXPECTED_ASIDE and clean["set_aside"] == {}
    said = [line for line in result.stderr.splitlines() if "impossible values" in line]
    assert len(said) == 1 and said[0].startswith("slurm-gpu: summary: 7 row(s) with impossible values were not counted")
    assert "3: End is not a time a job ended" in said[0] and "2: ElapsedRaw is not a whole number" in said[0]
    assert "2: AllocTRES gres/gpu is not a whole count" in said[0]
    assert any(note.startswith("7 row(s) with impossible values") for note in report["notes"])


def test_impossible_rows_are_set_aside_by_the_parallel_reader_and_under_filters(tmp_path):
    from slurm_hooks.summary.accounting import LineCap
    from slurm_hooks.summary.parallel import tally_file
    from slurm_hooks.summary.tally import Filters

    path = _lab_with_impossible(tmp_path)
    tally = tally_file(str(path), Filters(), 2, [], LineCap(4096))
    assert (tally.jobs, tally.rejected, tally.set_aside) == (16, 7, EXPECTED_ASIDE)
    # With a window (what a live sacct run always has), an End of Unknown is still no ending.
    result = run("--input", str(path), "--json", "--since", "2026-11-30T00:00:00", "--until", "2026-12-01T00:00:00")
    assert json.loads(result.stdout)["set_aside"] == EXPECTED_ASIDE


def test_gpu_counts_that_are_no_count():
    from slurm_hooks.summary.accounting import NOT_A_COUNT
    from slurm_hooks.summary.rows import gpus_of

    assert gpus_of("billing=8,cpu=8,gres/gpu=-8,node=1") == NOT_A_COUNT
    assert gpus_of("billing=8,gres/gpu:h100=4,gres/gpu:a100=-2,node=1") == NOT_A_COUNT
    assert gpus_of("billing=8,gres/gpu=2.5") == NOT_A_COUNT
    assert gpus_of("billing=8,gres/gpu:h100=4,gres/gpu:a100=2,node=1") == 6


@pytest.mark.parametrize("end, ok", [
    ("2026-11-30T14:38:14", True), ("Unknown", False), ("None", False), ("0000-00-00T00:00:00", False),
    ("9999-12-31T23:59:59", False), ("2026-13-01T00:00:00", False), ("2026-11-30T14:38", False),
    ("2026-11-30T24:00:00", False), ("1999-12-31T23:59:59", False),
])
def test_an_end_is_a_time_a_job_ended(end, ok):
    from slurm_hooks.summary.accounting import end_is_time

    assert end_is_time(end) is ok


def test_the_docs_name_every_reason_a_row_is_set_aside():
    from slurm_hooks.summary.accounting import SET_ASIDE

    with open(os.path.join(ROOT, "docs", "summary.md"), encoding="utf-8") as handle:
        text = " ".join(handle.read().split())
    assert "`set_aside` (rows not counted, per reason; `{}` when none)" in text
    for reason in SET_ASIDE:
        assert f"`{reason}`" in text, reason


# -- finding 8: a job name is cut to the line cap before it is escaped --------------------------------
def _row_with_name(name):
    with open(LAB_SACCT, encoding="utf-8") as handle:
        parts = handle.read().splitlines()[2].split("|")
    parts[-1] = name
    return "|".join(parts) + "\n"


@pytest.mark.parametrize("mode", [[], ["--json"], ["--csv"]])
def test_an_escaped_job_name_is_cut_to_the_line_cap(tmp_path, mode):
    cap = 65536
    config = tmp_path / "c.toml"
    config.write_text(f"[summary]\nmax_line_bytes = {cap}\n")
    path = tmp_path / "s.txt"
    path.write_text(_row_with_name("\x1b" * (cap - 400)))      # a line within the cap, 4-6x past it escaped
    result = run("--config", str(config), "--input", str(path), "--jobs", *mode)
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout
    longest = max(result.stdout.splitlines(), key=len)
    assert cap // 2 < len(longest.encode()) <= cap
    escaped = "\\u001b" if mode == ["--json"] else "\\x1b"
    assert escaped * 100 + "[cut]" in longest
    if mode == ["--json"]:
        rows = json.loads(result.stdout)["job_rows"]
        assert rows[0]["name"].endswith("[cut]") and set(rows[0]["name"][:-5]) == {"\x1b"}


def test_an_ordinary_name_is_left_whole(tmp_path):
    path = tmp_path / "s.txt"
    name = "train \u202e\x07 " + "é" * 1000
    path.write_text(_row_with_name(name))
    row = json.loads(run("--input", str(path), "--jobs", "--json").stdout)["job_rows"][0]
    assert row["name"] == name


def test_fitting_keeps_the_longest_head_that_fits():
    from slurm_hooks.summary.text import SIZES, fitting

    value = ("a\x1b\u202e\U0001F600\"" * 5000)
    for mode, measure in SIZES.items():
        for budget in (0, 1, 5, 4097, 30000):
            head, cut = fitting(value, budget, measure)
            assert cut and value.startswith(head)
            assert measure(head) <= budget < measure(value[:len(head) + 1]), (mode, budget)


def test_a_name_of_escape_bytes_stays_within_a_memory_limit(tmp_path):
    """Issue 34: 60 MB of ESC took 4.8 GB in --jobs output (a MemoryError traceback under 1.5 GB);
    here 12 MB under a 600 MiB address space (the name read and decoded takes about 100 MB)."""
    config = tmp_path / "c.toml"
    config.write_text("[summary]\nmax_line_bytes = 16000000\n")
    path = tmp_path / "s.txt"
    path.write_text(_row_with_name("\x1b" * 12_000_000))
    result = run_limited("--config", str(config), "--input", str(path), "--jobs", timeout=300,
                         limit=600 << 20)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(max(result.stdout.splitlines(), key=len)) <= 16_000_000


def test_the_largest_losses_keep_a_long_name_cut(tmp_path):
    """The 25 largest hardware losses are held to the end (and escaped in JSON and HTML): each
    name at most LOSS_NAME_CHARS, not a line's length."""
    from healthcheck.records import admin_comment
    from slurm_hooks.summary.tally import LOSS_NAME_CHARS

    line = _row_with_name("\x1b" * 200_000).split("|")
    line[15] = admin_comment.encode({"node": "gpu1", "class": "GPU_LOST", "gpu": 3, "xid": 79})
    path = tmp_path / "s.txt"
    path.write_text("|".join(line))
    report = json.loads(run("--input", str(path), "--json").stdout)
    (loss,) = report["largest_hardware_losses"]
    assert loss["name"] == "\x1b" * LOSS_NAME_CHARS + "[cut]" and loss["cause"] == "GPU_LOST"


def test_the_docs_state_the_row_cap():
    from slurm_hooks.summary.tally import LOSS_NAME_CHARS
    from slurm_hooks.summary.text import CUT_MARK

    with open(os.path.join(ROOT, "docs", "summary.md"), encoding="utf-8") as handle:
        text = " ".join(handle.read().split())
    assert f"A row's line is at most `[summary] max_line_bytes`, escaped" in text
    assert f"ends in `{CUT_MARK}`" in text and f"keep at most {LOSS_NAME_CHARS} characters of a name" in text


# -- a line many blocks long is joined once, not copied per block: the readers still agree ---------------
def _random_text(rng, cap):
    parts = [b"x" * rng.choice([0, 1, 3, cap - 1, cap, cap + 1, cap + 2, 3 * cap]) + b"\n"
             for _ in range(rng.randint(0, 12))]
    if rng.random() < 0.5:
        parts.append(b"y" * rng.randint(0, 2 * cap))        # a last line without its end
    return b"".join(parts)


def test_the_block_reader_and_the_live_feed_give_the_line_readers_lines(monkeypatch):
    import io
    import random

    from slurm_hooks.summary import accounting
    from slurm_hooks.summary.accounting import LineCap, LineFeed

    rng = random.Random(34)
    for _ in range(2000):
        cap = rng.choice([4, 8, 16, 64])
        monkeypatch.setattr(accounting, "BLOCK_BYTES", rng.choice([1, 2, 3, 7, 16, 50]))
        text = _random_text(rng, cap)
        end = rng.choice([None, rng.randint(0, len(text) + 1)])
        one = LineCap(cap)
        expected = list(one.lines(io.BytesIO(text), end, 0))
        other = LineCap(cap)
        assert [line for block in other.blocks(io.BytesIO(text), end, 0) for line in block] == expected
        assert other.skipped == one.skipped
        if end is None:                                      # sacct's output, in chunks of any size
            live, got = LineCap(cap), []
            feed = LineFeed(got.extend, live)
            position = 0
            while position < len(text):
                step = rng.randint(1, 2 * cap + 3)
                feed.feed(text[position:position + step])
                position += step
            feed.close()
            assert [line.rstrip("\n") for line in got] == [line.rstrip("\n") for line in expected]
            assert live.skipped == one.skipped
