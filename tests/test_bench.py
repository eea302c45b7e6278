"""``bench/run`` (a contract: called from outside the project) writes every key of issue 13's
table. Only its tiny mode runs here, and no figure is judged: a test never asserts a timing."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from .conftest import ROOT

KEYS = ("floor_ms", "prolog_vs_floor", "epilog_vs_floor", "healthcheck_vs_floor", "healthcheck_log_growth",
        "xid_scan_vs_grep", "xid_scan_peak_mb", "summary_1m_vs_floor", "summary_1m_peak_mb", "healthcheck_peak_mb",
        "xid_to_drain_s", "prolog_standalone_vs_floor", "epilog_standalone_vs_floor", "healthcheck_standalone_vs_floor")


def test_bench_run_tiny_writes_every_key(tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, SLURM_GPU_BENCH_NO_REEXEC="1")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run"), "--tiny", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    assert set(KEYS) <= set(results)
    for key in KEYS:
        # A figure is a number, or null with the reason said (the summary, before it lands).
        assert isinstance(results[key], (int, float)) or key in results["null_reasons"], key
    assert results["mode"] == "tiny" and results["interpreter"] == sys.executable
    assert "hook_failures" not in results, results.get("hook_failures")
    assert "xid_to_drain_failures" not in results, results.get("xid_to_drain_failures")
    # The hooks as deployed: served by slurm-gpu-watch's hook server, none of them run in process.
    assert results["hooks_served"] is True
    assert set(results["hooks_served_fell_back"].values()) == {0}, results["hooks_served_fell_back"]
    for key in KEYS:
        assert key in done.stdout                              # the printed table names every key
    # The spread: each paired figure is the median of its rounds, which are written too.
    paired = [key for key in KEYS if key.endswith(("_vs_floor", "_vs_grep"))]
    assert set(results["rounds"]) == set(paired)
    for key in paired:
        each = results["rounds"][key]
        assert each and abs(statistics.median(each) - results[key]) <= 0.001, (key, each)
        assert f"{min(each):g}-{max(each):g}" in done.stdout
