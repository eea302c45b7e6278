"""Compose a tier: run the probes its checks need (concurrently, each under a deadline), run
the checks on the facts, keep counter history, and sum the findings up as a ``Report``.

The prolog and the health check call ``run_checks``; so keep this module cheap to import
(no pynvml, no jinja2: probes import pynvml inside their child).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from .checks import CHECKS, needs, nvml_features
from .checks.base import CheckInput
from .config import Config
from .facts import DcgmFacts
from .findings import EXIT_CODES, Finding, strongest_action, worst_status
from .sources import NodeSources

DEFAULT_TIER = "health"


@dataclass
class Report:
    node: str
    status: str                              # ok | warn | fail | error: the worst finding's
    findings: List[Finding] = field(default_factory=list)   # only those that are not ok
    duration_ms: int = 0
    tier: str = DEFAULT_TIER

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def action(self) -> str:
        """The strongest action any finding asks for: none | warn | drain."""
        return strongest_action(self.findings)

    def to_json(self) -> Dict[str, Any]:
        """The ``slurm-gpu check --json`` contract."""
        return {"node": self.node, "status": self.status,
                "findings": [finding.to_json() for finding in self.findings],
                "duration_ms": self.duration_ms}


def run_checks(config: Config, node: str, tier: str = DEFAULT_TIER, gpus: Optional[Iterable[int]] = None,
               sources: Optional[NodeSources] = None, now: Optional[float] = None,
               consumer: str = "hook") -> Report:
    """Run ``tier``'s checks for ``node``; ``gpus`` (NVML indices, e.g. SLURM_JOB_GPUS)
    restricts the GPU checks to those GPUs. ``consumer`` names who reads the kernel log ("hook",
    "cli"): each keeps its own cursor. Never raises for what it finds on the node; setting
    up ``sources`` when none are given can raise (ProfileError for a bad simulator profile)."""
    started = time.monotonic()
    now = time.time() if now is None else now
    check_ids = [cid for cid in config.tier(tier) if cid in CHECKS]
    job_gpus = None if gpus is None else frozenset(int(g) for g in gpus)
    if sources is None:
        from .sources import node_sources

        sources = node_sources(config, node)
    wanted = needs(check_ids)
    timeout_s = float(config.section("gpu")["probe_timeout_s"])

    # Start the probes that can block together, then collect: their deadlines overlap.
    nvml_child = ib_child = None
    if "nvml" in wanted:
        from .probes.nvml import start_nvml_probe

        nvml_child = start_nvml_probe(sources.nvml, timeout_s, nvml_features(check_ids), job_gpus)
    if "ib" in wanted:
        from .probes.ib_sysfs import start_ib_probe

        ib_child = start_ib_probe(sources.sysfs_root, timeout_s)
    dcgm = _run_dcgm(config, tier, job_gpus) if "dcgm" in wanted else None
    nvml = ib = None
    if nvml_child is not None:
        from .probes.nvml import nvml_facts

        nvml = nvml_facts(nvml_child)
    if ib_child is not None:
        from .probes.ib_sysfs import ib_facts

        ib = ib_facts(ib_child)

    kernel = None
    if "kernel" in wanted:
        from .probes.kernel_log import probe_kernel_log

        kernel = probe_kernel_log(sources.kernel_log, sources.state_dir, node, tier, config,
                                  gpus=nvml.gpus if nvml is not None and nvml.status == "ok" else (), now=now,
                                  consumer=consumer)

    extra: List[Finding] = []
    samplers = [CHECKS[cid].sampler() for cid in check_ids if CHECKS[cid].samples]
    history_store, history = None, {}
    if samplers:
        history_store, history, problem = _load_history(config, sources.state_dir, node)
        if problem:
            extra.append(problem)

    inp = CheckInput(node=node, expected=config.expected_hardware(node), thresholds=config.section("thresholds"),
                     actions=config.section("actions"), nvml=nvml, ib=ib, dcgm=dcgm, kernel=kernel, history=history,
                     now=now, gpus=job_gpus, tier=tier)
    from .checks.probe_health import probe_findings

    findings = probe_findings(inp) + extra
    for cid in check_ids:
        try:
            findings.extend(CHECKS[cid].function()(inp))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            findings.append(inp.finding("check.error", "error", f"check {cid} failed: {type(exc).__name__}: {exc}",
                                        evidence={"check": cid}))
    if history_store is not None:
        problem = _save_history(history_store, samplers, inp)
        if problem:
            findings.append(problem)

    findings = [f for f in findings if f.status != "ok"]
    return Report(node=node, status=worst_status(findings), findings=findings,
                  duration_ms=int((time.monotonic() - started) * 1000), tier=tier)


def _run_dcgm(config: Config, tier: str, gpus: Optional[frozenset]) -> DcgmFacts:
    from .probes.dcgm import probe_dcgm

    section = config.section("dcgm")
    level = int(section.get("levels", {}).get(tier, 1))
    return probe_dcgm(section["dcgmi"], level, float(section["timeout_s"]), gpus)


def _load_history(config: Config, state_dir: str, node: str):
    from .history import CounterHistory

    try:
        store = CounterHistory(state_dir, node)
        return store, store.load(), None
    except (OSError, ValueError) as exc:
        return None, {}, Finding(check="probe.error", status="error", action=config.action("probe.error"),
                                 message=f"counter history unusable, growth not judged: {_os_text(exc)}",
                                 evidence={"state_dir": state_dir})


def _save_history(store, samplers, inp: CheckInput) -> Optional[Finding]:
    samples: Dict[str, Any] = {}
    try:
        for sampler in samplers:
            samples.update(sampler(inp))
        if samples:
            store.record(samples, inp.now)
    except (OSError, ValueError) as exc:
        return inp.finding("probe.error", "error", f"counter history not saved: {_os_text(exc)}",
                           evidence={"path": store.path})
    return None


def _os_text(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror}"
    return str(exc)
