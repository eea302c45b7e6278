"""docs/install.md's commands, run: every command in the page's code blocks either runs here
(without a cluster: in a copy of the repository, /opt and /etc moved under a temporary
directory) or is listed below with why it needs a cluster or a GPU node. A command added to
the page without a decision here fails the test. The lab follows the whole page against a real
Slurm (tests/lab/test_lab_install.py)."""
from __future__ import annotations

import os
import re
import subprocess
from typing import List, Tuple

import pytest

from .conftest import ROOT, tracked_copy

PAGE = os.path.join(ROOT, "docs", "install.md")

# Commands that need what this machine lacks; matched against the page's command lines.
NEEDS = {
    r"^scontrol reconfigure$": "a running slurmctld",
    r"^grep -E .* /etc/slurm/slurm\.conf$": "a cluster's slurm.conf",
    r"slurm-gpu slurm-conf >> /etc/slurm/slurm\.conf$": "a cluster's slurm.conf (run below into a file)",
    r"slurm-gpu check( --tier prolog)?$": "a GPU node (NVML); `check --sim` is tested in test_cli_scripting.py",
    r"slurm-gpu-healthcheck --dry-run$": "a GPU node and Slurm (tested on the lab: test_lab_healthcheck.py)",
    r"^apt-get install prometheus-node-exporter": "changes this machine's packages (the lab installs it)",
    r"slurm-gpu lab (up|env)": "the lab (root, its machine-wide lock): tests/lab",
    r"^sinfo$": "the lab's Slurm",
    r"^install -m 0644 etc/systemd/slurm-gpu-watch\.service /etc/systemd/system/$": "systemd (the lab runs the watcher)",
    r"^systemctl |^journalctl -u ": "systemd (the lab runs the watcher: test_lab_watch.py)",
    r"^scripts/build-packages( --revision 2)?$": "two package builds: tests/test_packages.py runs them",
    r"^apt-get install \./slurm-gpu-hooks_[0-9.]+-1_amd64\.deb$":
        "changes this machine's packages (tests/test_packages.py installs it with dpkg into a temporary root; "
        "the lab into its Debian 13 root filesystem)",
    r"^dnf install \./slurm-gpu-hooks-[0-9.]+-1\.el9\.x86_64\.rpm$": "an EL9 machine (the .rpm is inspected, not installed)",
}
# What does not need a cluster, each run as the page gives it.
RUNS = (r"^python3 -m venv ", r"^/tmp/slurm-gpu-build/bin/", r"^V=", r"^/opt/slurm-gpu-hooks/\$V/bin/pip install ",
        r"^ln -sfn ", r"^mv -T ", r"^install -d -m 0755 /etc/slurm-gpu-hooks$", r"^install -m 0644 etc/",
        r"slurm-gpu config check /etc/slurm-gpu-hooks/config\.toml$")


def code_lines() -> List[str]:
    """Shell command lines of the page's fenced bash blocks and indented code blocks (TOML
    snippets, which set keys, are not commands)."""
    with open(PAGE, encoding="utf-8") as handle:
        page = handle.read().splitlines()
    lines: List[str] = []                      # in the page's order
    fenced, previous = False, ""
    for line in page:
        if line.startswith("```"):
            fenced = line.strip() == "```bash" and not fenced
            previous = line
            continue
        if fenced or (line.startswith("    ") and not line.startswith("     ")
                      and (not previous.strip() or previous.startswith("    "))):
            lines.append(line.strip() if fenced else line[4:])
            previous = line if not fenced else previous
            continue
        previous = line
    commands = []
    for line in lines:
        line = re.sub(r"\s+#.*$", "", line).strip()
        if not line or line.startswith(("#", "[")) or re.match(r"^[a-z_]+ = ", line):
            continue
        commands.append(line)
    return commands


def classify() -> Tuple[List[str], List[str]]:
    runs, skipped = [], []
    for line in code_lines():
        if any(re.search(pattern, line) for pattern in NEEDS):
            skipped.append(line)
        elif any(re.search(pattern, line) for pattern in RUNS):
            runs.append(line)
        else:
            pytest.fail(f"docs/install.md: {line!r} is neither run by this test nor listed as needing a cluster",
                        pytrace=False)
    return runs, skipped


def test_every_command_of_install_md_is_run_or_needs_a_cluster():
    runs, skipped = classify()
    assert len(runs) >= 10 and len(skipped) >= 5


def test_the_install_commands_run_as_written(tmp_path):
    """Build the wheel in a throwaway venv (PEP 668 on Debian 12), install it into a versioned
    venv behind `current`, install and check the config, print the slurm.conf lines."""
    runs, _ = classify()
    repo = tracked_copy(tmp_path / "repo")
    opt, etc, build = tmp_path / "opt", tmp_path / "etc", tmp_path / "build-venv"

    def moved(line: str) -> str:
        line = line.replace("/opt/slurm-gpu-hooks", str(opt / "slurm-gpu-hooks"))
        line = line.replace("/etc/slurm-gpu-hooks", str(etc / "slurm-gpu-hooks"))
        line = line.replace("/tmp/slurm-gpu-build", str(build))
        return line.replace("./slurm_gpu_hooks-", "./dist/slurm_gpu_hooks-")
    os.makedirs(opt)
    script = "set -euo pipefail\n" + "\n".join(moved(line) for line in runs) + "\n"
    script += f"{opt}/slurm-gpu-hooks/current/bin/slurm-gpu slurm-conf > {tmp_path}/slurm.conf.lines\n"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "PIP_NO_INDEX"):
        if key in os.environ:
            env[key] = os.environ[key]
    done = subprocess.run(["bash", "-c", script], cwd=repo, capture_output=True, text=True, timeout=900, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (script, done.stdout[-3000:], done.stderr[-3000:])
    current = opt / "slurm-gpu-hooks" / "current"
    assert os.readlink(current) == "0.1.0" and os.access(current / "bin" / "slurm-gpu-prolog", os.X_OK)
    assert "# effective configuration" in done.stdout
    assert os.stat(etc / "slurm-gpu-hooks" / "config.toml").st_mode & 0o777 == 0o644
    lines = (tmp_path / "slurm.conf.lines").read_text()
    assert f"Prolog={current}/bin/slurm-gpu-prolog" in lines
    # What the wheel installs beside bin/ (docs/install.md: Monitoring, the manual).
    for shared in ("share/slurm-gpu-hooks/prometheus/slurm-gpu-hooks.rules.yml",
                   "share/slurm-gpu-hooks/grafana/slurm-gpu-hooks.json", "share/man/man1/slurm-gpu.1"):
        assert os.path.isfile(current / shared), shared


def test_dry_run_creates_no_more_than_docs_healthcheck_says(tmp_path):
    """docs/healthcheck.md: --dry-run changes nothing in Slurm and commits nothing; on a fresh
    node it may create the state dir and the kernel-log cursor's lock file, nothing else."""
    import sys

    state, metrics = tmp_path / "state", tmp_path / "metrics"
    config = tmp_path / "config.toml"
    config.write_text(f'[paths]\nstate_dir = "{state}"\n[health]\ntextfile_dir = "{metrics}"\n'
                      f'[slurm]\nbin_dir = "{tmp_path / "no-slurm"}"\n')
    done = subprocess.run([sys.executable, "-m", "healthcheck.healthcheck", "--config", str(config), "--node", "gpu1",
                           "--dry-run"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    made = sorted(os.path.relpath(os.path.join(top, name), state)
                  for top, dirs, files in os.walk(state) for name in files)
    assert made == ["kernellog/gpu1.health/.lock"]
    assert not metrics.exists()


def test_a_hook_without_a_config_file_says_it_runs_on_defaults(capsys):
    """docs/install.md: a missing config is one loud line per run (draining is on by default)."""
    from healthcheck.hooklib.skeleton import load_config_or_none

    for hook in ("prolog", "epilog", "healthcheck"):
        config = load_config_or_none({}, hook)
        assert config is not None and config.path is None and config.section("drain")["enabled"] is True
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"slurm-gpu-{hook}: no config file (/etc/slurm-gpu-hooks/config.toml is missing, "
                       "$SLURM_GPU_HOOKS_CONFIG unset): running on the built-in defaults, draining on"]
    assert load_config_or_none({}, "taskprolog") is not None and capsys.readouterr().err == ""


def test_the_example_config_runs_every_check_a_default_tier_has():
    # A tier set in the example replaces the default whole: the example's prolog list of an older
    # release ran no gpu.recovery_action, nvlink.fabric_health, nvlink.c2c or imex.domain.
    from healthcheck.config import Config

    example = Config.load(os.path.join(ROOT, "etc", "slurm-gpu-hooks.toml"))
    defaults = Config.builtin()
    assert {"nvlink.c2c", "imex.domain"} <= set(defaults.tier("prolog"))
    for tier in ("prolog", "health", "deep"):
        missing = set(defaults.tier(tier)) - set(example.tier(tier))
        assert not missing, (tier, sorted(missing))


def test_the_example_config_is_complete_and_valid():
    """etc/slurm-gpu-hooks.toml, "a complete, commented example", has every section."""
    from healthcheck.config import CONFIG_SCHEMA, Config, read_document

    path = os.path.join(ROOT, "etc", "slurm-gpu-hooks.toml")
    document = read_document(path)
    assert set(document) == set(CONFIG_SCHEMA), sorted(set(CONFIG_SCHEMA) - set(document))
    Config.load(path)
