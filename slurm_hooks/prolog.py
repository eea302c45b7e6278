"""``slurm-gpu-prolog``: Slurm's Prolog (run by slurmd on every allocated node, PrologFlags=Alloc).

Runs the ``prolog`` tier once, on the node's GPUs and links; maps the job's GRES indices to NVML
indices through the device files' minor numbers (``slurm_hooks.gpumap``) and judges the job's
GPUs and the node-wide findings only: a fault on a GPU the job was not given does not stop the
job (the health check deals with it). On a bad GPU or link: drain the node with our reason, then
exit 1 so Slurm requeues, holds or cancels the job as it is configured to (a reason set before
the non-zero exit survives; a bare exit 1 would only say "Prolog error"). When the drain budget
(``[health] budget_*``) refuses the drain, exit 0: Slurm would drain on the non-zero exit anyway.

From the same run it records the job's baseline (GPUs, UUIDs, PCI addresses, counters, start
time, a kernel-log cursor) for the epilog.

When the tool itself is broken (a config it cannot read, a bug): exit 0 and one loud line, or
exit 1 with ``[prolog] on_tool_error = "fail"``. A broken tool must not drain a cluster.

Import path: no click, no jinja2 (the prolog runs before every job on every node).
"""
from __future__ import annotations

import os
import sys
import time
TYPE_CHECKING = False       # typing.TYPE_CHECKING without importing typing (2 ms) before main
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence


# Where Slurm's own packages put slurm.conf (and gres.conf beside it), when neither the hook's
# SLURM_CONF nor [slurm] conf says.
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
EXAMPLE = "SLURMD_NODENAME=gpu1 SLURM_JOB_ID=42 SLURM_JOB_GPUS=0,1 slurm-gpu-prolog   # what slurmd runs before job 42"


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hooklib.nogc import short_process

    with short_process():      # before the imports: a hook is one short process
        from healthcheck.hooklib.skeleton import ADMIN_HELP, serve

        return serve("prolog", argv, _body, doc=ADMIN_HELP, example=EXAMPLE, start=_start,
                     deadline=_deadline, on_watchdog=_stopped_by_watchdog, on_error=_tool_error)


def _deadline(config) -> float:
    from healthcheck.config.settings import PrologSettings

    return config.typed(PrologSettings).deadline_s


def _start(argv):
    from healthcheck.hooklib.skeleton import start

    return start("prolog", os.environ, context=os.environ.get("SLURM_SCRIPT_CONTEXT"),
                 gpus=os.environ.get("SLURM_JOB_GPUS"))


def _body(run):
    from healthcheck.hooklib.skeleton import Ending

    result = run_prolog(run.config, run.node, os.environ)
    return Ending(1 if result["result"] == "bad-node" else 0, result)


def _tool_error(run, exc: Exception):
    """The tool is broken (not the node): the job runs unchecked, or stops with
    ``[prolog] on_tool_error = "fail"``."""
    from healthcheck.config.settings import PrologSettings
    from healthcheck.hooklib.skeleton import Ending

    fail = run.config.typed(PrologSettings).on_tool_error == "fail"
    print(f"slurm-gpu-prolog: internal error on {run.node}, job {run.job_id} "
          f"{'stopped' if fail else 'runs unchecked'}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return Ending(1 if fail else 0, {"result": "tool-error", "error": f"{type(exc).__name__}: {exc}"})


def _stopped_by_watchdog(run, deadline: float, where: str):
    """The run passed ``[prolog] deadline_s``. A drain already under way (applied, or in flight:
    scontrol may have taken it) means the checks found the node bad: the job must not start
    there, exit 1 as the run would have. Otherwise the job runs unchecked (``on_tool_error``)."""
    from healthcheck.config.settings import PrologSettings
    from healthcheck.hooklib.skeleton import Ending
    from healthcheck.hooklib.watchdog import progress

    done = progress()
    drain = done.get("drain") if done.get("drain") != "undone" else None   # the budget undid it: may run
    fail = drain is not None or run.config.typed(PrologSettings).on_tool_error == "fail"
    if drain is not None:
        outcome = f"stopped: the node's drain was {drain} before that"
    else:
        outcome = "stopped unchecked" if fail else "runs unchecked"
    print(f"slurm-gpu-prolog: {run.node}: job {run.job_id}: the run took longer than {deadline:g} s ([prolog] "
          f"deadline_s) and was stopped at {where or 'an unknown step'}; the job {outcome}", file=sys.stderr)
    return Ending(1 if fail else 0, {"result": "watchdog", "at": where, "done": done, "exit": 1 if fail else 0})


def _gres_conf_mig_devices(config, env: Mapping[str, str], node: str, gres: List[int],
                           gpus: List[Any]) -> List[Dict[str, Any]]:
    """The job's MIG devices as the node's gres.conf lists them (beside slurm.conf, whose Gres=
    orders them) and the driver numbers their capabilities (``<proc>/driver/nvidia-caps/
    mig-minors``): gpumap's ``mig_from_gres``. [] when gres.conf does not list them."""
    from healthcheck.config.settings import SlurmSettings
    from healthcheck.sources import node_paths

    from .gpumap import (MAX_CONFIG_BYTES, gres_gpu_types, gres_mig_files, mig_cap_minors, mig_devices_of,
                         mig_from_gres)

    slurm_conf = env.get("SLURM_CONF") or config.typed(SlurmSettings).conf or DEFAULT_SLURM_CONF
    texts = []
    for path in (slurm_conf, os.path.join(os.path.dirname(slurm_conf), "gres.conf"),
                 os.path.join(node_paths(config, node)[1], "driver", "nvidia-caps", "mig-minors")):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read(MAX_CONFIG_BYTES))
        except OSError:
            texts.append("")
    types = gres_gpu_types(texts[0], node)
    listed = gres_mig_files(texts[1], node, types) if types is not None else []
    if not listed:
        return []
    return mig_from_gres(gres, [mig_devices_of(files) for files in listed], mig_cap_minors(texts[2]), gpus)


def run_prolog(config, node: str, env: Mapping[str, str]) -> Dict[str, Any]:
    from healthcheck.config.settings import HealthSettings, PrologSettings, RecordsSettings
    from healthcheck.records import store
    from healthcheck.runner import BASELINE_READS, run_checks, start_probes
    from healthcheck.sources import node_sources

    from .gpumap import device_minors, devices_dir, gres_to_nvml, has_mig, mig_to_parents, mig_uuids, parse_gpu_list

    job_id = store.job_id_ok(env.get("SLURM_JOB_ID", ""))
    now = time.time()
    # The job's MIG devices by UUID (CUDA_VISIBLE_DEVICES on a node with MIG GRES types).
    migs = mig_uuids(env.get("CUDA_VISIBLE_DEVICES"), env.get("SLURM_JOB_GPUS"))
    gres = None if mig_uuids(env.get("SLURM_JOB_GPUS")) else parse_gpu_list(env.get("SLURM_JOB_GPUS"))
    sources = node_sources(config, node)
    # All GPUs are probed (the minor numbers that map the job's GPUs come from the same run);
    # only the job's GPUs and node-wide findings are judged. The probes' children start first:
    # what the rest of the prolog loads and reads is done while they run.
    probes = start_probes(config, node, "prolog", None, sources, BASELINE_READS)
    _while_probing(config, probes)
    devices = device_minors(devices_dir(config.typed(PrologSettings).gpu_devices, node))
    from healthcheck.findings import without_timeout_drains

    from . import evidence as ev

    report = run_checks(config, node, "prolog", gpus=None, sources=sources, now=now, extra_reads=BASELINE_READS,
                        probes=probes)
    without_timeout_drains(report.findings, config.typed(HealthSettings).drain_on_probe_timeout)
    facts = report.facts
    nvml_gpus = list(facts.nvml.gpus) if facts.nvml is not None else []
    minors = {g.index: g.minor_number for g in nvml_gpus}
    instances: List[Dict[str, Any]] = []
    if migs:
        # A MIG device's health is its parent GPU's: the parents are the job's GPUs.
        job_gpus, instances, how = mig_to_parents(migs, nvml_gpus)
    elif gres is None:
        job_gpus, how = [], "no GPUs"
    elif has_mig(nvml_gpus):
        # GRES indices on a MIG node index Slurm's list of MIG devices, not the nvidiaN files:
        # without the MIG devices' UUIDs, every GPU is judged (when in doubt, the job's are).
        # Where gres.conf lists the MIG devices, the indices still name them for the record.
        job_gpus, how = [g.index for g in nvml_gpus], "all GPUs (a MIG node; the job's MIG devices not named by UUID)"
        try:
            instances = _gres_conf_mig_devices(config, env, node, gres, nvml_gpus)
        except Exception as exc:  # noqa: BLE001 - the names are the record's; the GPUs are judged all the same
            print(f"slurm-gpu-prolog: {node}: the job's MIG devices not named from gres.conf: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        if instances:
            how = "all GPUs (a MIG node; the job's MIG devices by GRES index from gres.conf)"
    else:
        job_gpus, how = gres_to_nvml(gres, devices, minors)
    mine = set(job_gpus)
    judged = [f for f in report.findings if f.gpu is None or f.gpu in mine]
    bad = _drain_findings(judged)      # a timeout only when the config says so
    tool_problems = [f for f in judged if f.status == "error" and f.action != "drain"]
    for finding in tool_problems:
        print(f"slurm-gpu-prolog: {node}: {finding.check}: {finding.message}", file=sys.stderr)

    baseline = {
        "started_at": now, "gres": gres, "gpus": job_gpus, "mapping": how, "mig_devices": instances,
        # Every GPU's identity: the epilog maps each Xid line's PCI address to its GPU.
        "gpu_facts": [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
                       "minor_number": g.minor_number} for g in nvml_gpus],
        "counters": {k: v for k, v in ev.counters_from_facts(facts.nvml, facts.ib).items()
                     if not (k.startswith("gpu") and k[3:].isdigit() and int(k[3:]) not in mine)},
        "kernel_consumer": ev.place_kernel_cursor(config, sources, node, job_id),
        "findings": [ev.finding_evidence(f) for f in judged],
    }
    result: Dict[str, Any] = {"result": "ok", "job_gpus": job_gpus, "mapping": how,
                              "duration_ms": report.duration_ms}
    if instances:
        result["job_mig_devices"] = instances
    if baseline["kernel_consumer"] is None:
        print(f"slurm-gpu-prolog: {node}: job {job_id}: kernel log unreadable ({sources.kernel_log}) or its "
              "cursor not saved: the epilog will judge this job's Xids by their time stamps", file=sys.stderr)
        result["kernel_log"] = "unreadable"
    try:
        store.write_baseline(config.state_dir, job_id, node, baseline)
    except OSError as exc:
        # A full or read-only state dir loses the baseline (the epilog then judges without it),
        # never the decision: a bad GPU still stops the job and drains the node.
        print(f"slurm-gpu-prolog: {node}: job {job_id}: baseline not saved: {exc}", file=sys.stderr)
        result["baseline"] = f"not saved: {exc.strerror or exc}"
    if not bad:
        # Only what this prolog judged: the job's GPUs and the node-wide checks (late evidence).
        try:
            store.note_clean_run(config.state_dir, node, judged, job_gpus, now)
        except OSError as exc:
            print(f"slurm-gpu-prolog: {node}: clean run not noted: {exc}", file=sys.stderr)
        _deliver_queued(config)
        return result

    from healthcheck.records.late import amend_recent_jobs
    from healthcheck.hooklib.watchdog import note

    from healthcheck.actions.gate import BUDGET_RULE

    from .delivery import backend_for
    from .drain import drain_or_refuse

    items = [ev.finding_evidence(f) for f in bad]
    result.update(result="bad-node", findings=[f"{f.check} {f.message}" for f in bad])
    drained, rule = drain_or_refuse(config, backend_for(config), node, bad, [], by="prolog", sources=sources)
    if drained:
        note("drain", "applied")           # ours already (another hook's drain): the job stays stopped
        result["drained"] = drained
    elif rule == BUDGET_RULE:
        # A non-zero exit would drain the node anyway ("Prolog error"): the budget, a circuit
        # breaker against a fault everywhere, lets the job run; its epilog records the evidence.
        result["result"] = "bad-node-over-budget"
        print(f"slurm-gpu-prolog: {node}: job {job_id} runs on a node the checks call bad: "
              f"the drain budget is spent", file=sys.stderr)
    records = config.typed(RecordsSettings)
    try:
        amended = amend_recent_jobs(config.state_dir, node, items, now, records.late_evidence_window_s,
                                    queue=records.accounting)
    except OSError as exc:              # a full or read-only state dir: the drain above stands
        print(f"slurm-gpu-prolog: {node}: late evidence not recorded: {exc}", file=sys.stderr)
        amended = []
    if amended:
        result["amended_jobs"] = [r["job_id"] for r in amended]
    _deliver_queued(config)
    return result


def _while_probing(config, probes) -> None:
    """What a healthy prolog loads after its checks, loaded while the probes' children run:
    the tier's check modules, the kernel-log cursor, the outbox's delivery (only what the
    healthy path uses: tests/test_job_hooks.py holds it)."""
    from healthcheck.config.settings import RecordsSettings

    probes.load_checks()
    import healthcheck.kernellog.cursor  # noqa: F401  (the job's kernel-log cursor)

    if config.typed(RecordsSettings).accounting:
        from . import delivery  # noqa: F401


def _drain_findings(judged) -> list:
    """The judged findings that drain; a healthy job's prolog has none to judge and does not
    load the Actions layer for them."""
    if not judged:
        return []
    from healthcheck.actions.cause import is_drain_finding

    return [f for f in judged if is_drain_finding(f)]


def _deliver_queued(config) -> None:
    """Entries an earlier run could not deliver (accounting was down) go out now, detached."""
    from healthcheck.config.settings import RecordsSettings
    if config.typed(RecordsSettings).accounting:
        from .delivery import deliver_in_background

        deliver_in_background(config)


if __name__ == "__main__":
    sys.exit(main())
