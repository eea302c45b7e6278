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
    # The hooks as Slurm runs them (fork-exec): the older *_standalone_* names say the same figures.
    for hook in ("prolog", "epilog", "healthcheck"):
        assert results[f"{hook}_standalone_vs_floor"] == results[f"{hook}_vs_floor"], hook
        assert results["rounds"][f"{hook}_standalone_vs_floor"] == results["rounds"][f"{hook}_vs_floor"], hook
        assert results[f"{hook}_standalone_ms"] == results[f"{hook}_ms"], hook
    assert not any("served" in key or "hook_server" in key for key in results), sorted(results)
    for key in KEYS:
        assert key in done.stdout                              # the printed table names every key
    # The spread: each paired figure is the median of its rounds, which are written too.
    paired = [key for key in KEYS if key.endswith(("_vs_floor", "_vs_grep"))]
    assert set(results["rounds"]) == set(paired)
    for key in paired:
        each = results["rounds"][key]
        assert each and abs(statistics.median(each) - results[key]) <= 0.001, (key, each)
        assert f"{min(each):g}-{max(each):g}" in done.stdout


def _bench_module():
    """bench/run as a module (not run): its table of keys and targets."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("bench_run", os.path.join(ROOT, "bench", "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    module = importlib.util.module_from_spec(spec)
    old = os.environ.get("SLURM_GPU_BENCH_NO_REEXEC")
    os.environ["SLURM_GPU_BENCH_NO_REEXEC"] = "1"
    try:
        loader.exec_module(module)
    finally:
        if old is None:
            del os.environ["SLURM_GPU_BENCH_NO_REEXEC"]
        else:
            os.environ["SLURM_GPU_BENCH_NO_REEXEC"] = old
    return module


def test_the_standalone_keys_are_aliases_of_the_hooks_keys_with_the_same_targets():
    """The hooks run one way (as Slurm fork-execs them): ``prolog_vs_floor`` and the older
    ``prolog_standalone_vs_floor`` name one figure, judged against one target."""
    bench = _bench_module()
    assert set(KEYS) <= set(bench.KEYS)
    for hook in ("prolog", "epilog", "healthcheck"):
        assert bench.STANDALONE[f"{hook}_standalone_vs_floor"] == f"{hook}_vs_floor"
        assert bench.TARGETS[f"{hook}_standalone_vs_floor"] == bench.TARGETS[f"{hook}_vs_floor"]
    assert not hasattr(bench, "HookServer")
