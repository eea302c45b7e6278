"""One hook skeleton (``healthcheck.hooklib.skeleton.serve``): the four entry points (prolog, epilog,
health check, TaskProlog) hand it their parts; none of them carries its own start-up, watchdog,
fail-open or journal code (read from the source), and the skeleton does what each relied on."""
from __future__ import annotations

import ast
import gc
import os

import pytest

from healthcheck.hooklib import skeleton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINTS = ("slurm_hooks/prolog.py", "slurm_hooks/epilog.py", "slurm_hooks/taskprolog.py",
                "healthcheck/healthcheck.py")
# What the skeleton owns: an entry point that names one of these does it itself again.
SKELETON_NAMES = {"whole_run", "Watchdog", "kill_children", "run_hook", "help_requested", "journal",
                  "load_config_or_none", "_run_failing_open"}


def _tree(path):
    return ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)


def _calls(tree, name):
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)
    return [n.func.id for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_each_entry_point_is_a_composition_of_the_skeleton(path):
    tree = _tree(path)
    calls = _calls(tree, "main")
    assert "serve" in calls and "short_process" in calls, path
    assert calls.index("short_process") < calls.index("serve"), path
    named = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    named |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert named & SKELETON_NAMES == set(), path


class _Config:
    state_dir = "/nonexistent"
    deadline_s = 0.05


def _start(argv):
    return skeleton.HookRun("prolog", _Config(), "gpu1", "42", {"context": "prolog_slurmd"})


def test_the_skeleton_journals_the_ending_with_the_runs_fields(monkeypatch):
    lines = []
    monkeypatch.setattr(skeleton, "journal", lambda config, hook, node, job, **detail: lines.append((hook, node, job, detail)))
    status = skeleton.serve("prolog", [], lambda run: skeleton.Ending(1, {"result": "bad-node"}), start=_start,
                           deadline=lambda config: config.deadline_s)
    assert status == 1 and lines == [("prolog", "gpu1", "42", {"context": "prolog_slurmd", "result": "bad-node"})]


def test_the_skeletons_watchdog_stops_a_run_past_its_deadline(monkeypatch):
    monkeypatch.setattr(skeleton, "journal", lambda *a, **k: None)
    seen = []

    def forever(run):
        while True:
            pass

    def stopped(run, limit, where):
        seen.append((limit, "forever" in where))
        return skeleton.Ending(3)
    assert skeleton.serve("prolog", [], forever, start=_start, deadline=lambda config: config.deadline_s,
                         on_watchdog=stopped) == 3
    assert seen == [(0.05, True)]


def test_the_skeleton_fails_open_and_runs_without_the_collector(monkeypatch, capsys):
    monkeypatch.setattr(skeleton, "journal", lambda *a, **k: None)
    collecting = []

    def broken(run):
        collecting.append(gc.isenabled())
        raise RuntimeError("a bug")
    assert skeleton.serve("prolog", [], broken, start=_start) == 0
    assert collecting == [False] and "internal error, doing nothing (fail open): RuntimeError: a bug" in capsys.readouterr().err
    assert skeleton.serve("prolog", [], broken, start=lambda argv: 0) == 0       # no config: nothing run
    assert collecting == [False]


def test_a_hook_slurm_runs_refuses_arguments_and_answers_help(capsys):
    assert skeleton.serve("prolog", ["--bogus"], lambda run: skeleton.Ending(0), doc="The prolog.", start=_start) == 2
    assert skeleton.serve("prolog", ["--help"], lambda run: skeleton.Ending(0), doc="The prolog.", start=_start) == 0
    assert "The prolog." in capsys.readouterr().out
