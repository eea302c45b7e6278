"""``slurm-gpu-taskprolog``: Slurm's TaskProlog (run by slurmstepd as the job's user before each
task, in the task's environment). What it prints as ``export NAME=value`` Slurm sets in the task.

It exports the NCCL settings that fit this node's fabric (``healthcheck/taskenv/nccl_env.py``) on nodes
whose ``[[nodes]]`` group has ``nccl_env = true``, and never a name the user set. A value the
task inherited from an earlier export of ours (the batch script's TaskProlog, another node's) is
not the user's: it is derived again for this task (``SGH_NCCL_EXPORTED`` tells the two apart).
It never fails a task: on any problem it prints nothing, says why in one line on stderr and
exits 0. It runs once per task, so it reads only small files (config, sysfs, the driver's /proc
files): no NVML, no subprocess, no click.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional, Sequence


EXAMPLE = ("SLURMD_NODENAME=gpu1 SLURM_JOB_ID=42 SLURM_STEP_GPUS=0,1 slurm-gpu-taskprolog"
           "   # the export lines a task of job 42 on GPUs 0,1 gets")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hooklib.nogc import short_process

    with short_process():      # before the imports: a hook is one short process
        from healthcheck.hooklib.skeleton import ADMIN_HELP, serve

        # No watchdog (it reads small files only) and no journal (the job's user cannot write it).
        return serve("taskprolog", argv, _body, doc=ADMIN_HELP, example=EXAMPLE, start=_start)


def _start(argv):
    return _start_in(os.environ)


def _start_in(env: Mapping[str, str]):
    from healthcheck.hooklib.skeleton import start

    return start("taskprolog", env)


def _body(run):
    from healthcheck.hooklib.skeleton import Ending

    text = exports(os.environ, run.config)        # all of it first: on any problem nothing is printed
    if text:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as exc:
            _log(f"could not print the exports: {exc}")
    return Ending(0)


def exports(env: Mapping[str, str], config=None) -> str:
    """The ``export``/``unset`` lines for this task ('' when the node did not opt in; ``config``:
    the hook's, else loaded as the hook loads it)."""
    from healthcheck.config import node_name
    from healthcheck.config.settings import NcclSettings
    from healthcheck.taskenv.nccl_env import derive, render
    from healthcheck.probes.ib_sysfs import probe_ib
    from healthcheck.sources import node_paths
    from healthcheck.taskenv.topology import gpu_places, hca_places

    if config is None:
        run = _start_in(env)
        if isinstance(run, int):
            return ""
        config = run.config
    node = node_name(None, env)
    expected = config.expected_hardware(node)
    if not expected.get("nccl_env"):
        return ""
    sysfs_root, proc_root = node_paths(config, node)
    ib = probe_ib(sysfs_root, counters=())
    if ib.status != "ok":
        _log(f"IB ports unreadable, doing nothing: {ib.message}")
        return ""
    return render(derive(env, ib.ports, gpu_places(sysfs_root, proc_root), hca_places(sysfs_root), expected,
                         config.typed(NcclSettings)))


def _log(message: str) -> None:
    try:
        print(f"slurm-gpu-taskprolog: {message}", file=sys.stderr)
    except BaseException:              # noqa: B036 - nothing here may fail the task
        pass


if __name__ == "__main__":
    sys.exit(main())
