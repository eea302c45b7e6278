"""What the lab's scenario jobs run: ``python -m slurm_hooks.lab.payload MODE ...``.

``train`` behaves like a training job on the node's simulated GPUs: every second it asks
its GPUs (the absolute indices in SLURM_JOB_GPUS) through the simulator's NVML, checks
their NVLinks and the node's InfiniBand ports, and dies the way CUDA or NCCL would when
something breaks under it (exit 1, the error on stderr). The scenario runner breaks the
hardware from outside with ``slurm-gpu sim inject`` once the job printed its ready line.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

READY = "lab-payload: ready"
EXIT_CUDA_ERROR = 1


def _say(message: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(message + "\n")
    stream.flush()


def job_gpus(env=os.environ) -> List[int]:
    raw = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    return [int(part) for part in raw.split(",") if part.strip().isdigit()]


# -- modes -------------------------------------------------------------------------------------
def do_sleep(seconds: float, restarted_seconds: Optional[float]) -> int:
    if restarted_seconds is not None and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
        seconds = restarted_seconds
    _say(f"{READY} node={os.environ.get('SLURMD_NODENAME', '?')} pid={os.getpid()} sleep={seconds:g}")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    return 0


def do_exit(code: int) -> int:
    _say(f"{READY} node={os.environ.get('SLURMD_NODENAME', '?')} pid={os.getpid()} exit={code}")
    _say(f"lab-payload: exiting with {code}", err=True)
    return code


def do_oom(limit_mib: int) -> int:
    """Grow RSS 16 MiB at a time until the kernel's OOM killer (memory cgroup) ends us."""
    _say(f"{READY} node={os.environ.get('SLURMD_NODENAME', '?')} pid={os.getpid()} oom")
    hoard = []
    for step in range(1, limit_mib // 16 + 1):
        hoard.append(bytearray(16 * 1024 * 1024))  # bytearray() touches every page
        if step % 8 == 0:
            _say(f"lab-payload: holding {step * 16} MiB")
        time.sleep(0.02)
    _say(f"lab-payload: still alive with {limit_mib} MiB: nothing enforces --mem here", err=True)
    return 2


def do_hello() -> int:
    _say(f"lab-payload: hello from {os.environ.get('SLURMD_NODENAME', '?')} "
         f"task {os.environ.get('SLURM_PROCID', '?')} gpus {os.environ.get('SLURM_JOB_GPUS', '-')}")
    return 0


class HardwareBroke(Exception):
    """What the job's CUDA or NCCL call would raise; the message is what a user would see."""


def _ib_states(sysfs_root: str) -> Dict[str, str]:
    states = {}
    for path in sorted(glob.glob(os.path.join(sysfs_root, "class", "infiniband", "*", "ports", "*", "state"))):
        parts = path.split(os.sep)
        try:
            with open(path, encoding="ascii") as handle:
                states[f"{parts[-4]}:{parts[-2]}"] = handle.read().strip()
        except OSError:
            states[f"{parts[-4]}:{parts[-2]}"] = "unreadable"
    return states


def _look(nvml, gpus: Sequence[int]) -> Dict[str, object]:
    """One look at the GPUs as a CUDA/NCCL program would notice them."""
    seen: Dict[str, object] = {}
    nvml.nvmlInit()
    try:
        for index in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceGetName(handle)
            except nvml.NVMLError_GpuIsLost:
                raise HardwareBroke(f"CUDA error: unspecified launch failure (GPU {index} is lost)") from None
            except nvml.NVMLError as exc:
                raise HardwareBroke(f"CUDA error: GPU {index} failed: {exc}") from None
            try:
                seen[f"dbe{index}"] = nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
            except nvml.NVMLError_GpuIsLost:
                raise HardwareBroke(f"CUDA error: unspecified launch failure (GPU {index} is lost)") from None
            except nvml.NVMLError:
                seen[f"dbe{index}"] = 0
            links = []
            for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                try:
                    links.append(nvml.nvmlDeviceGetNvLinkState(handle, link))
                except nvml.NVMLError:
                    break
            seen[f"nvlink{index}"] = links
    finally:
        nvml.nvmlShutdown()
    return seen


def do_train(seconds: float, config_path: Optional[str]) -> int:
    from healthcheck.config import Config, node_name
    from healthcheck.sources import node_sources

    node = node_name(None, os.environ)
    config = Config.load(config_path)
    sources = node_sources(config, node)
    gpus = job_gpus()
    if not gpus:
        _say("lab-payload: train needs GPUs (--gres=gpu:N)", err=True)
        return 2
    try:
        baseline = _look(sources.nvml, gpus)
    except HardwareBroke as exc:
        _say(f"RuntimeError: {exc}", err=True)
        return EXIT_CUDA_ERROR
    ib_baseline = _ib_states(sources.sysfs_root)
    _say(f"{READY} node={node} pid={os.getpid()} gpus={','.join(map(str, gpus))}")
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        time.sleep(0.5)
        step += 1
        try:
            now = _look(sources.nvml, gpus)
            for index in gpus:
                if now[f"dbe{index}"] > baseline[f"dbe{index}"]:
                    raise HardwareBroke(f"CUDA error: uncorrectable ECC error encountered (GPU {index})")
                before, after = baseline[f"nvlink{index}"], now[f"nvlink{index}"]
                down = [link for link, state in enumerate(after) if state == 0 and before[link] == 1]
                if down:
                    raise HardwareBroke(f"NCCL error: unhandled cuda error, NVLink {down} of GPU {index} "
                                        "is down (ncclUnhandledCudaError)")
            for port, state in _ib_states(sources.sysfs_root).items():
                if ib_baseline.get(port, "").startswith("4") and not state.startswith("4"):
                    raise HardwareBroke(f"NCCL WARN NET/IB : {port} went {state!r}: "
                                        "transport retry counter exceeded (ncclSystemError)")
        except HardwareBroke as exc:
            _say(f"RuntimeError: {exc}", err=True)
            return EXIT_CUDA_ERROR
        if step % 10 == 0:
            _say(f"lab-payload: step {step} fine")
    _say("lab-payload: training finished")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_hooks.lab.payload")
    modes = parser.add_subparsers(dest="mode", required=True)
    sleep = modes.add_parser("sleep")
    sleep.add_argument("seconds", type=float)
    sleep.add_argument("--restarted-seconds", type=float, default=None,
                       help="sleep this long instead once Slurm requeued the job")
    code = modes.add_parser("exit")
    code.add_argument("code", type=int)
    oom = modes.add_parser("oom")
    oom.add_argument("--limit-mib", type=int, default=1024)
    modes.add_parser("hello")
    train = modes.add_parser("train")
    train.add_argument("--seconds", type=float, default=60)
    train.add_argument("--config", default=None)
    args = parser.parse_args(argv)
    if args.mode == "sleep":
        return do_sleep(args.seconds, args.restarted_seconds)
    if args.mode == "exit":
        return do_exit(args.code)
    if args.mode == "oom":
        return do_oom(args.limit_mib)
    if args.mode == "hello":
        return do_hello()
    return do_train(args.seconds, args.config)


if __name__ == "__main__":
    sys.exit(main())
