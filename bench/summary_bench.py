"""How fast ``slurm-gpu summary --input`` reads a month of a large cluster, against a bare Python
loop that only splits the same file's lines (the benchmark issue's yardstick: at most 3x its
time, at most 200 MB peak memory).

    python bench/summary_bench.py [--jobs 1000000] [--file sacct.txt] [--repeat 3]

Each run is a fresh process (peak RSS of its largest process from wait4); the best of
``--repeat`` runs counts, wall and CPU time both (CPU time is steadier on a shared machine; a big
file is read by several processes, so the summary's CPU time exceeds its wall time). Prints one
JSON object; exits 1 when the targets are missed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

BARE = """
import sys
with open(sys.argv[1], encoding="utf-8", errors="replace") as handle:
    for line in handle:
        line.split("|")
"""
SUMMARY = "import sys; from slurm_hooks.cli import main; sys.argv[0] = 'slurm-gpu'; main()"


def measure(argv: List[str]) -> Dict[str, float]:
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... exited {child.returncode}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


def best(runs: List[Dict[str, float]]) -> Dict[str, float]:
    return {key: round(min(run[key] for run in runs), 3) for key in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--file", help="an existing sacct file (default: generate bench/out/sacct-<jobs>.txt)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = args.file
    if not path:
        from gen_sacct import write_jobs

        path = os.path.join(HERE, "out", f"sacct-{args.jobs}.txt")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_jobs(path + ".tmp", args.jobs, seed=1)
            os.replace(path + ".tmp", path)
    bare_runs, summary_runs = [], []
    for _ in range(args.repeat):               # interleaved: both see the same machine load
        bare_runs.append(measure([sys.executable, "-c", BARE, path]))
        summary_runs.append(measure([sys.executable, "-c", SUMMARY, "summary", "--input", path, "--json"]))
    bare, summary = best(bare_runs), best(summary_runs)
    result = {
        "file": path, "bytes": os.path.getsize(path), "bare": bare, "summary": summary,
        "ratio_wall": round(summary["wall_s"] / bare["wall_s"], 2),
        "ratio_cpu": round(summary["cpu_s"] / bare["cpu_s"], 2),
        "targets": {"ratio_max": 3.0, "peak_mb_max": 200},
    }
    from slurm_hooks.summary.parallel import workers_for

    result["workers"] = workers_for(path, None)
    # What a user waits for is wall time; peak is the largest process (each worker holds its own
    # counters, so the processes together hold at most workers + 1 times that).
    result["ok"] = result["ratio_wall"] <= 3.0 and summary["peak_mb"] * (result["workers"] + 1) <= 200
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
