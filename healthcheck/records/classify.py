"""How a job ended: a pure function of Slurm's view at epilog time and the node's evidence.

Inputs (no I/O here):

* ``SlurmView``: what ``scontrol show job`` says from inside the Epilog (JobState is COMPLETING
  except for NODE_FAIL; Reason, ExitCode, PreemptTime, Restarts, EndTime tell the endings apart,
  slurm-lab-facts.md sections 4-7), the ``SLURM_JOB_EXIT_CODE*`` variables, or sacct's final State.
* evidence: plain dicts (they are stored in the records as they are)::

      {"kind": "xid", "code": 79, "gpu": 3, "action": "reboot"}          # kernel log, job window
      {"kind": "xid", "code": 79, "event": "fallen_off_bus", "gpu": 3}  # "fallen off the bus" line
      {"kind": "finding", "check": "gpu.lost", "action": "drain", "gpu": 3}
      {"kind": "counter", "name": "ecc.volatile_uncorrected", "gpu": 3, "delta": 2}
      {"kind": "gpu_oom", "source": "job_output", "stream": "stderr", "signature": "pytorch",
       "line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..."}

Precedence (docs/job-classes.md; the tables are ``healthcheck/data/job-classes.toml``):

1. Slurm's ending: NODE_FAIL > OUT_OF_MEMORY > REQUEUED > PREEMPTED > TIMEOUT > FAILED (exit code
   or signal) > CANCELLED > COMPLETED, each recognised by its own signature.
2. A hardware cause in the evidence replaces the Slurm ending when that ending is one the
   hardware can explain (``hardware_overrides``: not COMPLETED, not PREEMPTED).
3. Among hardware causes, ``hardware_precedence`` decides: GPU_LOST > GPU_ECC > NVLINK >
   INFINIBAND > GPU_XID.
4. Application-level Xids (catalog action ``job``/``ignore``: 13, 31, 43, ...) are evidence only.
5. Without a hardware cause, an application cause in the evidence (``application_precedence``:
   GPU_OOM) replaces the Slurm endings in ``application_overrides`` (FAILED only: host
   OUT_OF_MEMORY stays).
"""
from __future__ import annotations

import functools
from ..plain import field, plain
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..xid.xid_actions import drains
from .classes import APPLICATION_CLASSES, CLASSES, HARDWARE_CLASSES, UNKNOWN

Evidence = Dict[str, Any]


@functools.lru_cache(maxsize=1)
def rules() -> Dict[str, Any]:
    from ..compiled import package_toml

    data = package_toml("job-classes.toml")
    unknown = [c for c in data["hardware_precedence"] if c not in HARDWARE_CLASSES]
    if unknown:
        raise ValueError(f"job-classes.toml: {unknown} are not hardware classes")
    unknown = [c for c in data.get("application_precedence", []) if c not in APPLICATION_CLASSES]
    unknown += [c for c in data.get("evidence_classes", {}).values() if c not in APPLICATION_CLASSES]
    if unknown:
        raise ValueError(f"job-classes.toml: {unknown} are not application classes")
    data.setdefault("application_precedence", [])
    data.setdefault("application_overrides", [])
    data.setdefault("evidence_classes", {})
    return data


# -- Slurm's view -------------------------------------------------------------------------------

@plain
class SlurmView:
    job_state: str = ""              # scontrol JobState (COMPLETING, NODE_FAIL, ...) or sacct State
    reason: str = ""                 # scontrol Reason: None, TimeLimit, NonZeroExitCode, NodeDown, ...
    exit_code: str = ""              # scontrol ExitCode "exit:signal" ("0:15" for scancel/timeout)
    preempt_time: str = ""           # scontrol PreemptTime: "None" unless preempted
    restarts: int = 0
    end_time: str = ""               # "Unknown" while a requeued job waits to run again
    env_exit_code2: str = ""         # SLURM_JOB_EXIT_CODE2 "exit:signal"
    env_derived_ec: Optional[int] = None   # SLURM_JOB_DERIVED_EC: raw wait status of the worst step
    final: bool = False              # job_state is the final state (sacct, or NODE_FAIL from scontrol)

    @classmethod
    def from_scontrol(cls, fields: Mapping[str, str], env: Mapping[str, str] = {}) -> "SlurmView":
        """From ``scontrol show job -o`` fields (``JobInfo.fields``) and the hook's environment."""
        restarts = _int(fields.get("Restarts")) or _int(env.get("SLURM_JOB_RESTART_COUNT")) or 0
        state = fields.get("JobState", "")
        return cls(job_state=state, reason=fields.get("Reason", ""), exit_code=fields.get("ExitCode", ""),
                   preempt_time=fields.get("PreemptTime", ""), restarts=restarts,
                   end_time=fields.get("EndTime", ""), env_exit_code2=env.get("SLURM_JOB_EXIT_CODE2", ""),
                   env_derived_ec=_int(env.get("SLURM_JOB_DERIVED_EC")),
                   final=state not in ("", "COMPLETING", "RUNNING", "CONFIGURING"))

    @classmethod
    def from_sacct(cls, row: Mapping[str, str]) -> "SlurmView":
        """From a ``sacct -X`` row (State, ExitCode): the final view, after the fact."""
        return cls(job_state=row.get("State", ""), exit_code=row.get("ExitCode", ""), final=True)


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def exit_signal(text: str) -> Tuple[int, int]:
    """"3:0" -> (3, 0); "0:15" -> (0, 15); anything else -> (0, 0)."""
    code, _, signal = str(text or "").partition(":")
    return _int(code) or 0, _int(signal) or 0


# sacct/scontrol final states -> our classes ("CANCELLED by 0" is matched by prefix).
_FINAL_STATES = (("COMPLETED", "COMPLETED"), ("FAILED", "FAILED"), ("CANCELLED", "CANCELLED"),
                 ("TIMEOUT", "TIMEOUT"), ("DEADLINE", "TIMEOUT"), ("PREEMPTED", "PREEMPTED"),
                 ("NODE_FAIL", "NODE_FAIL"), ("BOOT_FAIL", "NODE_FAIL"), ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
                 ("REQUEUED", "REQUEUED"), ("REQUEUE_HOLD", "REQUEUED"), ("REQUEUE_FED", "REQUEUED"))


@plain
class SlurmEnding:
    cls: str
    exit: Optional[int] = None
    signal: Optional[int] = None
    why: str = ""                     # which signature decided, for the record
    # False: Slurm's live view reads the same for this ending and for another (records/settle.py)
    settled: bool = True


def final_state(state: str) -> bool:
    """Whether sacct's State is a job's final one (RUNNING, PENDING, ... are not)."""
    return str(state or "").upper().startswith(tuple(prefix for prefix, _ in _FINAL_STATES))


def slurm_ending(view: SlurmView) -> SlurmEnding:
    """Slurm's own ending (precedence step 1)."""
    state = view.job_state.upper()
    reason = view.reason
    env_exit, env_signal = exit_signal(view.env_exit_code2)
    ctl_exit, ctl_signal = exit_signal(view.exit_code)
    if state.startswith(("NODE_FAIL", "BOOT_FAIL")) or reason == "NodeDown":
        return SlurmEnding("NODE_FAIL", why=f"state {state or '-'} reason {reason or '-'}")
    if state.startswith("OUT_OF_MEMORY") or reason == "OutOfMemory":
        return SlurmEnding("OUT_OF_MEMORY", why=f"state {state or '-'} reason {reason or '-'}")
    if state.startswith(("PENDING", "REQUEUE")) or "requeued" in reason \
            or (view.restarts > 0 and view.end_time == "Unknown" and not view.final):
        return SlurmEnding("REQUEUED", why=f"restarts {view.restarts}, end time {view.end_time or '-'}")
    if view.preempt_time not in ("", "None", "Unknown") or state.startswith("PREEMPTED"):
        return SlurmEnding("PREEMPTED", why=f"preempt time {view.preempt_time or '-'}")
    if reason == "TimeLimit" or state.startswith(("TIMEOUT", "DEADLINE")):
        return SlurmEnding("TIMEOUT", why=f"reason {reason or state}")
    if env_exit or env_signal:
        return _failed(env_exit, env_signal, "SLURM_JOB_EXIT_CODE2 " + view.env_exit_code2)
    if reason in ("NonZeroExitCode", "JobLaunchFailure") and (ctl_exit or ctl_signal):
        return _failed(ctl_exit, ctl_signal, f"reason {reason}, ExitCode {view.exit_code}")
    if view.final or state.startswith(("FAILED", "CANCELLED", "COMPLETED")):
        for prefix, cls in _FINAL_STATES:
            if state.startswith(prefix):
                if cls == "FAILED":
                    return _failed(ctl_exit, ctl_signal, f"state {state}")
                return SlurmEnding(cls, why=f"state {state}")
    if ctl_signal:
        # scancel: the exit variables stay 0:0 while scontrol already shows 0:15.
        return SlurmEnding("CANCELLED", signal=ctl_signal, why=f"ExitCode {view.exit_code}, exit variables 0:0")
    if state in ("", "COMPLETING", "COMPLETED") or view.final:
        # A job scancel'd before its batch step's end reached slurmctld reads exactly so too
        # (measured on 22.05: ExitCode 0:0 in the EpilogSlurmctld of a job cancelled 1 s in).
        return SlurmEnding("COMPLETED", exit=0, why=f"state {state or '-'} reason {reason or '-'}",
                           settled=view.final)
    return SlurmEnding(UNKNOWN, why=f"state {state}")


def _failed(code: int, signal: int, why: str) -> SlurmEnding:
    return SlurmEnding("FAILED", exit=code if not signal else None, signal=signal or None, why=why)


# -- evidence -------------------------------------------------------------------------------------

def evidence_class(item: Evidence) -> Optional[str]:
    """The hardware or application class one piece of evidence stands for, or None (evidence only)."""
    table = rules()
    kind = item.get("kind")
    if kind in table["evidence_classes"]:
        return table["evidence_classes"][kind]
    if kind == "xid":
        event_kind = item.get("event")
        if event_kind in table["kind_classes"]:
            return table["kind_classes"][event_kind]
        action = item.get("action")
        if not isinstance(action, str) or not drains(action):     # the one Xid-to-drain rule
            return None
        return table["xid_classes"].get(str(item.get("code")), "GPU_XID")
    if kind == "finding":
        if item.get("action") != "drain" or item.get("status") == "error":
            return None
        check = str(item.get("check", ""))
        for prefix, cls in table["check_classes"].items():
            if check == prefix or check.startswith(prefix + "."):
                return cls
        return None
    if kind == "counter":
        delta = item.get("delta")
        if isinstance(delta, (int, float)) and delta > 0:
            return table["counter_classes"].get(str(item.get("name")))
    return None


def hardware_cause(evidence: Iterable[Evidence]) -> Optional[Tuple[str, Evidence]]:
    """The strongest hardware class in ``evidence`` and the item that shows it (step 3)."""
    return _strongest(evidence, rules()["hardware_precedence"])


def application_cause(evidence: Iterable[Evidence]) -> Optional[Tuple[str, Evidence]]:
    """The strongest application class in ``evidence`` (GPU_OOM) and the item that shows it."""
    return _strongest(evidence, rules()["application_precedence"])


def _strongest(evidence: Iterable[Evidence], order: List[str]) -> Optional[Tuple[str, Evidence]]:
    best: Optional[Tuple[str, Evidence]] = None
    for item in evidence:
        cls = evidence_class(item)
        if cls is None or cls not in order:
            continue
        if best is None or order.index(cls) < order.index(best[0]):
            best = (cls, item)
    return best


def application_could_replace(slurm_cls: str) -> bool:
    """Whether application evidence (a GPU OOM) could change an ending of ``slurm_cls``: the
    epilog looks for it (reads the job's output) only then."""
    return bool(rules()["application_precedence"]) and slurm_cls in rules()["application_overrides"]


# -- the classification ---------------------------------------------------------------------------

@plain
class Classification:
    cls: str                           # one of records.classes.CLASSES (or UNKNOWN)
    slurm: SlurmEnding                 # Slurm's own ending, kept even when hardware replaced it
    cause: Optional[Evidence] = None   # the evidence item that made it a hardware class
    evidence: List[Evidence] = field(default_factory=list)

    def entry_keys(self) -> Dict[str, Any]:
        """The compact keys of the AdminComment entry: class, and gpu/xid/check/exit/signal."""
        keys: Dict[str, Any] = {"class": self.cls}
        if self.cause is not None:
            for key in ("gpu", "check"):
                if self.cause.get(key) is not None:
                    keys[key] = self.cause[key]
            if self.cause.get("kind") == "xid":
                keys["xid"] = self.cause.get("code")
            if self.cause.get("signature"):
                keys["oom"] = self.cause["signature"]
            if self.cause.get("port"):
                keys["port"] = self.cause["port"]
        if self.slurm.exit:
            keys["exit"] = self.slurm.exit
        if self.slurm.signal:
            keys["signal"] = self.slurm.signal
        return keys


def classify(view: SlurmView, evidence: Iterable[Evidence] = ()) -> Classification:
    evidence = list(evidence)
    ending = slurm_ending(view)
    cls, cause = reclassify(ending.cls, evidence)
    return Classification(cls, ending, cause, evidence)


def reclassify(slurm_cls: str, evidence: Iterable[Evidence]) -> Tuple[str, Optional[Evidence]]:
    """The class of an ending given its evidence (steps 2-5); late evidence uses this too."""
    evidence = list(evidence)
    table = rules()
    cause = hardware_cause(evidence)
    if cause is not None and slurm_cls in table["hardware_overrides"]:
        return cause[0], cause[1]
    cause = application_cause(evidence)
    if cause is not None and slurm_cls in table["application_overrides"]:
        return cause[0], cause[1]
    return slurm_cls, None


def job_class(entries: Iterable[Mapping[str, Any]]) -> str:
    """One class for a whole job from its entries (per node, and the job-level ``"*"``):
    the strongest hardware class any node reports; else the strongest application class any
    node reports (GPU_OOM), when the job-level entry's class is one it replaces (FAILED) or there
    is none; else the job-level entry's class; else the most severe Slurm class among the nodes.
    A requeued job is classed by its last run (``run``): earlier runs' entries stay, as history."""
    entries = latest_run(entries)
    table = rules()
    classes = [str(e.get("class", "")).upper() for e in entries]
    hardware = [c for c in classes if c in table["hardware_precedence"]]
    if hardware:
        return min(hardware, key=table["hardware_precedence"].index)
    job_level = [str(e.get("class", "")).upper() for e in entries
                 if str(e.get("node")) == "*" and str(e.get("class", "")).upper() in CLASSES]
    application = [c for c in classes if c in table["application_precedence"]]
    if application and (not job_level or job_level[0] in table["application_overrides"]):
        return min(application, key=table["application_precedence"].index)
    if job_level:
        return job_level[0]
    severity = table["slurm_severity"]
    known = [c for c in classes if c in severity]
    return min(known, key=severity.index) if known else UNKNOWN


def run_number(entry: Mapping[str, Any]) -> int:
    run = entry.get("run")
    return run if isinstance(run, int) and not isinstance(run, bool) and run > 0 else 0


def latest_run(entries: Iterable[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The entries of a job's last run (a requeued job writes one set per run, ``run``)."""
    entries = list(entries)
    last = max((run_number(e) for e in entries), default=0)
    return [e for e in entries if run_number(e) == last]
