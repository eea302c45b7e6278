"""The product's import graph, read from the source (every import, also those inside functions).

* no cycle among the product's modules;
* ``healthcheck/`` imports nothing from ``slurm_hooks/`` (the node side runs without it);
* checks import no module that does I/O: they are pure (facts in, findings out).
"""
from __future__ import annotations

import ast
import os
from typing import Dict, List, Set

from healthcheck.checks import CHECKS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("healthcheck", "slurm_hooks")

# Standard-library and third-party modules whose import means a module touches files,
# processes, devices or the network.
IO_IMPORTS = {"subprocess", "fcntl", "socket", "shutil", "tempfile", "select", "signal", "multiprocessing",
              "pynvml", "gzip", "io", "glob", "pathlib"}
# Product modules that do I/O with no telltale import (plain open()/os calls).
IO_MODULES = {"healthcheck.safeio.fsutil", "healthcheck.counters.history", "healthcheck.hooklib.runlog",
              "healthcheck.hooklib.skeleton", "healthcheck.config", "healthcheck.sources", "healthcheck.kernellog.cursor",
              "healthcheck.kernellog.readers", "healthcheck.kernellog.kmsg", "healthcheck.kernellog.journal",
              "healthcheck.kernellog.logfiles", "healthcheck.kernellog.api"}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> Dict[str, str]:
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: str) -> Set[str]:
    """Every module ``name`` imports (absolute names), product or not."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "__future__":
                continue
            # ``from . import tomlio`` and ``from .x import y`` where y is a module import y.
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES]
            out.update(submodules or [target])
    return out


GRAPH: Dict[str, Set[str]] = {name: _imports(name, path) for name, path in MODULES.items()}
# The check registry loads its check modules by name (importlib): it depends on them all.
GRAPH["healthcheck.checks"] |= {f"healthcheck.checks.{spec.target.partition(':')[0]}" for spec in CHECKS.values()}


def _product_edges(name: str) -> Set[str]:
    return {target for target in GRAPH[name] if target in MODULES and target != name}


def _closure(start: str) -> Set[str]:
    seen: Set[str] = set()
    todo = [start]
    while todo:
        for target in _product_edges(todo.pop()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _cycles() -> List[List[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(_product_edges(node)):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(MODULES):
        if name not in index:
            visit(name)
    return found


def test_the_walk_sees_the_product():
    assert "healthcheck.runner" in MODULES and "slurm_hooks.cli" in MODULES
    assert "healthcheck.findings" in _product_edges("healthcheck.runner")
    # lazy imports inside functions count too
    assert "healthcheck.checks" in _product_edges("healthcheck.config.keys")


def test_no_import_cycle_in_the_product():
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle():
    GRAPH["healthcheck.findings"].add("healthcheck.runner")
    try:
        assert any("healthcheck.runner" in cycle for cycle in _cycles())
    finally:
        GRAPH["healthcheck.findings"].discard("healthcheck.runner")


def test_healthcheck_imports_nothing_from_slurm_hooks():
    offenders = {name: sorted(t for t in GRAPH[name] if t.split(".")[0] == "slurm_hooks")
                 for name in MODULES if name.startswith("healthcheck")}
    assert {name: targets for name, targets in offenders.items() if targets} == {}


def _does_io(name: str) -> bool:
    return name in IO_MODULES or name.startswith("healthcheck.probes") or name.startswith("healthcheck.sim") or \
        any(target.split(".")[0] in IO_IMPORTS for target in GRAPH[name])


def test_checks_import_no_module_that_does_io():
    checks = [name for name in MODULES if name.startswith("healthcheck.checks.")]
    assert len(checks) > 10
    offenders = {}
    for name in checks:
        bad = sorted(target for target in _closure(name) | {name} if _does_io(target))
        if bad:
            offenders[name] = bad
    assert offenders == {}


# slurmstepd runs the TaskProlog before every task of every step: no CLI, no templates, no
# processes (it reads a few files). NVML is imported lazily elsewhere in its closure (sources);
# tests/test_taskprolog.py checks that a run never loads it.
TASKPROLOG_NEVER = {"click", "jinja2", "markupsafe", "subprocess", "multiprocessing"}


def test_the_taskprolog_import_path_is_lean():
    closure = _closure("slurm_hooks.taskprolog") | {"slurm_hooks.taskprolog"}
    assert "healthcheck.taskenv.nccl_env" in closure and "healthcheck.taskenv.topology" in closure
    assert sorted(name for name in closure if name.startswith("slurm_hooks")) == ["slurm_hooks.taskprolog"]
    heavy = {name: sorted(t for t in GRAPH[name] if t.split(".")[0] in TASKPROLOG_NEVER) for name in closure}
    assert {name: targets for name, targets in heavy.items() if targets} == {}


def test_the_lean_path_test_sees_a_heavy_import():
    GRAPH["healthcheck.taskenv.topology"].add("click")
    try:
        closure = _closure("slurm_hooks.taskprolog")
        assert any("click" in GRAPH[name] for name in closure)
    finally:
        GRAPH["healthcheck.taskenv.topology"].discard("click")
