"""Back in service by itself: the remediation decision (plan, pure) and its ledger (state)."""

from typing import Any, Tuple


def health_reads(config: Any) -> Tuple[str, ...]:
    """What the health check reads beyond its tier for the remediation: with ``[remediate]
    gpu_reset`` on, the GPUs' processes (no GPU a process holds is reset). Cheap: the hook calls
    it before its probes start."""
    section = config.section("remediate")
    return ("nvml:processes",) if section["enabled"] and section["gpu_reset"] else ()
