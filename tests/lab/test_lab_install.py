"""docs/install.md, followed as written on the lab's real Slurm: from a slurm.conf without the
hooks, the documented commands install the wheel into a versioned venv behind a stable path,
check the config and a node, add `slurm-gpu slurm-conf`'s lines and `scontrol reconfigure`;
a job then runs through the installed hooks (their own journal says so, in their own state dir).

Where the lab's release lives in a Debian root filesystem (24.11, 26.05), every step runs in
there, as on a node of that Debian: its python3 makes the venv, its scontrol reconfigures, and
/etc is its /etc; on 22.05, the host's.

Stand-ins, and only these: a temporary directory for /opt, the lab's slurm.conf for
/etc/slurm/slurm.conf; in a root filesystem, pip trusts the CA bundle the host's pip does (the
node's network is the host's: a proxy that re-signs TLS needs its CA, as on a site's nodes). The config goes where the doc says, /etc/slurm-gpu-hooks/config.toml
(HealthCheckProgram has no other way to find it); whatever was there is put back afterwards,
as are the lab's slurm.conf and its hooks."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Dict, List

import pytest

from healthcheck.hooklib.runlog import read_runs
from slurm_hooks.lab import rootfs
from slurm_hooks.lab.releases import current as lab_release

from ..conftest import ROOT
from .conftest import wait_for

pytestmark = pytest.mark.lab

DOC = os.path.join(ROOT, "docs", "install.md")
CONFIG_DIR = "/etc/slurm-gpu-hooks"
CONFIG = os.path.join(CONFIG_DIR, "config.toml")
HOOK_SETTINGS = re.compile(r"^(PrologFlags|Prolog|Epilog|EpilogSlurmctld|TaskProlog|HealthCheckProgram"
                           r"|HealthCheckInterval|HealthCheckNodeState)=", re.MULTILINE)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def doc_blocks() -> Dict[str, str]:
    """The ```bash blocks of install.md marked <!-- tested: NAME -->, by name."""
    with open(DOC, encoding="utf-8") as handle:
        text = handle.read()
    return dict(re.findall(r"<!-- tested: ([\w-]+) -->\n```bash\n(.*?)```", text, re.DOTALL))


def test_the_doc_marks_the_steps_this_test_follows():
    blocks = doc_blocks()
    assert list(blocks) == ["install", "config", "check", "slurm-conf"]
    assert "slurm-gpu slurm-conf >> /etc/slurm/slurm.conf" in blocks["slurm-conf"]
    assert "scontrol reconfigure" in blocks["slurm-conf"]


def test_following_install_md_runs_a_job_through_the_installed_hooks(lab, built_wheel, tmp_path):
    blocks = doc_blocks()
    version = re.search(r"^V=(\S+)$", blocks["install"], re.MULTILINE).group(1)
    assert os.path.basename(built_wheel) == f"slurm_gpu_hooks-{version}-py3-none-any.whl", \
        "install.md's V= must be the version the wheel builds"
    opt = tmp_path / "opt"
    state = tmp_path / "state"
    slurm_conf = lab.paths.slurm_conf
    env = {"PATH": SYSTEM_PATH, "SLURM_CONF": slurm_conf, "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    release = lab_release(lab.paths)
    # The node's filesystem: the release's root filesystem (entered for every step), else the host's.
    root = lab.paths.rootfs(release.version) if release.rootfs else "/"
    config, config_dir = rootfs.inside(root, CONFIG), rootfs.inside(root, CONFIG_DIR)

    if release.rootfs:
        bundle = _host_pip_cert()
        if bundle:
            shutil.copyfile(bundle, tmp_path / "ca.crt")
            env["PIP_CERT"] = str(tmp_path / "ca.crt")

    def on_node(argv: List[str]) -> List[str]:
        return rootfs.enter_argv(root, argv) if release.rootfs else argv

    def run(name: str, timeout: float = 300) -> subprocess.CompletedProcess:
        script = blocks[name].replace("/opt/slurm-gpu-hooks", str(opt / "slurm-gpu-hooks"))
        script = script.replace("/etc/slurm/slurm.conf", slurm_conf)
        done = subprocess.run(on_node(["/bin/bash", "-euo", "pipefail", "-c", script]), capture_output=True,
                              text=True, cwd=os.path.dirname(built_wheel), env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"install.md step {name!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        return done

    with open(slurm_conf, encoding="utf-8") as handle:
        original_conf = handle.read()
    saved_config = _move_aside(config, tmp_path)
    made_config_dir = not os.path.isdir(config_dir)
    try:
        # The clean state: a cluster whose slurm.conf has none of the hooks' settings.
        _write(slurm_conf, HOOK_SETTINGS.sub("#removed: ", original_conf))
        _reconfigure(lab)

        run("install")
        current = opt / "slurm-gpu-hooks" / "current"
        assert os.readlink(current) == version and (current / "bin" / "slurm-gpu-prolog").is_file()
        # made with the node's own python3 (the release's Debian's, on a root filesystem release)
        made_with, node_python = (
            subprocess.run(on_node([python, "-c", "import sys; print(sys.version)"]), capture_output=True, text=True,
                           env=env, timeout=60, stdin=subprocess.DEVNULL)
            for python in (str(current / "bin" / "python"), "python3"))
        assert made_with.stdout and made_with.stdout == node_python.stdout, (made_with, node_python)

        # Step 3: the admin writes the config at the documented path; here, for the lab's nodes
        # (simulated GPUs, slurm.conf where the lab has it, gres.conf's device files).
        os.makedirs(config_dir, mode=0o755, exist_ok=True)
        _write(config, f'[paths]\nstate_dir = "{state}"\n[gpu]\nbackend = "sim"\n[sim]\nprofile = "h100-healthy"\n'
                       f'[slurm]\nconf = "{slurm_conf}"\n'
                       f'[prolog]\ngpu_devices = "{os.path.join(lab.paths.fakedev, "{node}")}"\n'
                       '[[nodes]]\nmatch = "gpu[1-3]"\ngpus = 8\ngpu_model = "H100"\nnvlinks_per_gpu = 18\n')
        run("config")
        run("check")

        run("slurm-conf")
        bin_dir = current / "bin"
        shown = lab.run("scontrol", "show", "config").stdout
        # 23.02 on shows each Prolog/Epilog of a list by its index: `Prolog[0] = ...`
        assert re.search(rf"^Prolog(\[0\])?\s+= {re.escape(str(bin_dir))}/slurm-gpu-prolog$", shown, re.MULTILINE), shown
        assert re.search(rf"^HealthCheckProgram\s+= {re.escape(str(bin_dir))}/slurm-gpu-healthcheck$", shown,
                         re.MULTILINE)
        assert re.search(rf"^TaskProlog\s+= {re.escape(str(bin_dir))}/slurm-gpu-taskprolog$", shown, re.MULTILINE)

        node = wait_for("an idle lab node", lambda: _idle_nodes(lab)[:1], timeout=90)[0]
        submitted = lab.run("sbatch", "--parsable", "-w", node, "--gres=gpu:1", "-o", "/dev/null",
                            "--wrap", "true")
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]
        wanted = {("prolog", node, job), ("epilog", node, job), ("epilog_slurmctld", "slurmctld", job)}

        def ran():
            have = {(e.get("hook"), e.get("node"), str(e.get("job_id"))) for e in read_runs(str(state))}
            return wanted <= have

        wait_for(f"the installed hooks' journal entries for job {job} on {node}", ran, timeout=90)
        # Nothing of the lab's own hooks config was involved: their journal has no entry for the job.
        lab_entries = {str(e.get("job_id")) for e in read_runs(lab.paths.state)}
        assert job not in lab_entries
    finally:
        _write(slurm_conf, original_conf)
        _reconfigure(lab)
        _restore(config, saved_config)
        if made_config_dir and os.path.isdir(config_dir) and not os.listdir(config_dir):
            os.rmdir(config_dir)
        wait_for("every lab node idle again", lambda: len(_idle_nodes(lab)) == 3, timeout=60)


def _host_pip_cert() -> str:
    """The CA bundle the host's pip is told to trust ($PIP_CERT, else /etc/pip.conf's), or ""."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read("/etc/pip.conf")
    path = os.environ.get("PIP_CERT") or parser.get("global", "cert", fallback="")
    return path if path and os.path.isfile(path) else ""


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _move_aside(path: str, tmp_path) -> str:
    if not os.path.lexists(path):
        return ""
    aside = str(tmp_path / "config.toml.saved")
    shutil.move(path, aside)
    return aside


def _restore(path: str, aside: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    if aside:
        shutil.move(aside, path)


def _reconfigure(lab) -> None:
    done = lab.run("scontrol", "reconfigure")
    assert done.returncode == 0, done.stderr


def _idle_nodes(lab) -> List[str]:
    listed = lab.run("sinfo", "-h", "-N", "-p", "low", "-o", "%N %T").stdout.split("\n")
    return sorted(line.split()[0] for line in listed if line.strip().endswith(" idle"))
