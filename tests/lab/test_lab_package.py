"""The .deb on a node of the lab: scripts/build-packages' package installed with `dpkg -i` into
the lab release's Debian root filesystem (24.11: Debian 13, its own dpkg and dpkg database, its
python3), where slurmd and slurmctld run; slurm.conf then names the package's commands, and
Slurm runs them: the Prolog, Epilog and EpilogSlurmctld of a job, the HealthCheckProgram on its
interval, which drains a node with a double-bit ECC error and resumes it once the error is gone.
An upgrade to a rebuilt package keeps the edited config, and the next job runs through the new
venv. Everything is taken back afterwards: slurm.conf, the package (purged).

The root filesystem is entered with its /etc, /usr and /opt (slurm_hooks/lab/rootfs.py), so the
venv postinst makes under /opt/slurm-gpu-hooks is the one slurmd runs. The config the admin
edits is the package's conffile, written here for the lab's simulated nodes (the lab's own
config, with a state dir of this test's): the hooks find it at its packaged path. Only releases
run from a root filesystem carry this test (a 22.05 lab is the host's own Debian 12: installing
there would install into this machine)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import List

import pytest

from healthcheck.config import DEFAULT_CONFIG_PATH
from healthcheck.hooklib.runlog import read_runs
from slurm_hooks.lab import rootfs
from slurm_hooks.lab.releases import current as lab_release

from ..conftest import ROOT
from .conftest import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.rootfs_release]

BUILD = os.path.join(ROOT, "scripts", "build-packages")
OPT = "/opt/slurm-gpu-hooks"
HOOKS = {"Prolog": "slurm-gpu-prolog", "Epilog": "slurm-gpu-epilog", "EpilogSlurmctld": "slurm-gpu-epilog",
         "TaskProlog": "slurm-gpu-taskprolog", "HealthCheckProgram": "slurm-gpu-healthcheck"}
DBE = "gpu.3.ecc.volatile_uncorrected=2"
SYSTEM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# A chroot of the root filesystem, as dpkg on a node runs: its /dev and /proc mounted in a
# private mount namespace (gone with it).
CHROOT = r"""
set -eu
root=$1; shift
mount --make-rprivate /
mount --bind /dev "$root/dev"
mount -t proc proc "$root/proc"
exec chroot "$root" "$@"
"""


def version() -> str:
    with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as handle:
        return re.search(r"^version = (\S+)$", handle.read(), re.MULTILINE).group(1)


def build(out, *extra: str) -> str:
    env = dict(os.environ, PYTHON=os.path.join(ROOT, ".venv", "bin", "python"))
    if not os.path.exists(env["PYTHON"]):
        import sys

        env["PYTHON"] = sys.executable
    done = subprocess.run([BUILD, "--out", str(out), *extra], capture_output=True, text=True, env=env,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    deb = [path for path in done.stdout.split() if path.endswith(".deb")]
    assert len(deb) == 1, done.stdout
    return deb[0]


def in_chroot(root: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "sh", "-c", CHROOT, "chroot", root, *argv], capture_output=True,
                          text=True, env=SYSTEM_ENV, timeout=600, stdin=subprocess.DEVNULL)


def dpkg(root: str, *argv: str) -> subprocess.CompletedProcess:
    done = in_chroot(root, "dpkg", *argv)
    assert done.returncode == 0, f"dpkg {' '.join(argv)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def installed(root: str) -> bool:
    done = in_chroot(root, "dpkg-query", "-W", "-f", "${Status}", "slurm-gpu-hooks")
    return done.returncode == 0 and done.stdout.strip() == "install ok installed"


def on_node(root: str, *argv: str) -> subprocess.CompletedProcess:
    """Run a command inside the root filesystem, as root on the node with no config set in its
    environment (the package's commands read the conffile)."""
    return subprocess.run(rootfs.enter_argv(root, argv), capture_output=True, text=True, env=SYSTEM_ENV,
                          timeout=120, stdin=subprocess.DEVNULL)


def sim(root: str, *argv: str) -> None:
    """The packaged `slurm-gpu sim` (its simulated nodes' state lives in the conffile's state dir)."""
    done = on_node(root, "/usr/bin/slurm-gpu", "sim", *argv)
    assert done.returncode == 0, done.stdout + done.stderr


def drained(lab, node: str) -> bool:
    return bool(re.search(r"^\s*State=\S*DRAIN", node_state(lab, node), re.MULTILINE))


def package_slurm_conf(text: str) -> str:
    """The lab's slurm.conf with each hook program the package's: /opt/slurm-gpu-hooks/current/bin/..."""
    for key, command in HOOKS.items():
        text, count = re.subn(rf"^{key}=\S+$", f"{key}={OPT}/current/bin/{command}", text, flags=re.MULTILINE)
        assert count == 1, f"the lab's slurm.conf has {count} {key}= lines"
    return text


def idle_nodes(lab) -> List[str]:
    listed = lab.run("sinfo", "-h", "-N", "-p", "low", "-o", "%N %T").stdout.split("\n")
    return sorted({line.split()[0] for line in listed if line.strip().endswith(" idle")})


def node_state(lab, node: str) -> str:
    return lab.run("scontrol", "show", "node", node).stdout


def reconfigure(lab) -> None:
    done = lab.run("scontrol", "reconfigure")
    assert done.returncode == 0, done.stderr


def run_job(lab, node: str, state: str) -> str:
    submitted = lab.run("sbatch", "--parsable", "-w", node, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wanted = {("prolog", node, job), ("epilog", node, job), ("epilog_slurmctld", "slurmctld", job)}

    def ran():
        return wanted <= {(e.get("hook"), e.get("node"), str(e.get("job_id"))) for e in read_runs(state)}

    wait_for(f"the packaged hooks' journal entries for job {job} on {node}", ran, timeout=120)
    return job


def test_the_deb_installed_on_the_release_root_filesystem_runs_slurms_hooks(lab, tmp_path):
    release = lab_release(lab.paths)
    assert release.rootfs, f"Slurm {release.version} runs from the host's packages: no root filesystem to install into"
    root = lab.paths.rootfs(release.version)
    first = build(tmp_path / "rev1")
    second = build(tmp_path / "rev2", "--revision", "2")
    state = tmp_path / "state"
    config = rootfs.inside(root, DEFAULT_CONFIG_PATH)
    slurm_conf = lab.paths.slurm_conf
    with open(slurm_conf, encoding="utf-8") as handle:
        original_conf = handle.read()
    # The tests before this one may leave their jobs completing for a moment.
    node, sick = wait_for("two idle lab nodes", lambda: (lambda idle: idle[:2] if len(idle) >= 2 else None)(
        idle_nodes(lab)), timeout=180)
    staged = tempfile.mkdtemp(prefix="slurm-gpu-package-test-", dir=os.path.join(root, "tmp"))
    for deb in (first, second):
        shutil.copyfile(deb, os.path.join(staged, os.path.basename(deb)))
    inner = lambda deb: "/" + os.path.relpath(os.path.join(staged, os.path.basename(deb)), root)  # noqa: E731
    try:
        if installed(root):          # left by a run that was killed: start from a node without it
            dpkg(root, "--purge", "slurm-gpu-hooks")
        # dpkg -i with the node's own dependency check (python3, python3-venv of Debian 13)
        dpkg(root, "-i", inner(first))
        assert installed(root)
        assert os.readlink(rootfs.inside(root, f"{OPT}/current")) == f"{version()}-1"
        with open(config, encoding="utf-8") as handle:
            packaged = handle.read()
        # The admin edits the conffile: here, the lab's nodes (simulated GPUs, its Slurm), with
        # this test's state dir and metrics dir.
        with open(lab.paths.hooks_config, encoding="utf-8") as handle:
            edited = handle.read()
        sim_dir = os.path.dirname(lab.paths.hooks_config)
        edited = re.sub(r"^state_dir = .*$", f'state_dir = "{state}"', edited, count=1, flags=re.MULTILINE)
        edited = re.sub(r"^textfile_dir = .*$", f'textfile_dir = "{tmp_path / "metrics"}"', edited, count=1,
                        flags=re.MULTILINE)
        # slurmd runs the HealthCheckProgram without SLURM_CONF: the config names the lab's slurm.conf
        edited, count = re.subn(r"^(bin_dir = .*)$", lambda m: f'{m.group(1)}\nconf = "{slurm_conf}"', edited,
                                count=1, flags=re.MULTILINE)
        assert count == 1
        # the simulated profiles' paths are relative to the config's directory: make them the lab's
        edited = re.sub(r'= "((?!/)[^"]*\.toml)"', lambda m: f'= "{os.path.join(sim_dir, m.group(1))}"', edited)
        assert edited != packaged
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(edited)
        checked = on_node(root, "/usr/bin/slurm-gpu", "config", "check", DEFAULT_CONFIG_PATH)
        assert checked.returncode == 0, checked.stdout + checked.stderr

        with open(slurm_conf, "w", encoding="utf-8") as handle:
            handle.write(package_slurm_conf(original_conf))
        reconfigure(lab)
        shown = lab.run("scontrol", "show", "config").stdout
        assert re.search(rf"^HealthCheckProgram\s+= {OPT}/current/bin/slurm-gpu-healthcheck$", shown, re.MULTILINE)

        # 1. A job: Prolog and Epilog on its node, EpilogSlurmctld on the controller, all the package's.
        job = run_job(lab, node, str(state))
        assert job not in {str(e.get("job_id")) for e in read_runs(lab.paths.state)}

        # 2. slurmd's HealthCheckProgram (the package's) drains a node with a double-bit ECC error,
        #    with the tool's reason, and resumes it once the error is gone.
        since = time.time()
        wait_for(f"the packaged health check's run on {sick}", lambda: any(
            e.get("hook") == "healthcheck" and e.get("node") == sick and e.get("time", 0) > since
            for e in read_runs(str(state))), timeout=90)
        assert not drained(lab, sick)
        sim(root, "inject", sick, DBE)
        wait_for(f"{sick} drained by the packaged health check", lambda: drained(lab, sick), timeout=90)
        shown = node_state(lab, sick)
        assert re.search(r"Reason=gpu-hooks: v1 gpu\.ecc\.uncorrectable gpu3 dbe:2; ", shown), shown
        assert os.path.isfile(os.path.join(state, "health", f"{sick}.last.json"))   # its state, not the lab's
        sim(root, "reset", sick)
        wait_for(f"{sick} resumed by the packaged health check", lambda: not drained(lab, sick), timeout=90)

        # 3. Upgrade to a rebuilt package while the cluster runs: the edited config is kept, and
        #    the next job runs through the new venv.
        dpkg(root, "-i", inner(second))
        assert os.readlink(rootfs.inside(root, f"{OPT}/current")) == f"{version()}-2"
        with open(config, encoding="utf-8") as handle:
            assert handle.read() == edited
        assert not [name for name in os.listdir(os.path.dirname(config)) if ".dpkg-" in name]
        run_job(lab, node, str(state))
    finally:
        with open(slurm_conf, "w", encoding="utf-8") as handle:
            handle.write(original_conf)
        reconfigure(lab)
        if drained(lab, sick):
            lab.run("scontrol", "update", f"nodename={sick}", "state=resume")
        if installed(root):
            dpkg(root, "--purge", "slurm-gpu-hooks")
        shutil.rmtree(staged, ignore_errors=True)
    assert not os.path.lexists(config) and not os.path.lexists(rootfs.inside(root, OPT))
