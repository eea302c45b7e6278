"""The remediation's GPU reset: the argument list (pure) and the one edge that runs it.

The real operation is NVIDIA's ``nvidia-smi --gpu-reset -i <GPU>``: NVML's reset is not part of
its public API (pynvml has no call for it), so the honest edge is the site's command, an argument
list from ``[remediate] gpu_reset_command`` run without a shell, ``{gpu}`` replaced by the GPU
to reset (its PCI bus id, else its UUID, else its index: ``-i`` takes each). Exit 0 is a reset
done; anything else (``nvidia-smi`` refuses while a process holds the GPU, or while the
persistence daemon, the fabric manager or DCGM's host engine keeps it open) is one line, and the
remediation reboots instead. A simulated node has its own ``nvidia-smi`` (``programs_dir``).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ..safeio import programs

PLACEHOLDER = "{gpu}"
TAIL_KEEP = 8192           # of a reset's stdout: its last line says what went wrong


class ResetError(Exception):
    """The reset did not happen: one line."""


def reset_argv(command: Sequence[str], target: str) -> Tuple[str, ...]:
    """The command with ``{gpu}`` replaced by ``target`` in every argument."""
    return tuple(str(arg).replace(PLACEHOLDER, target) for arg in command)


def reset_target(evidence: Sequence[object], subject: str) -> Optional[str]:
    """How ``nvidia-smi -i`` names the GPU of a drain's subject (``gpu3``), from the drain's
    evidence (findings as JSON): its PCI bus id, else its UUID, else its index; None when the
    subject is not one GPU."""
    if not subject.startswith("gpu") or not subject[3:].isdigit():
        return None
    index = int(subject[3:])
    found = [f for f in evidence if isinstance(f, dict) and f.get("gpu") == index]
    for key in ("pci_bus_id", "uuid"):
        for finding in found:
            if finding.get(key):
                return str(finding[key])
    return str(index)


def resolved(argv: Sequence[str], programs_dir: Optional[str] = None) -> Optional[Tuple[str, ...]]:
    """``argv`` with its program's path (looked up as ``ib_write_bw`` is: an absolute path, else
    PATH and the usual directories; ``programs_dir``, a simulated node's stand-ins, the only
    place looked at when given); None when there is no such program."""
    program = programs.find_program(str(argv[0]), programs_dir) if argv else None
    return None if program is None else (program, *argv[1:])


def run_reset(argv: Sequence[str], timeout_s: float) -> None:
    """The edge: run the reset; ``ResetError`` (one line) unless it exited 0. Its output is read
    as every program's that may print without end (``programs.stream``): nothing held whole, only
    the last ``TAIL_KEEP`` bytes of stdout (and ``programs.STDERR_KEEP`` of stderr) for the line
    that says what went wrong."""
    tail = bytearray()

    def keep(chunk: bytes) -> None:
        tail.extend(chunk[-TAIL_KEEP:])
        del tail[:-TAIL_KEEP]

    try:
        code, errors = programs.stream(list(argv), timeout_s, keep)
    except programs.CommandError as exc:
        raise ResetError(str(exc)) from None
    if code != 0:
        done = programs.Completed(list(argv), code, tail.decode("utf-8", "replace"), errors.decode("utf-8", "replace"))
        raise ResetError(f"{programs.describe(argv)}: exit {code}: {done.last_line()}")
