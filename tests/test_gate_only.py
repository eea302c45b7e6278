"""Slurm's node state is changed from one module of the product: the drain gate
(``healthcheck/actions/gate.py``). Read from the source (every call, also inside functions): no
other module of ``healthcheck/`` or ``slurm_hooks/`` calls a backend's node-changing functions
or runs ``scontrol update``/``scontrol reboot`` itself. Aside: the backends that implement those
functions (``healthcheck/slurm/``) and the lab, which sets up and tears down its own cluster."""
from __future__ import annotations

import ast
import os
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GATE = os.path.join("healthcheck", "actions", "gate.py")
ASIDE = (os.path.join("healthcheck", "slurm") + os.sep, os.path.join("slurm_hooks", "lab") + os.sep)
# The backend's functions that change a node in Slurm (SlurmBackend), and the remediation's.
WRITES = {"drain", "resume", "reboot", "set_extra", "update_node"}
SCONTROL_WRITES = {"update", "reboot"}


def _sources() -> List[str]:
    out = []
    for package in ("healthcheck", "slurm_hooks"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            out += [os.path.relpath(os.path.join(folder, name), ROOT) for name in files if name.endswith(".py")]
    return sorted(out)


def _node_writes(path: str) -> List[str]:
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in WRITES:
            found.append(f"{path}:{node.lineno} .{func.attr}()")
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("drain_argv", "resume_argv"):
            continue                       # building the arguments (a dry run prints them) changes nothing
        args = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        for arg in node.args:
            if isinstance(arg, (ast.List, ast.Tuple)):
                args += [e.value for e in arg.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if "scontrol" in args and SCONTROL_WRITES & set(args):
            found.append(f"{path}:{node.lineno} scontrol {sorted(SCONTROL_WRITES & set(args))[0]}")
    return found


def test_only_the_gate_changes_a_node_in_slurm():
    offenders = [hit for path in _sources() if path != GATE and not path.startswith(ASIDE)
                 for hit in _node_writes(path)]
    assert offenders == []


def test_the_gate_does_change_nodes():
    # The test above would pass over an empty product; the gate is where the calls are.
    hits = _node_writes(GATE)
    assert any(".drain()" in hit for hit in hits) and any(".resume()" in hit for hit in hits)


def test_the_scan_sees_a_call_of_the_backend_and_a_scontrol_write(tmp_path, monkeypatch):
    sample = tmp_path / "healthcheck" / "x.py"
    sample.parent.mkdir()
    sample.write_text("def f(b, run):\n    b.resume('gpu1')\n    run('scontrol', ['update', 'nodename=gpu1'])\n")
    import tests.test_gate_only as me

    monkeypatch.setattr(me, "ROOT", str(tmp_path))
    assert me._node_writes(os.path.join("healthcheck", "x.py")) == [
        "healthcheck/x.py:2 .resume()", "healthcheck/x.py:3 scontrol update"]
