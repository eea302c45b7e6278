"""Back in service by itself: the remediation decision (plan, pure) and its ledger (state)."""

from typing import Any, Tuple


def health_reads(config: Any) -> Tuple[str, ...]:
    """What the health check reads beyond its tier for the remediation: with ``[remediate]
    gpu_reset`` on, the GPUs' processes (no GPU a process holds is reset). Cheap: the hook calls
    it before its probes start."""
    from ..config.settings import RemediatePolicy

    policy = config.typed(RemediatePolicy)
    return ("nvml:processes",) if policy.enabled and policy.gpu_reset else ()
