"""gpu.remap.pending, gpu.remap.failed, gpu.retired_pages.pending: memory the GPU has set aside."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput


def remap_pending(inp: CheckInput) -> List[Finding]:
    return [inp.finding("gpu.remap.pending", "fail",
                        f"{gpu.subject()}: row remapping is pending; reset the GPU (or reboot) to apply it",
                        gpu=gpu, evidence=dict(gpu.remapped_rows))
            for gpu in inp.healthy_gpus() if gpu.remapped_rows and gpu.remapped_rows.get("pending")]


def remap_failed(inp: CheckInput) -> List[Finding]:
    return [inp.finding("gpu.remap.failed", "fail",
                        f"{gpu.subject()}: row remapping failed (no spare rows left); the GPU needs replacing",
                        gpu=gpu, evidence=dict(gpu.remapped_rows))
            for gpu in inp.healthy_gpus() if gpu.remapped_rows and gpu.remapped_rows.get("failure")]


def retired_pages_pending(inp: CheckInput) -> List[Finding]:
    return [inp.finding("gpu.retired_pages.pending", "fail",
                        f"{gpu.subject()}: memory pages are waiting to be retired; reset the GPU (or reboot)",
                        gpu=gpu, evidence={"retired_pages_pending": True})
            for gpu in inp.healthy_gpus() if gpu.retired_pages_pending]
