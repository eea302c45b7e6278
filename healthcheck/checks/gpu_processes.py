"""gpu.processes: compute processes holding GPU memory where none should be (before a job)."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput, join_numbers, plural


def stray_processes(inp: CheckInput) -> List[Finding]:
    allowance = inp.threshold("process_memory_max_mib")
    findings: List[Finding] = []
    for gpu in inp.healthy_gpus():
        holding = [p for p in (gpu.processes or [])
                   if p.get("used_memory_mib") is None or p["used_memory_mib"] > allowance]
        if not holding:
            continue
        known = [p["used_memory_mib"] for p in holding if p.get("used_memory_mib") is not None]
        memory = f" holding {sum(known)} MiB" if known else ""
        when = " before the job starts" if inp.tier == "prolog" else ""
        findings.append(inp.finding(
            "gpu.processes", "fail",
            f"{gpu.subject()}: {plural(len(holding), 'compute process', 'es')}{memory}{when} "
            f"(pid {join_numbers([p['pid'] for p in holding])})",
            gpu=gpu, evidence={"processes": holding, "allowance_mib": allowance}))
    return findings
