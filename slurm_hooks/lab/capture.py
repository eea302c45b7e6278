"""``slurm-gpu lab capture``: what the running lab's Slurm release really prints, written as test
fixtures (``tests/fixtures/slurm/releases/VERSION/``) that the backend's unit tests parse, and
the measurements ``docs/slurm-versions.md`` reports (what sacctmgr stores for an AdminComment,
which ``scontrol update`` of it is accepted, the hooks' environments, the job's cgroup).

Every capture is one command's output, written as it came, next to ``capture.json`` that says
what was run for each file. Refresh all releases with ``scripts/capture-slurm-fixtures``.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import time
from typing import Callable, Dict, List, Optional, Sequence

from . import LabError
from .install import command
from .paths import LabPaths
from .releases import current
from .commands import run, slurm_env
from .slurmcli import Slurm, is_final

Say = Callable[[str], None]

# The hook wrappers dump their environment here while the directory exists (render.py).
ENV_DIR = "capture-env"
JOB_OPTIONS = ("-w", "gpu1", "--gres=gpu:1", "-o", "/dev/null")
# The AdminComment the capture stores: our entry's shape, quotes and case included.
ADMIN_COMMENT = 'SGH1:{"v":1,"node":"*","class":"FAILED","exit":3} JS1:H4sIAbC='
FORGED_NAME = "x JobState=TIMEOUT Reason=TimeLimit PreemptTime=2026-11-30T17:46:01"
FORGED_COMMENT = "y JobState=PREEMPTED Reason=None"


def env_dir(lab: LabPaths) -> str:
    return os.path.join(lab.state, ENV_DIR)


class Capture:
    def __init__(self, lab: LabPaths, out: str, say: Say):
        self.lab = lab
        self.out = out
        self.say = say
        self.slurm = Slurm(lab)
        self.env = slurm_env(lab)
        self.index: Dict[str, Dict[str, object]] = {}

    def tool(self, name: str, args: Sequence[str], timeout: float = 30):
        return run([command(self.lab, name), *args], env=self.env, timeout=timeout, check=False, cwd=self.lab.jobs)

    def save(self, filename: str, name: str, args: Sequence[str], note: str = "") -> str:
        result = self.tool(name, args)
        text = result.stdout if result.returncode == 0 else result.stdout + result.stderr
        with open(os.path.join(self.out, filename), "w", encoding="utf-8") as handle:
            handle.write(text)
        self.index[filename] = {"command": [name, *args], "rc": result.returncode,
                                **({"note": note} if note else {})}
        return text

    def write(self, filename: str, doc: object) -> None:
        with open(os.path.join(self.out, filename), "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=2, sort_keys=True)
            handle.write("\n")

    # -- jobs ----------------------------------------------------------------------------------
    def submit(self, *options: str) -> str:
        return self.slurm.sbatch([*JOB_OPTIONS, *options[:-1]], options[-1])

    def wait_final(self, job_id: str, timeout: float = 90) -> Dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.slurm.sacct(job_id)
            # An array task ("164_1"): accounting alone (how each release's scontrol and squeue
            # name a task is part of what is captured, not something to wait on).
            if rows and is_final(rows[0].get("State", "")) and (
                    "_" in job_id or is_final(self.slurm.job(job_id).get("JobState", ""))):
                return rows[0]
            time.sleep(1)
        raise LabError(f"job {job_id} did not end within {timeout:g} s")

    def wait_running(self, job_id: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.slurm.job(job_id).get("JobState") == "RUNNING":
                return
            time.sleep(0.5)
        raise LabError(f"job {job_id} did not start within {timeout:g} s")

    def job_views(self, case: str, job_id: str) -> None:
        from healthcheck.slurm.cli_backend import squeue_job_argv

        self.save(f"scontrol-show-job-{case}.txt", "scontrol", ["show", "job", "-o", job_id])
        self.save(f"scontrol-json-show-job-{case}.json", "scontrol", ["--json", "show", "job", job_id])
        self.save(f"squeue-job-state-{case}.txt", "squeue", squeue_job_argv(job_id))
        self.save(f"sacct-json-{case}.json", "sacct", ["--json", "-j", job_id])

    def jobs(self) -> Dict[str, str]:
        ids = {"completed": self.submit("exit 0"), "failed": self.submit("exit 3"),
               "forged": self.submit("-J", FORGED_NAME, "--comment", FORGED_COMMENT, "exit 3"),
               "array": self.submit("--array=1-2", "exit 0"),
               "cgroup": self.submit("-o", os.path.join(self.lab.jobs, "capture-cgroup-%j.out"),
                                     "cat /proc/self/cgroup")}
        for case, job_id in ids.items():
            if case != "array":
                self.wait_final(job_id)
        for task in (f"{ids['array']}_1", f"{ids['array']}_2"):
            self.wait_final(task)
        time.sleep(2)  # accounting catches up with the last end
        for case, job_id in ids.items():
            self.job_views(case, job_id)
        self.save("scontrol-show-job-array-task.txt", "scontrol", ["show", "job", "-o", f"{ids['array']}_2"])
        self.save("scontrol-json-show-job-array-task.json", "scontrol", ["--json", "show", "job", f"{ids['array']}_2"])
        self.save("sacct-json-array-task.json", "sacct", ["--json", "-j", f"{ids['array']}_2"])
        cgroup = os.path.join(self.lab.jobs, f"capture-cgroup-{ids['cgroup']}.out")
        if os.path.isfile(cgroup):
            shutil.copyfile(cgroup, os.path.join(self.out, "job-proc-self-cgroup.txt"))
            self.index["job-proc-self-cgroup.txt"] = {"command": ["sbatch", "--wrap", "cat /proc/self/cgroup"]}
        return ids

    def admin_comment(self, ended: str) -> None:
        """What sacctmgr stores, and which scontrol update is accepted when."""
        self.save("admin-comment-sacctmgr.txt", "sacctmgr",
                  ["-i", "modify", "job", "where", f"jobid={ended}", "set", f"AdminComment={ADMIN_COMMENT}"])
        time.sleep(1)
        self.save("admin-comment-sacct.txt", "sacct", ["-X", "-n", "-P", "-j", ended, "-o", "AdminComment"],
                  note=f"after sacctmgr set AdminComment={ADMIN_COMMENT}")
        self.save("admin-comment-scontrol-ended.txt", "scontrol",
                  ["update", f"jobid={ended}", f"AdminComment={ADMIN_COMMENT}"], note="on an ended job")
        running = self.submit("sleep 60")
        self.wait_running(running)
        self.save("admin-comment-scontrol-running.txt", "scontrol",
                  ["update", f"jobid={running}", f"AdminComment={ADMIN_COMMENT}"], note="on a running job")
        self.save("admin-comment-scontrol-running-show.txt", "scontrol", ["show", "job", "-o", running])
        self.slurm.cancel(running)
        self.wait_final(running)

    def nodes(self) -> None:
        reason = "gpu-hooks: v1 capture gpu0; a drain made by slurm-gpu lab capture"
        self.tool("scontrol", ["update", "nodename=gpu3", "state=drain", f"reason={reason}"])
        try:
            self.save("scontrol-show-node-drained.txt", "scontrol", ["show", "node", "-o", "gpu3"])
            self.save("scontrol-json-show-node-drained.json", "scontrol", ["--json", "show", "node", "gpu3"])
            self.save("sinfo-json-drained.json", "sinfo", ["--json"])
        finally:
            self.tool("scontrol", ["update", "nodename=gpu3", "state=resume"])

    def hook_environments(self, job_id: str) -> None:
        """Variable names each hook got for one GPU job (values vary by run)."""
        names: Dict[str, List[str]] = {}
        for path in sorted(glob.glob(os.path.join(env_dir(self.lab), "*.env"))):
            hook = os.path.basename(path).split(".")[0]
            with open(path, encoding="utf-8", errors="replace") as handle:
                variables = sorted({line.split("=", 1)[0] for line in handle if "=" in line})
            names.setdefault(hook, variables)
        self.write("hook-environments.json", {"job": job_id, "variables": names})


def capture(lab: LabPaths, out: Optional[str], say: Say) -> str:
    """Capture into ``out`` (default: the checkout's tests/fixtures/slurm/releases/VERSION)."""
    release = current(lab)
    if out is None:
        from .rootfs import checkout

        out = os.path.join(checkout(), "tests", "fixtures", "slurm", "releases", release.version)
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "*")):
        if os.path.isfile(old):
            os.unlink(old)
    shot = Capture(lab, out, say)
    version = shot.save("version.txt", "scontrol", ["--version"]).strip()
    say(f"capturing {version} into {out}")
    shutil.rmtree(env_dir(lab), ignore_errors=True)
    os.makedirs(env_dir(lab), mode=0o755)
    try:
        env_job = shot.submit("--gres=gpu:2", "exit 0")
        shot.wait_final(env_job)
        time.sleep(3)   # EpilogSlurmctld may run after sacct shows the end
        shot.hook_environments(env_job)
    finally:
        shutil.rmtree(env_dir(lab), ignore_errors=True)
    ids = shot.jobs()
    shot.admin_comment(ids["failed"])
    shot.nodes()
    shot.write("capture.json", {"release": release.version, "version": version, "jobs": ids, "files": shot.index})
    say(f"captured {len(shot.index) + 1} files")
    return out
