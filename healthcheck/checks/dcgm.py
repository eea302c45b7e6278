"""dcgm.diag: the verdict of ``dcgmi diag`` at the tier's level, one finding per GPU."""
from __future__ import annotations

from typing import Dict, List, Optional

from ..findings import Finding
from .base import CheckInput


def dcgm_diag(inp: CheckInput) -> List[Finding]:
    facts = inp.dcgm
    if facts is None or facts.status in ("not_installed", "timeout"):
        return []      # optional tool; a timeout is probe.timeout's to report
    if facts.status == "error":
        return [inp.finding("dcgm.diag", "error", facts.message or "dcgmi diag failed",
                            evidence={"level": facts.level, "exit_code": facts.exit_code})]
    by_gpu: Dict[Optional[int], List[dict]] = {}
    for result in facts.results:
        if result.status not in ("fail", "other"):
            continue
        targets = [g for g in result.gpus if inp.in_scope(g)] if result.gpus else [None]
        for gpu in targets:
            by_gpu.setdefault(gpu, []).append({"category": result.category, "test": result.test,
                                               "status": result.status, "warnings": result.warnings})
    gpu_facts = {g.index: g for g in (inp.nvml.gpus if inp.nvml_ok() else [])}
    findings: List[Finding] = []
    for index in sorted(by_gpu, key=lambda i: -1 if i is None else i):
        failed = by_gpu[index]
        tests = ", ".join(dict.fromkeys(f["test"] for f in failed))
        first = next((w for f in failed for w in f["warnings"]), "")
        subject = "node" if index is None else (gpu_facts[index].subject() if index in gpu_facts else f"GPU {index}")
        message = f"DCGM diag level {facts.level}: {subject} failed {tests}" + (f": {first}" if first else "")
        evidence = {"level": facts.level, "version": facts.version, "failed": failed}
        if index in gpu_facts:
            findings.append(inp.finding("dcgm.diag", "fail", message, gpu=gpu_facts[index], evidence=evidence))
        else:
            findings.append(inp.finding("dcgm.diag", "fail", message, gpu_index=index, evidence=evidence))
    return findings
