"""The simulator's stand-in for ``nvidia-smi``, as far as the remediation uses it: a GPU reset,
``nvidia-smi --gpu-reset -i <index | PCI bus id | UUID>`` (``-r`` for short). It resets that GPU
of the simulated node (``SimNode.gpu_reset``: what a reset clears cleared, the boot unchanged)
and refuses, changing nothing, when a process holds the GPU, as the real one does. Anything
else is refused with a one-line message. ``SimNode`` renders a small launcher
``<sim>/bin/nvidia-smi`` that calls ``main`` with the node's state dir and name."""
from __future__ import annotations

import sys
from typing import List, Optional


def _target(argv: List[str]) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg in ("-i", "--id") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--id="):
            return arg.split("=", 1)[1]
    return None


def main(argv: List[str], state_dir: str, node: str) -> int:
    from .node import SimNode

    target = _target(argv)
    if not ({"-r", "--gpu-reset"} & set(argv)) or target is None:
        print("the simulated nvidia-smi only does a GPU reset: nvidia-smi --gpu-reset -i <GPU>", file=sys.stderr)
        return 2
    status, text = SimNode(state_dir, node).gpu_reset(target)
    print(text, file=sys.stdout if status == 0 else sys.stderr)
    return status
