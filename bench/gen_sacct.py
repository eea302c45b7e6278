"""Generate a month of a large GPU cluster's accounting, in the real format that
``sacct -a -D -X -P --format=$(slurm-gpu summary --sacct-format)`` prints (header line, ``|``).

    python bench/gen_sacct.py OUT.txt --jobs 1000000 --seed 1

Or from Python: ``write_jobs(path, n, seed)`` (the benchmark calls it). The same seed gives the
same file. What is in it, so a summary of it can be checked:

* 1,024 nodes ``gpu0001``..``gpu1024`` with 8 GPUs; most jobs on one node, some on 2-16
  (node lists in Slurm's bracket form, ``gpu[0012-0015]``); ``AllocTRES`` with ``gres/gpu=N``.
* endings in the proportions of a busy cluster, ``CANCELLED by <uid>`` included; a requeued
  job's earlier incarnation as its own row (``-D``), same JobID, another DBIndex.
* this tool's AdminComment entries (``SGH1:{...}``, the format of
  ``healthcheck.records.admin_comment``) on ``tagged`` of the jobs: a job-level entry, plus a
  node-level one naming node, GPU and Xid for hardware endings; jobstats' ``JS1:`` blob on some.
  ``stored`` of them as sacctmgr stores them (lower case, quotes as backticks), the rest as the
  Prolog's scontrol stores them (verbatim).
* three "lemon" nodes (``LEMONS``) whose jobs end on hardware ten times as often as the rest.
* job names that are data: spaces, ``|`` (sacct does not escape it), ``<script>``, unicode.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import time
from typing import List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from healthcheck.records import admin_comment  # noqa: E402
from slurm_hooks.summary.accounting import SACCT_FIELDS  # noqa: E402

NODES = 1024
GPUS_PER_NODE = 8
LEMONS = ("gpu0042", "gpu0314", "gpu0777")
HARDWARE_RATE = 0.006                 # per job-node on an ordinary node
LEMON_FACTOR = 10
START = 1790812800                    # 2026-10-01T00:00:00Z: a month from here
MONTH_S = 30 * 86400

# (state, weight) of endings that are not hardware
ENDINGS: Sequence[Tuple[str, float]] = (
    ("COMPLETED", 0.64), ("FAILED", 0.15), ("CANCELLED by {uid}", 0.10), ("TIMEOUT", 0.06),
    ("PREEMPTED", 0.02), ("OUT_OF_MEMORY", 0.02), ("NODE_FAIL", 0.01))
# (class, xid, exit code) of hardware endings
HARDWARE: Sequence[Tuple[str, Optional[int], str]] = (
    ("GPU_LOST", 79, "1:0"), ("GPU_ECC", 48, "1:0"), ("GPU_XID", 94, "1:0"), ("GPU_XID", 119, "1:0"),
    ("NVLINK", 74, "1:0"), ("INFINIBAND", None, "1:0"), ("GPU_ECC", 63, "1:0"))
NAMES = ("train_llama", "eval", "bert-finetune", "sweep lr=3e-4", "job|with|pipes", "<script>alert(1)</script>",
         "résumé-ß", "data prep", "nccl-test", "ray_worker")
USERS = tuple(f"user{i:03d}" for i in range(200))
ACCOUNTS = ("ml", "vision", "nlp", "hpc", "infra")
PARTITIONS = ("gpu", "gpu", "gpu", "preempt", "debug")


def node_name(index: int) -> str:
    return f"gpu{index + 1:04d}"


def nodelist(first: int, count: int) -> str:
    if count == 1:
        return node_name(first)
    return f"gpu[{first + 1:04d}-{first + count:04d}]"


def _iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def _jobstats(rng: random.Random) -> str:
    return "JS1:" + base64.b64encode(rng.randbytes(48) if hasattr(rng, "randbytes")
                                     else bytes(rng.getrandbits(8) for _ in range(48))).decode()


def _row(values: dict) -> str:
    return "|".join(str(values[field]) for field in SACCT_FIELDS)


def as_stored_by_sacctmgr(text: str) -> str:
    """What ``sacctmgr ... set AdminComment=TEXT`` stores on 22.05.8 (lower case, quotes as
    backticks): the Epilog writes through sacctmgr, so this is what sacct shows."""
    return text.lower().replace('"', "`").replace("'", "`")


def write_jobs(path: str, n: int, seed: int = 1, tagged: float = 0.7, stored: float = 0.9) -> int:
    """Write ``n`` jobs (plus the extra rows of requeued jobs) to ``path``; returns the rows."""
    rng = random.Random(seed)
    states = [s for s, _ in ENDINGS]
    weights = [w for _, w in ENDINGS]
    lemons = {int(name[3:]) - 1 for name in LEMONS}
    rows = 0
    db_index = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write("|".join(SACCT_FIELDS) + "\n")
        for job in range(1, n + 1):
            size = 1 if rng.random() < 0.85 else rng.choice((2, 2, 4, 4, 8, 16))
            first = rng.randrange(NODES - size + 1)
            nodes = [first + k for k in range(size)]
            gpus_per_node = GPUS_PER_NODE if size > 1 else rng.choice((1, 1, 2, 4, 8, 8))
            submit = START + rng.randrange(MONTH_S)
            start = submit + rng.randrange(0, 600)
            elapsed = int(rng.expovariate(1 / 5400)) + 1
            end = start + elapsed
            uid = rng.randrange(1000, 1200)
            user = USERS[uid - 1000]
            name = NAMES[rng.randrange(len(NAMES))] if rng.random() < 0.3 else f"job-{job % 997}"
            broken = [k for k in nodes if rng.random() < HARDWARE_RATE * (LEMON_FACTOR if k in lemons else 1)]
            entries: List[dict] = []
            exit_code = "0:0"
            if broken:
                cls, xid, exit_code = HARDWARE[rng.randrange(len(HARDWARE))]
                state = "FAILED"
                culprit = node_name(broken[0])
                node_entry = {"node": culprit, "class": cls, "gpu": rng.randrange(gpus_per_node), "t": end}
                if xid is not None:
                    node_entry["xid"] = xid
                else:
                    node_entry["check"] = "ib.port.state"
                entries = [node_entry]
                if rng.random() < tagged:
                    entries.append({"node": "*", "class": cls, "nodes": nodelist(first, size), "t": end})
            else:
                state = rng.choices(states, weights)[0].format(uid=uid)
                if state == "FAILED":
                    exit_code = f"{rng.choice((1, 1, 2, 137))}:0"
                elif state == "OUT_OF_MEMORY":
                    exit_code = "0:125"
                if rng.random() < tagged:
                    entries = [{"node": "*", "class": state.split(" ")[0], "nodes": nodelist(first, size), "t": end}]
            comment = " ".join(admin_comment.encode(e) for e in entries)
            if rng.random() < 0.1:
                comment = (_jobstats(rng) + " " + comment).strip()
            if entries and rng.random() < stored:
                comment = as_stored_by_sacctmgr(comment)
            base = {"JobIDRaw": job, "JobID": job, "User": user, "Account": ACCOUNTS[uid % len(ACCOUNTS)],
                    "Partition": PARTITIONS[job % len(PARTITIONS)], "Submit": _iso(submit),
                    "NNodes": size, "NodeList": nodelist(first, size), "JobName": name,
                    "AllocTRES": f"billing={size * 16},cpu={size * 16},gres/gpu={size * gpus_per_node},"
                                 f"mem={size * 256}G,node={size}"}
            if rng.random() < 0.005:                    # preempted and requeued: an earlier incarnation
                db_index += 1
                early_end = start + max(1, elapsed // 3)
                out.write(_row(dict(base, DBIndex=db_index, State="PREEMPTED", ExitCode="0:0", Start=_iso(start),
                                    End=_iso(early_end), ElapsedRaw=early_end - start, AdminComment="")) + "\n")
                rows += 1
                start, end = early_end + 120, early_end + 120 + elapsed
            db_index += 1
            out.write(_row(dict(base, DBIndex=db_index, State=state, ExitCode=exit_code, Start=_iso(start),
                                End=_iso(end), ElapsedRaw=end - start, AdminComment=comment)) + "\n")
            rows += 1
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tagged", type=float, default=0.7, help="share of jobs with a job-level entry of ours")
    args = parser.parse_args(argv)
    if args.jobs < 1 or not 0 <= args.tagged <= 1:
        parser.error("--jobs must be >= 1 and --tagged within 0..1")
    started = time.perf_counter()
    rows = write_jobs(args.path, args.jobs, args.seed, args.tagged)
    print(f"{args.path}: {rows} rows ({args.jobs} jobs) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
