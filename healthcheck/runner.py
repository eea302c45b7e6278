"""Compose a tier: run the probes its checks need (concurrently, each under a deadline), run
the checks on the facts, and sum the findings up as a ``Report`` that also carries the facts.

Read, act, then commit: the kernel-log cursor and this run's counter samples are saved only by
``Report.commit()``, which the hooks call after applying (or durably recording) their
decision; a hook killed before that reads the same Xids again next time. ``slurm-gpu check``
commits right away (``commit=True``).

The prolog and the health check call ``run_checks``; so keep this module cheap to import
(no pynvml, no jinja2: probes import pynvml inside their child).
"""
from __future__ import annotations

import time
from .plain import field, plain
from typing import Any, Callable, Dict, Iterable, List, Optional

from . import checks
from .checklist import CHECKS, needs, nvml_features
from .checks.base import CheckInput
from .config import Config
from .config.settings import DcgmSettings, GpuSettings, PerftestSettings
from .facts import NVML_READ_GROUPS, DcgmFacts, RunFacts
from .findings import EXIT_CODES, Finding, strongest_action, worst_status
from .sources import NodeSources

DEFAULT_TIER = "health"

# The prolog's counter baseline, read in the same probe run as its checks: ECC counters,
# remapped rows, NVLink states and error counters, IB ports and counters (UUIDs, PCI bus ids
# and NVML minor numbers come with every NVML read).
BASELINE_READS = ("nvml:ecc", "nvml:remap", "nvml:nvlink_errors", "ib")


@plain
class Report:
    node: str
    status: str                              # ok | warn | fail | error: the worst finding's
    findings: List[Finding] = field(default_factory=list)   # only those that are not ok
    duration_ms: int = 0
    tier: str = DEFAULT_TIER
    facts: RunFacts = field(default_factory=RunFacts, repr=False, compare=False)
    # What commit() saves: each returns None, or a finding saying what could not be saved.
    pending: List[Callable[[], Optional[Finding]]] = field(default_factory=list, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def action(self) -> str:
        """The strongest action any finding asks for: none | warn | drain."""
        return strongest_action(self.findings)

    def commit(self) -> List[Finding]:
        """Save what this run read: the kernel-log cursor and flood state, the counter samples.

        Call it once the findings were acted on. Never raises: what could not be saved comes
        back as findings (``probe.error``); the next run then reads the same lines again.
        A second call saves nothing.
        """
        pending, self.pending = self.pending, []
        problems = []
        for step in pending:
            try:
                problem = step()
            except Exception as exc:  # noqa: BLE001 - a bug while saving must not break the hook after it acted
                problem = Finding(check="check.error", status="error", action="none",
                                  message=f"state not saved: {type(exc).__name__}: {exc}")
            if problem is not None:
                problems.append(problem)
        return problems

    def add(self, findings: Iterable[Finding]) -> None:
        """Add findings that are not ok (e.g. what ``commit`` returned) and update the status."""
        self.findings.extend(f for f in findings if f.status != "ok")
        self.status = worst_status(self.findings)

    def to_json(self) -> Dict[str, Any]:
        """The ``slurm-gpu check --json`` contract."""
        return {"node": self.node, "status": self.status,
                "findings": [finding.to_json() for finding in self.findings],
                "duration_ms": self.duration_ms}


class Probes:
    """The probes of one run that can block (NVML, IB sysfs), started in their children under
    their deadlines: ``start_probes`` makes one, ``run_checks(probes=...)`` collects it. A hook
    starts them as soon as it knows its node and imports the rest of what it needs while they
    run (the children's time and the imports overlap)."""

    __slots__ = ("tier", "gpus", "extra_reads", "check_ids", "wanted", "groups", "timeout_s", "nvml_child",
                 "ib_child", "sources")

    def load_checks(self) -> None:
        """Import the tier's check modules and samplers now (``run_checks`` would import them
        after collecting the children; a hook does it while they run)."""
        for cid in self.check_ids:
            checks.judge(CHECKS[cid])
            checks.sampler(CHECKS[cid])
        from .checks import probe_health  # noqa: F401

    def matches(self, tier: str, gpus: Optional[frozenset], extra_reads: Iterable[str]) -> bool:
        return (self.tier, self.gpus, self.extra_reads) == (tier, gpus, tuple(extra_reads))


def start_probes(config: Config, node: str, tier: str = DEFAULT_TIER, gpus: Optional[Iterable[int]] = None,
                 sources: Optional[NodeSources] = None, extra_reads: Iterable[str] = ()) -> Probes:
    """Start the children of ``tier``'s blocking probes (the same ones ``run_checks`` would
    start); pass the result to ``run_checks`` with the same tier, gpus and extra reads. An
    unknown extra read is a ValueError; setting up ``sources`` when none are given can raise."""
    probes = Probes()
    probes.tier, probes.extra_reads = tier, tuple(extra_reads)
    probes.gpus = None if gpus is None else frozenset(int(g) for g in gpus)
    probes.check_ids = [cid for cid in config.tier(tier) if cid in CHECKS]
    extra_sources, probes.groups = _extra_reads(probes.extra_reads)
    if sources is None:
        from .sources import node_sources

        sources = node_sources(config, node)
    probes.sources = sources
    probes.wanted = needs(probes.check_ids) | extra_sources
    probes.timeout_s = config.typed(GpuSettings).probe_timeout_s
    # Start the probes that can block together, then collect: their deadlines overlap.
    probes.nvml_child = probes.ib_child = None
    if "nvml" in probes.wanted:
        from .probes.nvml import start_nvml_probe

        probes.nvml_child = start_nvml_probe(sources.nvml, probes.timeout_s,
                                             nvml_features(probes.check_ids) | probes.groups, probes.gpus)
    if "ib" in probes.wanted:
        from .probes.ib_sysfs import start_ib_probe

        probes.ib_child = start_ib_probe(sources.sysfs_root, probes.timeout_s)
    return probes


def run_checks(config: Config, node: str, tier: str = DEFAULT_TIER, gpus: Optional[Iterable[int]] = None,
               sources: Optional[NodeSources] = None, now: Optional[float] = None,
               consumer: str = "hook", extra_reads: Iterable[str] = (), commit: bool = False,
               probes: Optional[Probes] = None) -> Report:
    """Run ``tier``'s checks for ``node``; ``gpus`` (NVML indices, e.g. SLURM_JOB_GPUS)
    restricts the GPU checks to those GPUs. ``consumer`` names who reads the kernel log ("hook",
    "cli"): each keeps its own cursor.

    ``extra_reads`` asks the same probe run for facts no check of the tier needs ("nvml",
    "nvml:<group>" of ``facts.NVML_READ_GROUPS``, "ib", "kernel"; e.g. ``BASELINE_READS``);
    they come back in ``Report.facts``. Nothing is saved unless ``commit`` is true or the caller
    calls ``Report.commit()``. Never raises for what it finds on the node; an unknown extra
    read is a ValueError, and setting up ``sources`` when none are given can raise (ProfileError
    for a bad simulator profile). ``probes``: the children ``start_probes`` started for this
    very tier, gpus and extra reads (a ValueError when they were started for others)."""
    started = time.monotonic()
    now = time.time() if now is None else now
    if probes is None:
        probes = start_probes(config, node, tier, gpus, sources, extra_reads)
    elif not probes.matches(tier, None if gpus is None else frozenset(int(g) for g in gpus), extra_reads):
        raise ValueError(f"probes started for tier {probes.tier!r}, gpus {probes.gpus}, reads {probes.extra_reads} "
                         f"collected for tier {tier!r}")
    sources = probes.sources
    check_ids, job_gpus, wanted = probes.check_ids, probes.gpus, probes.wanted
    nvml_child, ib_child = probes.nvml_child, probes.ib_child
    # The counter history is read while the children work (it does not depend on what they find).
    extra: List[Finding] = []
    samplers = [checks.sampler(CHECKS[cid]) for cid in check_ids if CHECKS[cid].samples]
    history_store, history = None, {}
    if samplers:
        history_store, history, problem = _load_history(config, sources.state_dir, node)
        if problem:
            extra.append(problem)
    nvml = ib = None
    if nvml_child is not None:
        from .probes.nvml import nvml_facts

        nvml = nvml_facts(nvml_child)
    # After NVML: a GPU in MIG mode is left out of dcgmi diag (checks/dcgm.py: diag_targets).
    dcgm = _run_dcgm(config, tier, job_gpus, nvml) if "dcgm" in wanted else None
    if ib_child is not None:
        from .probes.ib_sysfs import ib_facts

        ib = ib_facts(ib_child)

    ib_bandwidth = None
    if "perftest" in wanted:
        ib_bandwidth = _run_perftest(config, node, sources, ib)

    imex = None
    if "imex" in wanted and config.expected_hardware(node).get("imex_owned"):
        # IMEX is read only where the site says this tool owns it: no program runs elsewhere.
        from .probes.imex import probe_imex

        imex = probe_imex(sources.dev_root, probes.timeout_s, sources.programs_dir)

    kernel = None
    if "kernel" in wanted:
        from .probes.xid_events import probe_kernel_log

        kernel = probe_kernel_log(sources.kernel_log, sources.state_dir, node, tier, config,
                                  gpus=nvml.gpus if nvml is not None and nvml.status == "ok" else (), now=now,
                                  consumer=consumer)

    aer = None
    if "aer" in wanted:
        from .probes.aer_sysfs import aer_for_gpus

        aer = aer_for_gpus(sources.sysfs_root, nvml)

    inp = CheckInput(node=node, expected=config.expected_hardware(node), thresholds=config.section("thresholds"),
                     actions=config.section("actions"), nvml=nvml, ib=ib, dcgm=dcgm, kernel=kernel, history=history,
                     now=now, gpus=job_gpus, tier=tier, ib_bandwidth=ib_bandwidth, aer=aer, imex=imex)
    from .checks.probe_health import probe_findings

    findings = probe_findings(inp) + extra
    for cid in check_ids:
        try:
            findings.extend(checks.judge(CHECKS[cid])(inp))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            findings.append(inp.finding("check.error", "error", f"check {cid} failed: {type(exc).__name__}: {exc}",
                                        evidence={"check": cid}))
    pending: List[Callable[[], Optional[Finding]]] = []
    if kernel is not None and kernel.read is not None:
        pending.append(lambda: _commit_kernel_log(kernel, inp))
    if history_store is not None:
        samples, problem = _samples(samplers, inp)
        if problem:
            findings.append(problem)
        elif samples:
            pending.append(lambda: _save_history(history_store, samples, inp))

    findings = [f for f in findings if f.status != "ok"]
    report = Report(node=node, status=worst_status(findings), findings=findings,
                    duration_ms=int((time.monotonic() - started) * 1000), tier=tier,
                    facts=RunFacts(nvml=nvml, ib=ib, dcgm=dcgm, kernel=kernel, history=dict(history),
                                   ib_bandwidth=ib_bandwidth, aer=aer, imex=imex),
                    pending=pending)
    if commit:
        report.add(report.commit())
    return report


def _extra_reads(reads: Iterable[str]):
    """("nvml:ecc", "ib") -> ({"nvml", "ib"}, {"ecc"}); anything else is a ValueError."""
    sources, groups = set(), set()
    for read in reads:
        source, _, group = read.partition(":")
        if source not in ("nvml", "ib", "kernel") or (group and (source != "nvml" or group not in NVML_READ_GROUPS)):
            raise ValueError(f"unknown extra read {read!r}: nvml, nvml:<{'|'.join(NVML_READ_GROUPS)}>, ib or kernel")
        sources.add(source)
        if group:
            groups.add(group)
    return frozenset(sources), frozenset(groups)


def _commit_kernel_log(kernel, inp: CheckInput) -> Optional[Finding]:
    from .kernellog.api import KernelLogError

    try:
        kernel.read.commit()
    except KernelLogError as exc:
        return inp.finding("probe.error", "error", f"kernel-log cursor not saved, the same lines are read again: {exc}",
                           evidence={"source": kernel.source})
    return None


def _run_dcgm(config: Config, tier: str, gpus: Optional[frozenset], nvml=None) -> DcgmFacts:
    from .checks.dcgm import diag_targets, skip_message
    from .probes.dcgm_diag import probe_dcgm

    dcgm = config.typed(DcgmSettings)
    level = dcgm.levels.get(tier, 1)
    known = nvml.gpus if nvml is not None and nvml.status == "ok" else []
    run_on, skipped = diag_targets(known, gpus)
    if skipped and not run_on:
        return DcgmFacts(status="skipped", level=level, timeout_s=dcgm.timeout_s, message=skip_message(skipped),
                         skipped_gpus=skipped)
    facts = probe_dcgm(dcgm.dcgmi, level, dcgm.timeout_s, run_on)
    if skipped:
        facts.skipped_gpus = skipped
        facts.message = "; ".join(m for m in (facts.message, skip_message(skipped)) if m)
    return facts


def _run_perftest(config: Config, node: str, sources: NodeSources, ib):
    """ib_write_bw between the ports the node is expected to have (all it has when nothing is
    expected); none when the IB probe itself failed (probe.timeout/probe.error say so)."""
    from .facts import IbBandwidthFacts
    from .probes.perftest import probe_ib_bandwidth

    if ib is None or ib.status != "ok":
        return IbBandwidthFacts(status="error", message="IB ports unknown (the sysfs probe failed)")
    expected = config.expected_hardware(node)
    wanted = expected.get("ib_ports")
    ports = ib.ports
    if wanted is not None:
        names = {(h, int(n or 1)) for h, _, n in (str(t).partition(":") for t in wanted)}
        ports = [p for p in ports if (p.hca, p.port) in names]
    return probe_ib_bandwidth(ports, config.typed(PerftestSettings), sources.programs_dir,
                              expected.get("roce_gid_index"))


def _load_history(config: Config, state_dir: str, node: str):
    from .counters.history import CounterHistory

    try:
        store = CounterHistory(state_dir, node)
        return store, store.load(), None
    except (OSError, ValueError) as exc:
        return None, {}, Finding(check="probe.error", status="error", action=config.action("probe.error"),
                                 message=f"counter history unusable, growth not judged: {_os_text(exc)}",
                                 evidence={"state_dir": state_dir})


def _samples(samplers, inp: CheckInput):
    """This run's counter samples, ({key: (value, window_s)}, None), or ({}, a finding)."""
    samples: Dict[str, Any] = {}
    try:
        for sampler in samplers:
            samples.update(sampler(inp))
    except Exception as exc:  # noqa: BLE001 - a broken sampler is a bug here, not a node fault
        return {}, inp.finding("check.error", "error", f"counter samples not taken: {type(exc).__name__}: {exc}")
    return samples, None


def _save_history(store, samples: Dict[str, Any], inp: CheckInput) -> Optional[Finding]:
    try:
        store.record(samples, inp.now)
    except (OSError, ValueError, OverflowError) as exc:   # OverflowError: a counter beyond a float
        return inp.finding("probe.error", "error", f"counter history not saved: {_os_text(exc)}",
                           evidence={"path": store.path})
    return None


def _os_text(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror}"
    return str(exc)
