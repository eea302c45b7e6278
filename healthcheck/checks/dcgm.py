"""dcgm.diag: the verdict of ``dcgmi diag`` at the tier's level, one finding per GPU.

DCGM 4 writes a warning as "Fail". Those that only say the node is configured in a way DCGM
does not like (``CONFIG_ERROR_IDS``) are warnings, not a reason to drain. A failure DCGM
reports only in a test's summary (no entity) is the node's; one it reports only through
dcgmi's exit code (the JSON shows no failing test) fails the run.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..findings import Finding
from .base import CheckInput

# dcgmError_t codes (DCGM's dcgm_errors.h) that are configuration, not hardware: a failing
# result carrying only these is a warning.
CONFIG_ERROR_IDS = {
    28: "DCGM_FR_BAD_CUDA_ENV",        # the environment has variables that hurt CUDA
    29: "DCGM_FR_PERSISTENCE_MODE",    # persistence mode is disabled
}


def diag_targets(gpus: Iterable[Any], job_gpus: Optional[Iterable[int]]) -> Tuple[Optional[List[int]], List[int]]:
    """Which GPUs ``dcgmi diag`` runs on (None: all, no ``-i``) and which it skips: a GPU in MIG
    mode (NVML's mig_mode) is never diagnosed (DCGM's diagnostic does not run on MIG GPUs), it
    is skipped and said, never a failure. ``gpus``: the NVML probe's GpuFacts."""
    gpus = list(gpus)
    mig = {g.index for g in gpus if g.mig_mode == 1}
    if not mig:
        return (None if job_gpus is None else sorted(job_gpus)), []
    scope = sorted(g.index for g in gpus) if job_gpus is None else sorted(job_gpus)
    return [i for i in scope if i not in mig], [i for i in scope if i in mig]


def skip_message(skipped: List[int]) -> str:
    return (f"dcgmi diag not run on GPU {', '.join(str(i) for i in skipped)}: MIG mode is on "
            "(DCGM's diagnostic does not run on MIG GPUs)")


def is_config_warning(result) -> bool:
    return bool(result.error_ids) and all(code in CONFIG_ERROR_IDS for code in result.error_ids)


def dcgm_diag(inp: CheckInput) -> List[Finding]:
    facts = inp.dcgm
    if facts is None or facts.status in ("not_installed", "timeout", "skipped"):
        return []      # optional tool; a timeout is probe.timeout's to report; MIG GPUs are not diagnosed
    if facts.status == "error":
        return [inp.finding("dcgm.diag", "error", facts.message or "dcgmi diag failed",
                            evidence={"level": facts.level, "exit_code": facts.exit_code})]
    by_gpu: Dict[Optional[int], List[dict]] = {}
    flagged = [r for r in facts.results if r.status in ("fail", "other")]
    for result in flagged:
        targets = [g for g in result.gpus if inp.in_scope(g)] if result.gpus else [None]
        for gpu in targets:
            by_gpu.setdefault(gpu, []).append({"category": result.category, "test": result.test,
                                               "status": result.status, "warnings": result.warnings,
                                               "error_ids": result.error_ids,
                                               "config": is_config_warning(result)})
    if not flagged and facts.exit_code not in (None, 0):
        by_gpu[None] = [{"category": "", "test": "dcgmi", "status": "fail", "error_ids": [], "config": False,
                         "warnings": [f"dcgmi diag exited {facts.exit_code} although no test in its JSON failed"]}]
    gpu_facts = {g.index: g for g in (inp.nvml.gpus if inp.nvml_ok() else [])}
    findings: List[Finding] = []
    for index in sorted(by_gpu, key=lambda i: -1 if i is None else i):
        failed = by_gpu[index]
        config_only = all(f["config"] for f in failed)
        status = "warn" if config_only else "fail"
        tests = ", ".join(dict.fromkeys(f["test"] for f in failed))
        relevant = failed if config_only else [f for f in failed if not f["config"]]
        first = next((w for f in relevant for w in f["warnings"]), "")
        subject = "node" if index is None else (gpu_facts[index].subject() if index in gpu_facts else f"GPU {index}")
        verb = "warned in" if config_only else "failed"
        message = f"DCGM diag level {facts.level}: {subject} {verb} {tests}" + (f": {first}" if first else "")
        evidence = {"level": facts.level, "version": facts.version, "failed": failed, "exit_code": facts.exit_code}
        if index in gpu_facts:
            finding = inp.finding("dcgm.diag", status, message, gpu=gpu_facts[index], evidence=evidence)
        else:
            finding = inp.finding("dcgm.diag", status, message, gpu_index=index, evidence=evidence)
        if config_only and finding.action == "drain":
            finding.action = "warn"    # a configuration to fix, not hardware to take out
        findings.append(finding)
    return findings
