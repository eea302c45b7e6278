"""The hooks under faults (issue 14, part 2), each run as the real process slurmd would start
(the console scripts), against one simulated node and one state dir.

The Slurm side is a stand-in on the hooks' [slurm] bin_dir (tests/slurm_standin.py): it proves
the argument lists and what the hooks do when Slurm fails or is slow; the lab tests prove the
hooks against the real Slurm (slurmdbd down: tests/lab/test_lab_hooks.py). Faults the simulator
cannot make (a full or read-only disk, a kernel log root may not read, a log rotated under the
reader) are injected at the OS edge by tests/fault_shim/sitecustomize.py. docs/operations.md
("Failure modes") names the test behind each row; test_docs_failure_modes_name_these_tests
holds the table to this file.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from healthcheck.records import outbox, store

from .conftest import ROOT, SIM_PROFILES
from .slurm_standin import SlurmStandIn
from .test_records_store_outbox import queued_entries

BIN = os.path.dirname(sys.executable)
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_shim")
HOOKS = ("prolog", "epilog", "healthcheck")
XID = "NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python, {text}"


class Node:
    """One simulated node (gpu1), its config, state dir and stand-in Slurm."""

    def __init__(self, tmp_path, extra: str = ""):
        self.root = str(tmp_path)
        self.state = str(tmp_path / "state")
        self.sim_dir = os.path.join(self.state, "sim")
        self.slurm = SlurmStandIn(str(tmp_path / "slurm"))
        self.config = str(tmp_path / "config.toml")
        self.marker = uuid.uuid4().hex          # in every process this test starts: finds orphans
        self.job_gpus = "2,3"                   # SLURM_JOB_GPUS of the prolog and epilog
        self.base = f"""
[paths]
state_dir = "{self.state}"
[gpu]
backend = "sim"
probe_timeout_s = {{probe_timeout_s}}
[sim]
profile = "{os.path.join(SIM_PROFILES, 'h100-healthy.toml')}"
[[nodes]]
match = "gpu[1-3]"
gpus = 8
gpu_model = "H100"
nvlinks_per_gpu = 18
[records]
delivery = "inline"
{{records}}
[slurm]
bin_dir = "{self.slurm.dir}"
timeout_s = {{slurm_timeout_s}}
"""
        self.write_config(extra)
        self.inject("gpu.0.state=ok")           # the simulated node exists before any fault

    def write_config(self, extra: str = "", health: str = "", probe_timeout_s: float = 2.0,
                     slurm_timeout_s: float = 2.0, records: str = "") -> None:
        base = self.base.replace("{probe_timeout_s}", str(probe_timeout_s)).replace("{records}", records)
        with open(self.config, "w") as handle:
            handle.write(base.replace("{slurm_timeout_s}", str(slurm_timeout_s)) + f"[health]\nsyslog = false\ndeadline_s = 40\ntextfile_dir = \"metrics\"\n{health}\n{extra}\n")

    def env(self, hook: str, job: str = "5", faults=None) -> dict:
        env = {"SLURM_GPU_HOOKS_CONFIG": self.config, "SLURMD_NODENAME": "gpu1", "SGH_TEST_MARKER": self.marker,
               "PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([SHIM, ROOT])}
        if hook in ("prolog", "epilog"):
            env.update(SLURM_JOB_ID=job, SLURM_JOB_GPUS=self.job_gpus,
                       SLURM_SCRIPT_CONTEXT="prolog_slurmd" if hook == "prolog" else "epilog_slurmd")
        if hook == "epilog":
            env["SLURM_JOB_EXIT_CODE2"] = "1:0"
        if faults:
            env["SGH_TEST_FAULTS"] = json.dumps(faults)
        return env

    def argv(self, hook: str, *extra: str) -> list:
        if hook == "check":
            return [os.path.join(BIN, "slurm-gpu"), "check", "--config", self.config, "--node", "gpu1", *extra]
        return [os.path.join(BIN, f"slurm-gpu-{hook}"), *extra]

    def start(self, hook: str, *extra: str, job: str = "5", faults=None) -> subprocess.Popen:
        return subprocess.Popen(self.argv(hook, *extra), env=self.env(hook, job, faults), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, hook: str, *extra: str, job: str = "5", faults=None) -> subprocess.CompletedProcess:
        # The timeout only keeps a hang from stalling the suite; it asserts nothing.
        return subprocess.run(self.argv(hook, *extra), env=self.env(hook, job, faults), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)

    def inject(self, *assignments: str, log: str = "") -> None:
        args = [os.path.join(BIN, "slurm-gpu"), "sim", "inject", "--config", self.config, "gpu1", *assignments]
        if log:
            args += ["--log", log]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=ROOT))
        assert done.returncode == 0, done.stderr

    @property
    def kern_log(self) -> str:
        return os.path.join(self.sim_dir, "gpu1", "kern.log")

    def pci(self, gpu: int) -> str:
        """GPU ``gpu``'s PCI address as the kernel log writes it."""
        from healthcheck.safeio import tomlio

        profile = tomlio.load_file(os.path.join(self.sim_dir, "gpu1", "profile.toml"))
        domain, bus, rest = profile["gpu"][gpu]["pci_bus_id"].split(":")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"

    def journal(self) -> list:
        path = os.path.join(self.state, "hook-runs", "gpu1.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as handle:
            return [json.loads(line) for line in handle]

    def processes(self) -> list:
        """Processes still running that this test started (by the marker in their environment)."""
        found = []
        needle = f"SGH_TEST_MARKER={self.marker}".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    if needle in handle.read().split(b"\0"):
                        with open(f"/proc/{pid}/stat") as stat:
                            if stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                                found.append(int(pid))
            except OSError:
                continue
        return found

    def wait_probe_child(self, parent: int, bound_s: float = 60.0) -> int:
        """Polls until ``parent`` has forked its NVML probe child (a child running the same
        program), and returns its pid; 0 when none came (the bound only stops a failing test
        from hanging)."""
        end = time.monotonic() + bound_s
        while time.monotonic() < end:
            for pid in self.processes():
                try:
                    with open(f"/proc/{pid}/stat") as stat:
                        ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                    with open(f"/proc/{pid}/cmdline", "rb") as child, open(f"/proc/{parent}/cmdline", "rb") as own:
                        if ppid == parent and child.read() == own.read():
                            return pid
                except (OSError, ValueError):
                    continue
            time.sleep(0.05)
        return 0

    def no_orphans(self, bound_s: float = 20.0) -> list:
        end = time.monotonic() + bound_s
        while self.processes() and time.monotonic() < end:
            time.sleep(0.05)
        return self.processes()

    def state_files(self) -> dict:
        """Every file of the state dir but the simulated hardware: relative path -> bytes."""
        files = {}
        for top, dirs, names in os.walk(self.state):
            if os.path.abspath(top) == os.path.abspath(self.sim_dir):
                dirs[:] = []
                continue
            for name in names:
                path = os.path.join(top, name)
                with open(path, "rb") as handle:
                    files[os.path.relpath(path, self.state)] = handle.read()
        return files


@pytest.fixture
def node(tmp_path):
    made = Node(tmp_path)
    yield made
    for pid in made.processes():                 # never leave a process behind, even on failure
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def no_traceback(done) -> None:
    assert "Traceback" not in done.stderr, done.stderr


def health_json(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- NVML hangs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["node.nvml=hang", "gpu.0.state=hang gpu.1.state=hang gpu.2.state=hang "
                                   "gpu.3.state=hang gpu.4.state=hang gpu.5.state=hang gpu.6.state=hang "
                                   "gpu.7.state=hang"], ids=["driver", "every-gpu"])
def test_a_hung_nvml_ends_at_the_probe_deadline_and_drains_nothing_by_default(node, fault):
    """A driver that does not answer (NVML itself, or every GPU at once) is ambiguous: not a node
    fault unless [health] drain_on_probe_timeout says so (docs/healthcheck.md), in every hook
    alike: each ends, exits 0, says so, drains nothing."""
    node.inject(*fault.split())
    for hook in HOOKS:
        done = node.run(hook, *(["--json"] if hook == "healthcheck" else []))
        no_traceback(done)
        assert done.returncode == 0, (hook, done.stderr)
        assert "did not answer" in done.stderr, (hook, done.stderr)
        if hook == "healthcheck":
            assert json.loads(done.stdout)["decision"] == "none"
    check = node.run("check", "--json")
    assert check.returncode == 3, check.stderr          # could not check: the probe did not answer
    assert {f["check"] for f in json.loads(check.stdout)["findings"]} == {"probe.timeout"}
    assert node.slurm.drains() == []
    results = {entry["hook"]: entry for entry in node.journal()}
    assert results["prolog"]["result"] == "ok" and results["epilog"]["result"] == "classified"
    assert "drained" not in results["epilog"]
    assert node.no_orphans() == [], "a probe child outlived its hook"


def test_one_gpu_that_hangs_while_its_siblings_answer_stops_the_job_and_drains_for_it(node):
    """A single GPU that does not answer while its seven siblings do is a broken GPU, by default
    (no drain_on_probe_timeout): the prolog refuses the job and drains the node for that GPU; the
    epilog keeps the evidence; the health check keeps the drain, never resumes it."""
    node.job_gpus = "4,5"
    node.inject("gpu.5.state=hang")
    prolog = node.run("prolog")
    no_traceback(prolog)
    assert prolog.returncode == 1, prolog.stderr
    drains = node.slurm.drains()
    assert len(drains) == 1 and drains[0].startswith("gpu-hooks: v1 probe.timeout gpu5"), drains
    epilog = node.run("epilog")
    assert epilog.returncode == 0, epilog.stderr
    record = [entry for entry in node.journal() if entry["hook"] == "epilog"][-1]
    assert record["result"] == "classified", record
    doc = health_json(node.run("healthcheck", "--json"))
    assert doc["decision"] == "none" and doc["rule"] in ("drained-same-cause", "resume-wait-pending", "resume-wait-unseen"), doc
    assert len(node.slurm.drains()) == 1
    assert [c for c in node.slurm.calls("scontrol") if "state=resume" in c["args"]] == []
    assert node.no_orphans() == [], "a probe child outlived its hook"


def test_the_health_check_drains_for_one_gpu_that_hangs_while_its_siblings_answer(node):
    node.inject("gpu.5.state=hang")
    # a run in the boot's grace, then confirmed over [health] confirm_runs, as any finding that waits
    decisions = [health_json(node.run("healthcheck", "--json"))["decision"] for _ in range(3)]
    assert decisions == ["none", "none", "drain"], decisions
    drains = node.slurm.drains()
    assert len(drains) == 1 and drains[0].startswith("gpu-hooks: v1 probe.timeout gpu5"), drains


def test_with_drain_on_probe_timeout_every_hook_drains_for_a_hung_driver(node):
    node.write_config(health="drain_on_probe_timeout = true")
    node.inject("node.nvml=hang")
    prolog = node.run("prolog")
    assert prolog.returncode == 1, prolog.stderr
    assert node.slurm.drains() == ["gpu-hooks: v1 probe.timeout node; NVML did not answer within 2 s"]
    # already drained for this cause: the epilog and the health check keep it, never resume it
    assert node.run("epilog").returncode == 0
    doc = health_json(node.run("healthcheck", "--json"))
    # (a timeout is confirmed over [health] confirm_runs runs; while it is, our drain stays)
    assert doc["decision"] == "none" and doc["rule"] in ("drained-same-cause", "resume-wait-pending"), doc
    assert len(node.slurm.drains()) == 1
    assert [c for c in node.slurm.calls("scontrol") if "state=resume" in c["args"]] == []


def test_a_node_we_drained_is_not_resumed_while_nvml_does_not_answer(node):
    """Drained by us for an ECC fault; now the driver hangs: nothing can be seen, so nothing
    passes, and the node stays drained (a resume needs checks that ran)."""
    node.inject("gpu.3.ecc.volatile_uncorrected=2")
    assert health_json(node.run("healthcheck", "--json"))["decision"] == "drain"
    node.inject("gpu.3.ecc.volatile_uncorrected=0", "node.nvml=hang")
    doc = health_json(node.run("healthcheck", "--json"))
    assert doc["decision"] == "none" and doc["rule"] == "resume-wait-unseen", doc
    assert [c for c in node.slurm.calls("scontrol") if "state=resume" in c["args"]] == []
    node.inject("node.nvml=ok")                  # the driver answers again and the GPU is fine
    assert health_json(node.run("healthcheck", "--json"))["decision"] == "resume"


# -- a GPU lost in the middle of a probe --------------------------------------------------------

def test_a_gpu_lost_midway_through_its_probe_drains_for_that_gpu(node):
    # GPU 3 answers its identity (name, UUID, PCI, minor number), then falls off the bus.
    node.inject("gpu.3.lost_after_calls=4")
    check = node.run("check", "--json")
    assert check.returncode == 2, check.stderr
    report = json.loads(check.stdout)
    [lost] = [f for f in report["findings"] if f["check"] == "gpu.lost"]
    assert lost["gpu"] == 3 and lost["uuid"], lost          # read before it was lost
    prolog = node.run("prolog")
    assert prolog.returncode == 1, prolog.stderr
    [reason] = node.slurm.drains()
    assert reason.startswith("gpu-hooks: v1 gpu.lost gpu3; GPU 3 (") and lost["pci_bus_id"] in reason, reason
    assert node.journal()[-1]["result"] == "bad-node"
    epilog = node.run("epilog")
    assert epilog.returncode == 0 and "Traceback" not in epilog.stderr
    from healthcheck.records import store

    assert store.read_record(node.state, "5", "gpu1")["class"] == "GPU_LOST"
    doc = health_json(node.run("healthcheck", "--json"))
    assert doc["rule"] == "drained-same-cause" and len(node.slurm.drains()) == 1


# -- the kernel log unreadable -------------------------------------------------------------------

def _unreadable(node, how):
    if how == "vanished":
        os.unlink(node.kern_log)
        return None
    return {"eacces": [node.kern_log]}


@pytest.mark.parametrize("how", ["eacces", "vanished"])
def test_an_unreadable_kernel_log_drains_nothing_and_its_xids_are_judged_once_it_is_back(node, how):
    xid = XID.format(pci=node.pci(5), code=79, text="GPU has fallen off the bus.")
    node.inject(log=xid)
    with open(node.kern_log) as handle:
        content = handle.read()
    faults = _unreadable(node, how)
    for hook in HOOKS:
        done = node.run(hook, *(["--json"] if hook == "healthcheck" else []), faults=faults)
        no_traceback(done)
        assert done.returncode == 0, (hook, done.stderr)
        assert "kernel log unreadable" in done.stderr or hook == "healthcheck", (hook, done.stderr)
        if hook == "healthcheck":
            doc = json.loads(done.stdout)
            assert doc["decision"] == "none", doc
            assert [f["check"] for f in doc["findings"]] == ["probe.error"]
    assert node.slurm.drains() == []
    if how == "vanished":
        with open(node.kern_log, "w") as handle:
            handle.write(content)
    doc = health_json(node.run("healthcheck", "--json"))
    assert doc["decision"] == "drain" and doc["reason"].startswith("gpu-hooks: v1 kernel.xid gpu5 xid:79;")


def test_a_kernel_log_rotated_in_the_middle_of_a_read_loses_no_xid_and_repeats_none(node):
    first = XID.format(pci=node.pci(5), code=79, text="GPU has fallen off the bus.")
    second = XID.format(pci=node.pci(6), code=48, text="An uncorrectable double bit error (DBE) has been "
                                                        "detected on GPU in the framebuffer at partition 0, "
                                                        "subpartition 0.")
    node.inject(log=first)
    faults = {"rotate": {"path": node.kern_log, "new": second + "\n"}}
    run1 = node.run("check", "--json", faults=faults)
    assert run1.returncode == 2 and "Traceback" not in run1.stderr, run1.stderr
    assert os.path.exists(node.kern_log + ".1"), "the rotation did not happen"
    xids1 = sorted((f["gpu"], f["evidence"].get("code")) for f in json.loads(run1.stdout)["findings"]
                   if f["check"] == "kernel.xid")
    run2 = node.run("check", "--json")
    xids2 = sorted((f["gpu"], f["evidence"].get("code")) for f in json.loads(run2.stdout)["findings"]
                   if f["check"] == "kernel.xid")
    assert xids1 == [(5, 79)] and xids2 == [(6, 48)], (xids1, xids2)


# -- the state dir unwritable or full -------------------------------------------------------------

@pytest.mark.parametrize("fault", ["enospc", "erofs"])
def test_a_full_or_read_only_state_dir_keeps_the_old_state_and_still_drains(node, fault):
    # A history first: a healthy job and a health-check run leave state behind.
    for hook in HOOKS:
        assert node.run(hook).returncode == 0
    before = node.state_files()
    assert any(name.startswith("health") for name in before) and any(name.startswith("jobs") for name in before)
    node.inject("gpu.3.state=lost")
    faults = {fault: [node.state], "except": [node.sim_dir]}
    prolog = node.run("prolog", job="6", faults=faults)
    no_traceback(prolog)
    assert prolog.returncode == 1, prolog.stderr              # the job does not start on a lost GPU
    assert "baseline not saved" in prolog.stderr
    epilog = node.run("epilog", job="6", faults=faults)
    no_traceback(epilog)
    assert epilog.returncode == 0 and "record not saved" in epilog.stderr, epilog.stderr
    health = node.run("healthcheck", "--json", faults=faults)
    no_traceback(health)
    assert health.returncode == 0, health.stderr
    check = node.run("check", faults=faults)
    no_traceback(check)
    # the lost GPU is reported; what could not be saved makes the run an error (exit 3)
    assert check.returncode == 3 and "gpu.lost" in check.stdout and "not saved" in check.stdout, check.stdout
    # the drain happened once (the prolog), the others saw it was ours already
    [reason] = node.slurm.drains()
    assert reason.startswith("gpu-hooks: v1 gpu.lost gpu3; "), reason
    after = node.state_files()
    # (an empty lock file can still be created on a full disk: no data, nothing half-written)
    new_locks = [name for name in set(after) - set(before) if name.endswith(".lock") and after[name] == b""]
    assert {k: v for k, v in after.items() if k not in new_locks} == before, \
        "a file of the state dir changed, appeared or was left half-written"


def test_an_entry_not_queued_on_a_full_disk_is_queued_from_its_record_when_space_returns(node):
    node.inject("gpu.3.state=lost")
    faults = {"enospc": [os.path.join(node.state, "outbox")]}
    first = node.run("epilog", job="5", faults=faults)
    no_traceback(first)
    assert first.returncode == 0 and "accounting entry not queued (queued later from the record)" in first.stderr
    assert store.read_record(node.state, "5", "gpu1")["entry_wanted"] is True
    assert outbox.pending(node.state) == {}
    # Space is back: the next epilog that delivers (inline here) queues job 5's entry from its record.
    second = node.run("epilog", job="6")
    no_traceback(second)
    assert second.returncode == 0, second.stderr
    assert [entry["class"] for entry in queued_entries(node.state, "5")] == ["GPU_LOST"] and "6" in outbox.pending(node.state)


# -- slurmctld or slurmdbd down; scontrol slower than its deadline ---------------------------------

@pytest.mark.parametrize("mode", ["down", "slow"])
def test_when_slurm_fails_the_drain_is_said_and_retried_and_the_record_queued(node, mode):
    node.inject("gpu.3.state=lost")
    node.slurm.set_mode(mode)
    prolog = node.run("prolog")
    no_traceback(prolog)
    # the job still does not start; Slurm's own "Prolog error" drain follows the non-zero exit
    assert prolog.returncode == 1 and "not drained (slurm-unreachable-fault)" in prolog.stderr, prolog.stderr
    epilog = node.run("epilog")
    no_traceback(epilog)
    assert epilog.returncode == 0 and "not drained (slurm-unreachable-fault)" in epilog.stderr, epilog.stderr
    [queued] = queued_entries(node.state, "5")           # the GPU_LOST entry waits for accounting
    assert queued["class"] == "GPU_LOST"
    doc = health_json(node.run("healthcheck", "--json"))
    assert (doc["decision"], doc["rule"], doc["committed"]) == ("blocked", "slurm-unreachable-fault", False)
    assert node.slurm.drains() == [] and node.no_orphans() == [], "a Slurm command outlived its deadline"
    node.slurm.set_mode("up")
    doc = health_json(node.run("healthcheck", "--json"))
    assert (doc["decision"], doc["committed"]) == ("drain", True)
    assert len(node.slurm.drains()) == 1


# -- SIGTERM from slurmd in the middle of a run ----------------------------------------------------

@pytest.mark.parametrize("hook", HOOKS)
def test_sigterm_in_the_middle_of_a_run_leaves_no_child_and_no_partial_file(node, hook):
    for name in HOOKS:                                     # earlier state the killed run must not damage
        assert node.run(name).returncode == 0
    before = node.state_files()
    node.write_config(probe_timeout_s=30)                   # the probe stays in the driver long enough
    node.inject("node.nvml=hang")
    process = node.start(hook)
    try:
        child = node.wait_probe_child(process.pid)
        assert child, "the hook never started its NVML probe"
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert node.no_orphans() == [], "the NVML child outlived the hook slurmd killed"
    after = node.state_files()
    assert [name for name in after if name.endswith(".tmp")] == []
    for name, data in after.items():
        if name.endswith((".json", ".jsonl")):
            for line in data.decode().splitlines() if name.endswith(".jsonl") else [data.decode()]:
                json.loads(line)
    assert {k: v for k, v in after.items() if k in before} == {k: v for k, v in before.items() if k in after}


# -- a whole run longer than the hook's deadline (the watchdog) -------------------------------------

def _no_partial_file(node) -> None:
    for name, data in node.state_files().items():
        assert not name.endswith(".tmp"), name
        if name.endswith(".json"):
            json.loads(data)


@pytest.mark.parametrize("on_tool_error,code,says", [("pass", 0, "the job runs unchecked"),
                                                     ("fail", 1, "the job stopped unchecked")])
def test_a_prolog_past_its_deadline_ends_there_per_on_tool_error_and_leaves_no_child(node, on_tool_error, code,
                                                                                      says):
    """Each step is within its own limit (the probe's 30 s), the whole run is not: the watchdog
    ends it at [prolog] deadline_s, before slurmd would kill it and drain the node."""
    node.write_config(probe_timeout_s=30, extra=f'[prolog]\ndeadline_s = 2\non_tool_error = "{on_tool_error}"')
    node.inject("node.nvml=hang")
    done = node.run("prolog")
    no_traceback(done)
    assert done.returncode == code, done.stderr
    assert "took longer than 2 s ([prolog] deadline_s)" in done.stderr and says in done.stderr, done.stderr
    [entry] = node.journal()
    assert entry["result"] == "watchdog" and entry["done"] == {}, entry
    assert node.slurm.drains() == []
    assert node.no_orphans() == [], "the NVML child outlived the prolog's watchdog"
    _no_partial_file(node)


def test_a_prolog_whose_drain_slurm_took_keeps_the_job_stopped_when_its_deadline_passes(node):
    """scontrol applied our drain but its answer never came: the scontrol is cut by the time the
    run has left (issue 34: every step within the run's deadline), the prolog says the drain may
    have been taken, and the job must not start on the node we drained (exit 1, whatever
    on_tool_error says)."""
    node.write_config(slurm_timeout_s=30, extra="[prolog]\ndeadline_s = 10")
    node.inject("gpu.3.state=lost")
    node.slurm.set_hang("scontrol", "update")
    done = node.run("prolog")
    no_traceback(done)
    assert done.returncode == 1, done.stderr
    assert "drain asked, Slurm did not answer" in done.stderr and "(the time left in the run)" in done.stderr, \
        done.stderr
    [reason] = node.slurm.drains()
    assert reason.startswith("gpu-hooks: v1 gpu.lost gpu3; ") and reason in node.slurm.node_line()
    [entry] = node.journal()
    assert entry["result"] != "watchdog", entry          # the run ended by itself, within its deadline
    assert node.no_orphans() == [], "the hung scontrol outlived the prolog's watchdog"
    _no_partial_file(node)


def test_an_epilog_past_its_deadline_keeps_its_record_drain_and_queued_entry(node):
    """The epilog recorded the job, drained the node and queued the entry; delivering it hangs
    (sacct never answers): the sacct is cut by the time the run has left (issue 34: every step
    within the run's deadline), exit 0, and all of that stays, the entry queued for a later run."""
    from healthcheck.records import store

    node.write_config(slurm_timeout_s=30, records="epilog_deadline_s = 10")
    node.inject("gpu.3.state=lost")
    node.slurm.set_hang("sacct")
    done = node.run("epilog")
    no_traceback(done)
    assert done.returncode == 0, done.stderr
    assert store.read_record(node.state, "5", "gpu1")["class"] == "GPU_LOST"
    [queued] = queued_entries(node.state, "5")
    assert queued["class"] == "GPU_LOST"
    assert len(node.slurm.drains()) == 1 and node.slurm.drains()[0] in node.slurm.node_line()
    [entry] = node.journal()
    assert entry["result"] != "watchdog", entry          # the run ended by itself, within its deadline
    assert node.no_orphans() == [], "the hung sacct outlived the epilog's run"
    _no_partial_file(node)


# -- prolog, epilog and health check at the same time on one node -----------------------------------

def test_prolog_epilog_and_health_check_at_once_lose_nothing_and_drain_once(node):
    # A hook waits two Slurm timeouts for another's decision: long enough on a loaded machine.
    node.write_config(slurm_timeout_s=15)
    node.inject("gpu.3.state=lost")
    node.slurm.set_lag(0.5)              # each hook reads the node, then drains: a window to race in
    rounds = 3
    finished = []
    for turn in range(rounds):
        started = [node.start("prolog", job=str(100 + turn)), node.start("epilog", job=str(200 + turn)),
                   node.start("healthcheck")]
        for process in started:
            out, err = process.communicate(timeout=120)
            finished.append((process.args[0], process.returncode, err))
    for command, code, err in finished:
        assert "Traceback" not in err, (command, err)
        assert code == (1 if command.endswith("prolog") else 0), (command, code, err)
    journal = node.journal()                               # every run, every line whole
    assert sorted(entry["hook"] for entry in journal) == sorted(["prolog", "epilog", "healthcheck"] * rounds)
    for name, data in node.state_files().items():
        assert not name.endswith(".tmp"), name
        if name.endswith(".json"):
            json.loads(data)
    from healthcheck.records import store

    assert all(store.read_record(node.state, str(200 + turn), "gpu1")["class"] == "GPU_LOST" for turn in range(rounds))
    assert all(store.read_baseline(node.state, str(100 + turn), "gpu1") for turn in range(rounds))
    assert len(outbox.pending(node.state)) == rounds       # every epilog's entry queued (no sacct job yet)
    assert len(node.slurm.drains()) == 1, node.slurm.drains()


# -- the failure-mode table in docs/operations.md names these tests ---------------------------------

def test_docs_failure_modes_name_these_tests():
    with open(os.path.join(ROOT, "docs", "operations.md")) as handle:
        text = handle.read()
    section = text.split("## Failure modes", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", section))
    assert len(named) >= 10, named
    for path, test in named:
        with open(os.path.join(ROOT, path)) as handle:
            assert re.search(rf"^def {test}\(", handle.read(), re.M), f"{path}::{test} named in docs/operations.md"
    here = {name for name in globals() if name.startswith("test_") and name != "test_docs_failure_modes_name_these_tests"}
    assert here <= {test for path, test in named if path == "tests/test_hooks_under_faults.py"}, \
        here - {test for _, test in named}
