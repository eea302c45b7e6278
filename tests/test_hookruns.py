"""The hook-run journal: one line per run, per node, bounded by one rotation."""
from __future__ import annotations

import os
import subprocess
import sys

from healthcheck.hooklib import runlog as H

from .conftest import ROOT


def test_runs_read_back_per_node_in_order(tmp_path):
    state = str(tmp_path)
    H.record_run(state, "prolog", "gpu1", "7", verdict="ok")
    H.record_run(state, "epilog", "gpu1", "7")
    H.record_run(state, "prolog", "gpu2", "8")
    runs = list(H.read_runs(state))
    assert [(r["hook"], r["node"], r["job_id"]) for r in runs] == [
        ("prolog", "gpu1", "7"), ("epilog", "gpu1", "7"), ("prolog", "gpu2", "8")]
    assert runs[0]["verdict"] == "ok"
    with open(H.journal_path(state, "gpu1"), "a", encoding="utf-8") as handle:
        handle.write('{"hook": "prolog", "torn\n')
    assert len(list(H.read_runs(state))) == 3


def test_each_run_names_the_release_that_ran_it_as_the_package_says(tmp_path):
    """During a rolling upgrade each node runs its own release: the journal says which."""
    import re

    import healthcheck
    import slurm_hooks

    with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as handle:
        packaged = re.search(r"^version = (\S+)$", handle.read(), re.MULTILINE).group(1)
    assert healthcheck.__version__ == slurm_hooks.__version__ == packaged
    H.record_run(str(tmp_path), "prolog", "gpu1", "7")
    assert [run["version"] for run in H.read_runs(str(tmp_path))] == [packaged]


def test_journal_is_bounded_and_keeps_the_newest_runs(tmp_path):
    state, cap = str(tmp_path), 4096
    for n in range(500):
        H.record_run(state, "healthcheck", "gpu1", None, max_bytes=cap, n=n)
    path = H.journal_path(state, "gpu1")
    files = sorted(os.listdir(os.path.dirname(path)))
    assert [f for f in files if not f.startswith(".")] == ["gpu1.jsonl", "gpu1.jsonl.1"]
    line = max(len(text) for text in open(path, encoding="utf-8").read().splitlines()) + 1
    assert os.path.getsize(path) < cap + line
    assert os.path.getsize(path + ".1") < cap + line
    kept = [r["n"] for r in H.read_runs(state)]
    assert kept == list(range(kept[0], 500))               # newest, contiguous, oldest first
    assert cap // line <= len(kept) < 500                  # at least the full rotated file


def test_rotation_under_concurrent_writers_loses_nothing_it_keeps(tmp_path):
    """Four processes append 300 entries each; the journal rotates once on the way: every
    entry is still in one of the two files, exactly once."""
    state = str(tmp_path)
    writer = ("import sys\nfrom healthcheck.hooklib.runlog import record_run\n"
              "for n in range(300):\n"
              "    record_run(sys.argv[1], 'prolog', 'gpu1', sys.argv[2], max_bytes=int(sys.argv[3]), n=n)\n")
    sample = H.record_run(str(tmp_path / "probe"), "prolog", "gpu1", "w0", n=299)
    size = len(__import__("json").dumps(sample, sort_keys=True)) + 1
    cap = size * 1200 * 2 // 3                              # rotates once, not twice
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", writer, state, f"w{i}", str(cap)], env=env)
             for i in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert os.path.exists(H.journal_path(state, "gpu1") + ".1")
    seen = sorted((r["job_id"], r["n"]) for r in H.read_runs(state))
    assert seen == sorted((f"w{i}", n) for i in range(4) for n in range(300))


def test_rotate_if_full_leaves_small_journals_alone(tmp_path):
    path = str(tmp_path / "gpu1.jsonl")
    assert not H.rotate_if_full(path, 10)                   # absent
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("{}\n")
    assert not H.rotate_if_full(path, 10)
    assert H.rotate_if_full(path, 3) and not os.path.exists(path) and os.path.exists(path + ".1")
