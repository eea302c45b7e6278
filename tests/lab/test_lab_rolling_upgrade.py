"""A rolling upgrade on the lab (issue 31): the three nodes, one at a time, then the controller,
go from this tree's release to a second one while a job array keeps ending; then one node is
rolled back.

The second release is this tree with its version bumped and its health-state format one higher
(``healthcheck/actions/state.py``'s VERSION), as a release with a new format would be: built
into a wheel and installed into a venv of its own in the release's Debian root filesystem, beside
the lab's (``/usr/local/slurm-gpu-hooks``), with the root filesystem's python3 and the lab's
dependency wheels. Each node runs the release its link names (``/opt/slurm-gpu-rolling/nodes/<node>``,
``slurmctld`` for EpilogSlurmctld, which gets no SLURMD_NODENAME): Slurm runs wrappers that
differ from the lab's only in that link and in the config, a copy of the lab's with a state dir of
this test's (the lab's watchers keep theirs). A node switches in one rename, as
``ln -sfn`` of docs/install.md does.

Held: no task of the array fails or is refused (each ends COMPLETED, once), no node is drained,
each task's record reaches accounting and `slurm-gpu summary` reads it; the journal shows each
node's hooks run by the second release once switched. Rolled back, the node's health check (the
first release again) leaves the second one's state file as it is, says so in one line, and drains
nothing."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List

import pytest

from healthcheck.hooklib.runlog import read_runs
from healthcheck.records import admin_comment
from slurm_hooks.lab import rootfs
from slurm_hooks.lab.paths import NODES
from slurm_hooks.lab.releases import current as lab_release

from ..conftest import ROOT, tracked_copy
from .conftest import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.rootfs_release]

ROLL = "/opt/slurm-gpu-rolling"          # inside the root filesystem
CONTROLLER = "slurmctld"                 # EpilogSlurmctld's node in the journal (and its link)
# slurm.conf key -> the lab's wrapper in $LAB/hooks
HOOKS = {"Prolog": "prolog", "Epilog": "epilog", "EpilogSlurmctld": "epilog-slurmctld",
         "HealthCheckProgram": "healthcheck"}
TASKS = 24
SYSTEM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def current_version() -> str:
    with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as handle:
        return re.search(r"^version = (\S+)$", handle.read(), re.MULTILINE).group(1)


def bump(path: str, pattern: str, replacement: str) -> None:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"{path}: {pattern!r} matched {count} times"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def second_release(tmp_path) -> Dict[str, str]:
    """This tree as its next release: version X.Y+1.0, health-state format 2. Its wheel."""
    first = current_version()
    major, minor = first.split(".")[:2]
    second = f"{major}.{int(minor) + 1}.0"
    source = tracked_copy(tmp_path / "second-source")
    bump(os.path.join(source, "setup.cfg"), r"^version = \S+$", f"version = {second}")
    for package in ("healthcheck", "slurm_hooks"):
        bump(os.path.join(source, package, "__init__.py"), r'^__version__ = "[^"]+"$', f'__version__ = "{second}"')
    bump(os.path.join(source, "healthcheck", "actions", "state.py"), r"^VERSION = 1$", "VERSION = 2")
    out = tmp_path / "second-wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
                           "-w", str(out), source], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheels = [name for name in os.listdir(out) if name.endswith(".whl")]
    assert len(wheels) == 1 and second in wheels[0], wheels
    return {"first": first, "second": second, "wheel": str(out / wheels[0])}


def entered(root: str, *argv: str, env=None, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(rootfs.enter_argv(root, list(argv)), capture_output=True, text=True,
                          env=env or SYSTEM_ENV, timeout=timeout, stdin=subprocess.DEVNULL)
    return done


def install_second(lab, root: str, wheel: str) -> str:
    """A venv of the second release in the root filesystem, as the lab installs its own (its
    python3, the lab's dependency wheels, no index)."""
    target = f"{ROLL}/second"
    made = entered(root, "/usr/bin/python3", "-m", "venv", "--system-site-packages", target)
    assert made.returncode == 0, made.stderr
    wheels = os.path.join(lab.paths.rootfs_dir, "wheels")
    done = entered(root, f"{target}/bin/python", "-m", "pip", "--disable-pip-version-check", "-q", "install",
                   "--no-index", "--find-links", wheels, wheel)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return target


def switch(root: str, node: str, venv: str) -> float:
    """Point ``node``'s link at ``venv`` in one rename; the time it did."""
    link = rootfs.inside(root, f"{ROLL}/nodes/{node}")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    temporary = link + ".new"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(venv, temporary)
    os.replace(temporary, link)
    return time.time()


def rolling_wrapper(lab, hook: str, wrapper: str, config: str) -> str:
    """The lab's wrapper with the node's link for the install, and this test's config."""
    with open(lab.paths.hook(hook), encoding="utf-8") as handle:
        text = handle.read()
    text = text.replace(lab.paths.hook(hook), wrapper)        # re-entering the root filesystem runs this one
    run = f"exec {rootfs.VENV}/bin/"
    assert text.count(run) == 1, text
    text = text.replace(run, f'exec {ROLL}/nodes/"${{SLURMD_NODENAME:-{CONTROLLER}}}"/bin/')
    assert text.count(lab.paths.hooks_config) == 1, text
    return text.replace(lab.paths.hooks_config, config)


def rolling_config(lab, tmp_path) -> str:
    """The lab's hooks config with this test's state and metrics dirs and absolute profile paths."""
    with open(lab.paths.hooks_config, encoding="utf-8") as handle:
        text = handle.read()
    sim_dir = os.path.dirname(lab.paths.hooks_config)
    text, count = re.subn(r"^state_dir = .*$", f'state_dir = "{tmp_path / "state"}"', text, count=1,
                          flags=re.MULTILINE)
    assert count == 1
    text = re.sub(r"^textfile_dir = .*$", f'textfile_dir = "{tmp_path / "metrics"}"', text, count=1,
                  flags=re.MULTILINE)
    text = re.sub(r'= "((?!/)[^"]*\.toml)"', lambda m: f'= "{os.path.join(sim_dir, m.group(1))}"', text)
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def drained(lab) -> List[str]:
    listed = lab.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.splitlines()
    return sorted({line.split()[0] for line in listed if re.search(r"drain|down|fail", line)})


def reconfigure(lab) -> None:
    done = lab.run("scontrol", "reconfigure")
    assert done.returncode == 0, done.stderr


def ran(state: str, hook: str, node: str, version: str, since: float) -> bool:
    return any(e.get("hook") == hook and e.get("node") == node and e.get("version") == version
               and e.get("time", 0) >= since for e in read_runs(state))


def tasks_of(lab, job: str) -> List[List[str]]:
    """Every incarnation of the array's tasks: [JobID, State, AdminComment]."""
    shown = lab.run("sacct", "-D", "-X", "-n", "-P", "--delimiter=\x1f", "-j", job, "-o", "JobID,State,AdminComment")
    assert shown.returncode == 0, shown.stderr
    return [line.split("\x1f") for line in shown.stdout.splitlines() if line.strip()]


def test_a_rolling_upgrade_and_a_rollback_lose_no_job_and_no_record(lab, cli, tmp_path):
    release = lab_release(lab.paths)
    assert release.rootfs, f"Slurm {release.version} runs from the host's packages: no root filesystem to install into"
    root = lab.paths.rootfs(release.version)
    versions = second_release(tmp_path)
    config = rolling_config(lab, tmp_path)
    state = str(tmp_path / "state")
    wrappers = os.path.join(lab.paths.root, "rolling-hooks")
    slurm_conf = lab.paths.slurm_conf
    with open(slurm_conf, encoding="utf-8") as handle:
        original_conf = handle.read()
    wait_for("the lab's nodes idle", lambda: not drained(lab) and len(
        [line for line in lab.run("sinfo", "-h", "-N", "-p", "low", "-o", "%T").stdout.split() if line == "idle"])
        == len(NODES), timeout=180)
    try:
        second = install_second(lab, root, versions["wheel"])
        for node in (*NODES, CONTROLLER):
            switch(root, node, rootfs.VENV)
        os.makedirs(wrappers, exist_ok=True)
        conf = original_conf
        for key, hook in HOOKS.items():
            path = os.path.join(wrappers, hook)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(rolling_wrapper(lab, hook, path, config))
            os.chmod(path, 0o755)
            conf, count = re.subn(rf"^{key}=\S+$", f"{key}={path}", conf, flags=re.MULTILINE)
            assert count == 1, f"the lab's slurm.conf has {count} {key}= lines"
        with open(slurm_conf, "w", encoding="utf-8") as handle:
            handle.write(conf)
        reconfigure(lab)

        # Jobs keep ending: one task per node at a time (all of a node's CPUs), one GPU each.
        submitted = lab.run("sbatch", "--parsable", f"--array=1-{TASKS}%{len(NODES)}", "-c", "8", "--gres=gpu:1",
                            "-o", "/dev/null", "--wrap", "sleep 3")
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]
        began = time.time()
        for node in NODES:
            wait_for(f"the first release's prolog on {node}", lambda: ran(state, "prolog", node, versions["first"],
                                                                        began), timeout=180)
        # One node at a time: switched, then a job's prolog and epilog by the second release there.
        for node in NODES:
            at = switch(root, node, second)
            wait_for(f"the second release's prolog and epilog on {node}", lambda: ran(
                state, "prolog", node, versions["second"], at) and ran(state, "epilog", node, versions["second"], at),
                timeout=180)
            assert not drained(lab)
        at = switch(root, CONTROLLER, second)
        wait_for("the second release's EpilogSlurmctld", lambda: ran(state, "epilog_slurmctld", CONTROLLER,
                                                                      versions["second"], at), timeout=180)
        wait_for(f"the array's {TASKS} tasks ended", lambda: (lambda rows: len(rows) == TASKS and all(
            not re.match(r"PENDING|RUNNING|REQUEUED|CONFIGURING|COMPLETING", row[1]) for row in rows))(
            [row for row in tasks_of(lab, job) if "_" in row[0] and "[" not in row[0]]), timeout=300)

        # No task failed or was refused: each ended COMPLETED, once; no node drained.
        rows = [row for row in tasks_of(lab, job) if "_" in row[0]]
        assert sorted(row[0] for row in rows) == sorted(f"{job}_{n}" for n in range(1, TASKS + 1)), rows
        assert {row[1] for row in rows} == {"COMPLETED"}, rows
        assert drained(lab) == []
        # Each task's record reached accounting (EpilogSlurmctld's job-level entry), whichever
        # release wrote it, and `slurm-gpu summary` reads them all.
        def recorded():
            entries = {row[0]: admin_comment.parse(row[2]) for row in tasks_of(lab, job) if "_" in row[0]}
            return all(any(e.get("node") == "*" and e.get("class") == "COMPLETED" for e in found)
                       for found in entries.values()) and entries
        wait_for("every task's record in accounting", recorded, timeout=180)
        ids = ",".join(f"{job}_{n}" for n in range(1, TASKS + 1))
        summary = cli("summary", "--json", "--jobs", "--since", f"@{int(began) - 60}", "--job", ids, env=lab.env,
                      timeout=120)
        assert summary.returncode == 0, summary.stderr
        report = json.loads(summary.stdout)
        assert report["jobs"] == TASKS and report["by_cause"]["COMPLETED"]["jobs"] == TASKS, report["by_cause"]
        # Both releases ran hooks, and nothing of theirs went wrong.
        runs = list(read_runs(state))
        assert {e.get("version") for e in runs} == {versions["first"], versions["second"]}
        assert not [e for e in runs if e.get("result") in ("error", "tool-error", "watchdog", "newer-state")], runs

        # Rollback of one node: its state file, written by the second release in format 2, is
        # left as it is by the first release's health check, which says so once and drains nothing.
        node = NODES[0]
        health = os.path.join(state, "health", f"{node}.json")
        wait_for(f"the second release's health state of {node}", lambda: os.path.isfile(health) and json.load(
            open(health, encoding="utf-8")).get("version") == 2, timeout=60)
        at = switch(root, node, rootfs.VENV)
        wait_for(f"the first release's health check on {node} after the rollback",
                 lambda: ran(state, "healthcheck", node, versions["first"], at), timeout=60)
        with open(health, "rb") as handle:
            written = handle.read()
        by_hand = entered(root, f"{rootfs.VENV}/bin/slurm-gpu-healthcheck", "--node", node,
                          env=dict(SYSTEM_ENV, SLURM_CONF=slurm_conf, SLURM_GPU_HOOKS_CONFIG=config), timeout=120)
        assert by_hand.returncode == 0, by_hand.stderr
        lines = by_hand.stderr.strip().splitlines()
        assert len(lines) == 1 and "format 2 of a newer slurm-gpu-hooks" in lines[0], lines
        with open(health, "rb") as handle:
            assert handle.read() == written
        assert json.loads(written)["version"] == 2
        assert drained(lab) == []
    finally:
        with open(slurm_conf, "w", encoding="utf-8") as handle:
            handle.write(original_conf)
        reconfigure(lab)
        shutil.rmtree(wrappers, ignore_errors=True)
        shutil.rmtree(rootfs.inside(root, ROLL), ignore_errors=True)
        for node in drained(lab):
            lab.run("scontrol", "update", f"nodename={node}", "state=resume")
