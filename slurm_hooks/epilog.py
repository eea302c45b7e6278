"""``slurm-gpu-epilog``: serves both Epilog (slurmd, per node) and EpilogSlurmctld (once
per job, inside slurmctld), told apart by SLURM_SCRIPT_CONTEXT.

Node epilog: gather the job's evidence on this node (kernel-log events since the prolog's cursor,
counter growth against the prolog's baseline, the GPUs' and links' health now; for a job that
FAILED, when ``[records] gpu_oom_from_job_output`` is on, the tail of its own output read as its
user for a GPU out-of-memory message), classify the
ending (``healthcheck.records.classify``), write the (job, node) record, drain the node when the
hardware is bad, and queue an AdminComment entry when this node has something to say.

EpilogSlurmctld (no SLURMD_NODENAME, no GPU variables): classifies from Slurm's view alone and
writes the job-level entry (node "*"), so every job gets a class in accounting, also a NODE_FAIL
job whose node epilog only runs when its slurmd comes back.

The epilog exits 0: a bad node is drained with our own reason (a non-zero exit would only say
"Epilog error"), and the tool's own problems never drain a node. The one exception is opt-in:
with ``[records] expedite_on_hardware`` the node epilog exits 1 after a hardware fault on one of
the job's own GPUs, for Slurm 25.11's expedited requeue (``healthcheck/records/expedite.py``).
"""
from __future__ import annotations

import os
import sys
import time
TYPE_CHECKING = False       # typing.TYPE_CHECKING without importing typing (2 ms) before main
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence

CONTEXT_SLURMD = "epilog_slurmd"
CONTEXT_SLURMCTLD = "epilog_slurmctld"


def hook_identity(env=os.environ):
    context = env.get("SLURM_SCRIPT_CONTEXT", CONTEXT_SLURMD)
    if context == CONTEXT_SLURMCTLD:
        return "epilog_slurmctld", "slurmctld"
    from healthcheck.config import node_name

    return "epilog", node_name(None, env)


EXAMPLE = ("SLURMD_NODENAME=gpu1 SLURM_JOB_ID=42 SLURM_SCRIPT_CONTEXT=epilog_slurmd slurm-gpu-epilog   "
           "# after job 42")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hooklib.nogc import short_process

    with short_process():      # before the imports: a hook is one short process
        from healthcheck.hooklib.skeleton import ADMIN_HELP, serve

        return serve("epilog", argv, _body, doc=ADMIN_HELP, example=EXAMPLE, start=_start,
                     deadline=_deadline, on_watchdog=_stopped_by_watchdog,
                     on_error=_tool_error)


def _deadline(config) -> float:
    from healthcheck.config.settings import RecordsSettings

    return config.typed(RecordsSettings).epilog_deadline_s


def _start(argv):
    from healthcheck.hooklib.skeleton import start

    hook, node = hook_identity(os.environ)
    return start("epilog", os.environ, hook=hook, node=node, context=os.environ.get("SLURM_SCRIPT_CONTEXT"))


def _body(run):
    from healthcheck.hooklib.skeleton import Ending

    if run.hook == "epilog_slurmctld":
        result = run_epilog_slurmctld(run.config, os.environ)
    else:
        result = run_epilog(run.config, run.node, os.environ)
    # A drain is already done with our reason; a non-zero exit would only add "Epilog error",
    # unless the admin asked for it: Slurm 25.11's expedited requeue ([records] expedite_on_hardware).
    return Ending(1 if result.get("expedite") else 0, dict(result, exit_code2=os.environ.get("SLURM_JOB_EXIT_CODE2")))


def _stopped_by_watchdog(run, deadline: float, where: str):
    """Whatever was written (the record, the queued entry, a drain) stays; the rest is not done."""
    from healthcheck.hooklib.skeleton import Ending
    from healthcheck.hooklib.watchdog import done_so_far, progress

    done, kept = progress(), done_so_far("nothing written yet")
    print(f"slurm-gpu-{run.hook}: {run.node}: job {run.job_id}: the run took longer than {deadline:g} s ([records] "
          f"epilog_deadline_s) and was stopped at {where or 'an unknown step'}; kept: {kept}", file=sys.stderr)
    return Ending(0, {"result": "watchdog", "at": where, "done": done})


def _tool_error(run, exc: Exception):
    """The tool being broken never fails the node."""
    from healthcheck.hooklib.skeleton import Ending

    print(f"slurm-gpu-{run.hook}: internal error, job {run.job_id} not classified: {type(exc).__name__}: {exc}",
          file=sys.stderr)
    return Ending(0, {"result": "tool-error", "error": f"{type(exc).__name__}: {exc}"})


# -- shared ---------------------------------------------------------------------------------------

def _slurm_view(backend, job_id: str, env: Mapping[str, str]):
    """Slurm's view from scontrol and squeue (reliable from the epilog; sacct is racy there),
    else env only. State fields the backend could not read trustworthily are absent, never
    guessed (``CliBackend.job``); what was missing goes into the record as its problem."""
    from healthcheck.records.classify import SlurmView

    from healthcheck.slurm import SlurmError

    try:
        job = backend.job(job_id)
    except SlurmError as exc:
        return SlurmView.from_scontrol({}, env), {}, f"scontrol: {exc}"
    fields = job.fields if job is not None else {}
    problem = (job.problem or None) if job is not None else "scontrol: no such job"
    return SlurmView.from_scontrol(fields, env), fields, problem


def _record(config, job_id: str, node: str, result, fields: Mapping[str, str], problem: Optional[str],
            env: Mapping[str, str], now: float, started: Optional[float], wanted: bool, **more) -> Dict[str, Any]:
    """The record of how ``job_id`` ended on ``node`` (docs/job-classes.md has its keys): the one
    builder for both contexts; ``more`` is what only one of them knows (``nodes``, ``gpus``, ...)."""
    from healthcheck.records import store

    record: Dict[str, Any] = {
        "job_id": job_id, "node": node, "class": result.cls, "slurm_class": result.slurm.cls,
        "slurm_why": result.slurm.why, "exit": result.slurm.exit, "signal": result.slurm.signal,
        "cause": result.cause, "evidence": result.evidence, "ended_at": now, "started_at": started,
        "elapsed_s": None if started is None else max(0, int(now - started)),
        "slurm": {k: fields.get(k) for k in ("JobState", "Reason", "ExitCode", "PreemptTime", "Restarts")},
        **more}
    record.update(store.run_of(env, fields, requeued=result.slurm.cls == "REQUEUED", started_at=started,
                               previous=store.read_record(config.state_dir, job_id, node)))
    if problem:
        record["problem"] = problem
    if not result.slurm.settled:
        record["slurm_settled"] = False        # the delivery settles it by accounting (records/settle.py)
    if wanted:
        record["entry_wanted"] = True
    return record


def _queue_and_deliver(config, record: Dict[str, Any], backend) -> str:
    from healthcheck.config.settings import RecordsSettings
    from healthcheck.records import outbox

    from .delivery import deliver, deliver_in_background, report_lines

    job_id = record["job_id"]
    try:
        outbox.queue_record(config.state_dir, record)
        _note("entry", "queued")
    except OSError as exc:
        # Nowhere to keep it (a full or read-only state dir): said; the record on disk wants its
        # entry (entry_wanted), so a later delivery queues it once space returns (requeue_missing).
        print(f"slurm-gpu-epilog: job {job_id}: accounting entry not queued (queued later from the record): "
              f"{exc}", file=sys.stderr)
        return f"not queued: {exc.strerror or exc}"
    if config.typed(RecordsSettings).delivery == "inline":
        report = deliver(config, backend)
        for line in report_lines(report):
            if not line.startswith("accounting unreachable"):
                print(f"slurm-gpu-epilog: job {job_id}: delivery: {line}", file=sys.stderr)
        if report.error:
            return f"queued (accounting: {report.error})"
        return "delivered" if job_id in report.delivered else "queued"
    deliver_in_background(config, rescan=True)
    return "queued, delivering in background"


def _record_not_kept(config, record: Dict[str, Any], backend, exc: OSError, who: str, cls: str,
                     wanted: bool) -> Dict[str, str]:
    """A full or read-only state dir cannot keep the record (nor queue its entry: the queue holds a
    reference to the record): said on stderr, and the entry, when ``wanted``, goes to accounting
    at once instead."""
    print(f"slurm-gpu-epilog: {who}: record not saved ({cls}): {exc}", file=sys.stderr)
    out = {"record": f"not saved: {exc.strerror or exc}"}
    if wanted:
        out.update(_deliver_unkept(config, record, backend))
    return out


# A record the state dir cannot keep: how long its entry is tried (in accounting, and the record
# on disk again), at most, within the run's deadline, and how far apart the tries are.
UNKEPT_TRY_FOR_S = 40.0
UNKEPT_RETRY_S = 5.0


def _deliver_unkept(config, record: Dict[str, Any], backend, sleep=time.sleep) -> Dict[str, str]:
    """The entry of a record the state dir could not keep, written to accounting at once, as the
    queue writes (read, merge, write, verify). When that fails (the job not in accounting yet: its
    start still in slurmctld's queue for a slurmdbd that has just come back; or slurmdbd down),
    the record is written to the state dir again (space may be back: then its entry is queued as
    usual) and the entry to accounting again, every UNKEPT_RETRY_S, for UNKEPT_TRY_FOR_S within
    the run's deadline. Only then is it lost: said on stderr and in the journal. The 2-hour soak
    lost 6 entries when a full state disk met a slurmdbd just back (docs/reliability.md)."""
    from healthcheck.records import store
    from healthcheck.records.outbox import DeliverySettings, write_entries
    from healthcheck.safeio import run_deadline
    from healthcheck.slurm.backend import SlurmError
    from healthcheck.slurm.job_accounting import SlurmAccounting

    job_id = str(record["job_id"])
    settings = DeliverySettings.from_config(config)
    until = time.monotonic() + run_deadline.within(UNKEPT_TRY_FOR_S)
    while True:
        try:
            written = write_entries(SlurmAccounting(backend), job_id, [store.entry_for(record)], settings)
            problem = "" if written.delivered else (written.reason or "not delivered")
        except SlurmError as exc:
            problem = str(exc)
        if not problem:
            _note("entry", "delivered at once")
            return {"accounting": "delivered at once (record not kept)"}
        if time.monotonic() + UNKEPT_RETRY_S >= until:
            break
        sleep(UNKEPT_RETRY_S)
        try:
            store.write_record(config.state_dir, record)
        except OSError:
            continue
        _note("record", "written")
        return {"record": "saved on a later try", "accounting": _queue_and_deliver(config, record, backend)}
    print(f"slurm-gpu-epilog: job {job_id}: accounting entry lost: the record could not be kept and "
          f"writing it at once failed: {problem}", file=sys.stderr)
    return {"accounting": f"lost: {problem}"}


# -- EpilogSlurmctld ------------------------------------------------------------------------------

def run_epilog_slurmctld(config, env: Mapping[str, str]) -> Dict[str, Any]:
    from healthcheck.config.settings import RecordsSettings
    from healthcheck.records import store
    from healthcheck.records.classify import classify
    from healthcheck.slurm.backend import assigned_nodes, local_epoch

    from .delivery import backend_for

    job_id = store.job_id_ok(env.get("SLURM_JOB_ID", ""))
    backend = backend_for(config)
    view, fields, problem = _slurm_view(backend, job_id, env)
    result = classify(view, [])
    # The job's nodes: scontrol's NodeList first, since EpilogSlurmctld's SLURM_JOB_NODELIST is the
    # leader's for every component of a heterogeneous job (measured on 22.05: 1234+1 on gpu2 said gpu1).
    nodes = assigned_nodes(fields.get("NodeList")) or env.get("SLURM_JOB_NODELIST")
    record = _record(config, job_id, store.JOB_LEVEL, result, fields, problem, env, time.time(),
                     local_epoch(fields.get("StartTime", "")), config.typed(RecordsSettings).accounting,
                     nodes=nodes, context=CONTEXT_SLURMCTLD)
    accounting = config.typed(RecordsSettings).accounting
    try:
        store.write_record(config.state_dir, record)
    except OSError as exc:
        out = {"result": "classified", "class": result.cls,
               **_record_not_kept(config, record, backend, exc, f"job {job_id}", result.cls, accounting)}
        out.setdefault("accounting", "off")
        return out
    _note("record", "written")
    delivery = "off"
    if accounting:
        delivery = _queue_and_deliver(config, record, backend)
    return {"result": "classified", "class": result.cls, "accounting": delivery}


# -- the node epilog ------------------------------------------------------------------------------

def run_epilog(config, node: str, env: Mapping[str, str]) -> Dict[str, Any]:
    from healthcheck.config.settings import HealthSettings, RecordsSettings
    from healthcheck.records import store
    from healthcheck.runner import BASELINE_READS, run_checks, start_probes
    from healthcheck.sources import node_sources

    from .gpumap import mig_uuids, parse_gpu_list

    job_id = store.job_id_ok(env.get("SLURM_JOB_ID", ""))
    now = time.time()
    baseline = store.read_baseline(config.state_dir, job_id, node)
    gres = None if mig_uuids(env.get("SLURM_JOB_GPUS")) else parse_gpu_list(env.get("SLURM_JOB_GPUS"))
    # Without the prolog's baseline a MIG job's GRES indices say nothing of its GPUs (they index
    # Slurm's list of MIG devices): its GPUs are unknown, and every Xid of the job's time counts.
    mig_job = bool(mig_uuids(env.get("CUDA_VISIBLE_DEVICES"), env.get("SLURM_JOB_GPUS")))
    job_gpus: Optional[List[int]] = baseline.get("gpus") if baseline else (None if mig_job else gres)
    # The probes' children start first; Slurm's view of the job is asked for while they run.
    sources = node_sources(config, node)
    probe_gpus = job_gpus if job_gpus is not None else []
    probes = start_probes(config, node, "prolog", probe_gpus, sources, BASELINE_READS)
    probes.load_checks()
    from healthcheck.findings import without_timeout_drains
    from healthcheck.records.classify import application_could_replace, classify
    from healthcheck.slurm.backend import local_epoch

    from . import evidence as ev
    from .delivery import backend_for
    from .drain import drain_for

    backend = backend_for(config)
    view, fields, problem = _slurm_view(backend, job_id, env)
    started = (baseline or {}).get("started_at") or local_epoch(fields.get("StartTime", ""))

    report = run_checks(config, node, "prolog", gpus=probe_gpus, sources=sources, now=now,
                        extra_reads=BASELINE_READS, probes=probes)
    without_timeout_drains(report.findings, config.typed(HealthSettings).drain_on_probe_timeout)
    for finding in report.findings:
        if finding.status == "error" and finding.action != "drain":
            print(f"slurm-gpu-epilog: {node}: {finding.check}: {finding.message}", file=sys.stderr)
    items = [ev.finding_evidence(f) for f in report.findings]
    facts = report.facts
    gpus_facts = (baseline or {}).get("gpu_facts") or \
        [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id} for g in (facts.nvml.gpus if facts.nvml is not None else [])]
    kernel = ev.kernel_evidence(config, sources, node, job_id, baseline, job_gpus, gpus_facts, started, now)
    items.extend(kernel["events"])
    if baseline and baseline.get("counters"):
        after = ev.counters_from_facts(facts.nvml, facts.ib)
        items.extend(ev.counter_evidence(baseline["counters"], after))

    result = classify(view, items)
    job_output = None
    if config.typed(RecordsSettings).gpu_oom_from_job_output and application_could_replace(result.cls):
        # Only a plain FAILED can become GPU_OOM (job-classes.toml): no other ending costs a read.
        job_output = ev.job_output_evidence(config, node, fields, env)
        if job_output["events"]:
            items.extend(job_output["events"])
            result = classify(view, items)
    speaks = _has_something_to_say(result) if config.typed(RecordsSettings).node_entries == "evidence" else True
    record = _record(config, job_id, node, result, fields, problem, env, now, started,
                     config.typed(RecordsSettings).accounting and speaks, gpus=job_gpus, gres=gres,
                     kernel_source=kernel["source"], context=CONTEXT_SLURMD, baseline=bool(baseline))
    if baseline and baseline.get("mig_devices"):
        # The MIG devices the job ran on, each with its parent GPU (the prolog's mapping): the
        # GPU findings and Xids above are the parents', which every instance on them shares.
        record["mig_devices"] = baseline["mig_devices"]
    if kernel.get("error"):
        record["kernel_error"] = kernel["error"]
        print(f"slurm-gpu-epilog: {node}: job {job_id}: kernel log unreadable, no Xid evidence: {kernel['error']}",
              file=sys.stderr)
    if job_output is not None:
        record["job_output"] = {k: v for k, v in job_output.items() if k != "events"}
        if job_output.get("problem"):
            print(f"slurm-gpu-epilog: {node}: job {job_id}: output not read, no GPU OOM evidence: "
                  f"{job_output['problem']}", file=sys.stderr)
    out: Dict[str, Any] = {"result": "classified", "class": result.cls}
    try:
        store.write_record(config.state_dir, record)
        _note("record", "written")
        store.note_ending(config.state_dir, node, job_id, now)
    except OSError as exc:
        # The drain of a bad node below happens all the same.
        out.update(_record_not_kept(config, record, backend, exc, f"{node}: job {job_id}", result.cls,
                                    bool(record.get("entry_wanted"))))
    # Drain with our reason when a finding or a job-window Xid says so (the health check's rules).
    drain = drain_for(config, backend, node, report.findings, kernel["events"], by="epilog", sources=sources)
    if drain:
        out["drained"] = drain
    from healthcheck.records.expedite import expedite

    if expedite(config.typed(RecordsSettings).expedite_on_hardware, result.cls, result.cause, job_gpus):
        out["expedite"] = True
        print(f"slurm-gpu-epilog: {node}: job {job_id}: {result.cls} on its GPU {result.cause.get('gpu')}: exit 1 "
              "for an expedited requeue ([records] expedite_on_hardware)", file=sys.stderr)
    if record.get("entry_wanted") and "record" not in out:
        out["accounting"] = _queue_and_deliver(config, record, backend)
    elif config.typed(RecordsSettings).accounting:
        from .delivery import deliver_in_background

        deliver_in_background(config, rescan=True)     # anything an earlier run left queued, or unqueued
    return out


def _note(step: str, state: str) -> None:
    from healthcheck.hooklib.watchdog import note

    note(step, state)


def _has_something_to_say(result) -> bool:
    """A node writes its own entry for a hardware cause, or any Xid during the job (an
    application's Xid 13 is worth seeing next to its FAILED); warnings stay in the record."""
    return result.cause is not None or any(item.get("kind") == "xid" for item in result.evidence)


if __name__ == "__main__":
    sys.exit(main())
