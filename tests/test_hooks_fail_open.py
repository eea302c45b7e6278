"""A hook that cannot do its work because the tool is broken exits 0 with one line on stderr:
for the prolog a non-zero exit drains the node. Proven through each hook's console-script entry
point (what slurmd runs), so whatever a hook's body becomes, its entry keeps the policy."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from importlib import metadata

import pytest

from healthcheck.hooklib import skeleton

from .conftest import run_cli

HOOKS = {"slurm-gpu-prolog": "prolog", "slurm-gpu-epilog": "epilog", "slurm-gpu-healthcheck": "healthcheck",
         "slurm-gpu-taskprolog": "taskprolog"}
BIN = os.path.dirname(sys.executable)


def entry_point(name: str):
    scripts = metadata.entry_points()
    # Python 3.9's entry_points() is a dict by group; 3.10+ select by keyword.
    scripts = scripts.select(group="console_scripts") if hasattr(scripts, "select") else scripts["console_scripts"]
    found = [ep for ep in scripts if ep.name == name]
    # A 3.9 venv with an editable install can list one distribution twice: same target, fine.
    assert found and len({ep.value for ep in found}) == 1, f"console script {name}: {found}"
    return found[0].load()


def nul_state_dir(tmp_path) -> str:
    path = tmp_path / "nul.toml"
    path.write_text('[paths]\nstate_dir = "/var/tmp/x\\u0000y"\n')
    return str(path)


def deeply_nested(tmp_path) -> str:
    path = tmp_path / "nested.toml"
    path.write_text("[thresholds]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    return str(path)


def fifo(tmp_path) -> str:
    path = tmp_path / "config.fifo"
    os.mkfifo(path)
    return str(path)


def endless(tmp_path) -> str:
    return "/dev/zero"


BROKEN_CONFIGS = {"nul-byte-state-dir": nul_state_dir, "nested-toml": deeply_nested,
                  "fifo": fifo, "dev-zero": endless}


@pytest.mark.parametrize("config", sorted(BROKEN_CONFIGS))
@pytest.mark.parametrize("command", sorted(HOOKS))
def test_each_hook_exits_zero_with_one_line_when_its_config_is_unusable(tmp_path, command, config):
    path = BROKEN_CONFIGS[config](tmp_path)
    env = {"SLURM_GPU_HOOKS_CONFIG": path, "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "7",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
    # The timeout only keeps a hang (a FIFO read) from stalling the suite; it asserts nothing.
    done = subprocess.run([os.path.join(BIN, command)], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"slurm-gpu-{HOOKS[command]}: ")


@pytest.mark.parametrize("error", [RuntimeError("a bug"), RecursionError("maximum recursion depth exceeded"),
                                   MemoryError(), KeyError("state_dir"), ValueError("embedded null byte"),
                                   KeyboardInterrupt()], ids=lambda exc: type(exc).__name__)
@pytest.mark.parametrize("command", sorted(HOOKS))
def test_each_entry_point_catches_whatever_its_body_raises(monkeypatch, capsys, command, error):
    """Whatever goes wrong inside (here: loading the config), the entry point fails open."""
    from healthcheck.config import Config

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(Config, "load", classmethod(broken))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")
    monkeypatch.setattr(sys, "argv", [command])      # what slurmd runs: no arguments (not pytest's)
    main = entry_point(command)
    assert main() == 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"slurm-gpu-{HOOKS[command]}: internal error" in err and type(error).__name__ in err


def test_a_hook_that_decides_its_own_exit_status_keeps_it():
    def decides():
        raise SystemExit(1)

    with pytest.raises(SystemExit):
        skeleton.run_hook("prolog", decides)
    assert skeleton.run_hook("prolog", lambda: 1) == 1


@pytest.mark.parametrize("config", ["nul-byte-state-dir", "nested-toml", "fifo", "dev-zero"])
def test_config_check_rejects_what_the_hooks_cannot_use(tmp_path, config):
    path = BROKEN_CONFIGS[config](tmp_path)
    result = run_cli(["config", "check", path])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(path + ": ") and "Traceback" not in result.stderr, lines


def test_a_regular_config_file_is_still_read_after_the_refusals(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[gpu]\nprobe_timeout_s = 2.0\n')
    assert stat.S_ISREG(os.stat(path).st_mode)
    assert run_cli(["config", "check", str(path)]).exit_code == 0


def test_a_hook_body_runs_without_the_cycle_collector_and_the_heap_is_frozen_at_exit(monkeypatch):
    """run_hook (and each hook's main, around its imports): no cyclic GC during the body, the
    collector back for a caller that goes on (a test, ``slurm-gpu``), gc.freeze registered to
    run at exit, once."""
    import gc

    from healthcheck.hooklib import nogc
    from slurm_hooks import prolog

    registered = []
    monkeypatch.setattr(nogc.atexit, "register", registered.append)
    monkeypatch.setattr(nogc, "_FREEZE_REGISTERED", [])
    seen = []
    assert gc.isenabled()
    assert skeleton.run_hook("prolog", lambda: seen.append(gc.isenabled()) or 0) == 0
    assert skeleton.run_hook("prolog", lambda: 1 // 0) == 0           # fails open, collector back too
    with nogc.short_process():
        assert skeleton.run_hook("prolog", lambda: seen.append(gc.isenabled()) or 0) == 0
        seen.append(gc.isenabled())                                   # still off: the outer one decides
    assert prolog.main(["--help"]) == 0                               # returns early, collector back
    assert seen == [False, False, False] and gc.isenabled()
    assert registered == [gc.freeze]
