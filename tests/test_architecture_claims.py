"""docs/architecture.md's "only X does Y" statements, each held by reading the source: who imports
what (grimp's import graph, the one import-linter checks, imports inside functions included) and
who calls what. A change that makes a statement false fails here and names the module; then fix
the code or the page. The drain gate's own statement is tests/test_gate_only.py; the layers, the
import direction, pure checks and the TaskProlog's lean path are import-linter's contracts
(.importlinter, tests/test_import_contracts.py)."""
from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Set

import pytest

grimp = pytest.importorskip("grimp")      # installed with import-linter (Python 3.11+; see setup.cfg)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("healthcheck", "slurm_hooks")


def _modules() -> Dict[str, str]:
    """Every product module's name -> its file."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for file_name in files:
                if file_name.endswith(".py"):
                    path = os.path.join(folder, file_name)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


MODULES = _modules()
_GRAPH = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
# Every module each product module imports (outside the product: the top-level name, ``subprocess``).
GRAPH: Dict[str, Set[str]] = {name: set(_GRAPH.find_modules_directly_imported_by(name)) for name in MODULES}

PAGE = os.path.join(ROOT, "docs", "architecture.md")


def _page() -> str:
    return " ".join(open(PAGE, encoding="utf-8").read().split())


def _importers(wanted) -> Set[str]:
    return {name for name, targets in GRAPH.items() if any(wanted(target) for target in targets)}


def _in(package: str):
    return lambda name: name == package or name.startswith(package + ".")


def _tree(name: str) -> ast.AST:
    path = MODULES[name]
    return ast.parse(open(path, encoding="utf-8").read(), path)


def _calls(name: str) -> Iterator[ast.Call]:
    return (node for node in ast.walk(_tree(name)) if isinstance(node, ast.Call))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


# -- "healthcheck/sources.py is the only module of the node side that knows the simulator exists"

def test_only_sources_the_cli_and_the_lab_import_the_simulator():
    users = {name for name in _importers(_in("healthcheck.sim")) if not _in("healthcheck.sim")(name)}
    node_side = {name for name in users if not name.startswith(("slurm_hooks.cli.", "slurm_hooks.lab."))}
    assert node_side == {"healthcheck.sources"}
    assert "healthcheck/sources.py` is the only module of the node side" in _page()


def test_probes_checks_and_the_runner_never_ask_which_sources_they_got():
    for name in MODULES:
        if name.startswith(("healthcheck.probes", "healthcheck.checks", "healthcheck.kernellog")) \
                or name in ("healthcheck.runner", "slurm_hooks.prolog", "slurm_hooks.epilog"):
            source = open(MODULES[name], encoding="utf-8").read()
            assert not (GRAPH[name] & {"healthcheck.sim"} or any(t.startswith("healthcheck.sim.") for t in GRAPH[name])), name
            assert '== "sim"' not in source and "backend ==" not in source, name


# -- "Every call of another program goes through programs.run or programs.stream ... except"

PROGRAM_STARTERS = {
    "healthcheck.safeio.programs",     # the bounded runner itself
    "slurm_hooks.lab.daemons",         # the lab's daemons outlive the call
    "slurm_hooks.lab.watchers",        # the lab's slurm-gpu-watch processes
    "slurm_hooks.lab.monitoring",      # the lab's node_exporter and Prometheus
    "slurm_hooks.delivery",            # the epilog's detached background delivery
    "healthcheck.watch.service",       # slurm-gpu-watch's HealthCheckProgram runs, each with its deadline
}
EXEC_CALLS = {"os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp"}


def test_programs_are_started_only_by_the_bounded_runner_and_the_named_exceptions():
    starters = {name for name in _importers(lambda target: target == "subprocess")}
    for name in MODULES:
        for call in _calls(name):
            called = _dotted(call.func)
            if called in EXEC_CALLS or called.startswith(("os.exec", "os.spawn")):
                starters.add(name)
    assert starters == PROGRAM_STARTERS
    page = _page()
    for name in PROGRAM_STARTERS - {"healthcheck.safeio.programs"}:
        assert os.path.relpath(MODULES[name], ROOT) in page, name


# -- "Config files and profiles are read only ... (tomlio.read_bytes)"

def test_only_tomlio_parses_toml():
    assert _importers(lambda target: target in ("tomllib", "tomli")) == {"healthcheck.safeio.tomlio"}


# -- the watcher: "It decides nothing and calls no Slurm command; nothing else depends on it running"

def test_the_watcher_decides_nothing_calls_no_slurm_and_nothing_imports_it():
    watcher = [name for name in MODULES if _in("healthcheck.watch")(name)]
    assert watcher
    for name in watcher:
        # healthcheck.actions.state alone, read only (its drain record and the last result: the
        # boot a drain of ours waits for, and whether a run has judged the node since)
        forbidden = {target for target in GRAPH[name]
                     if (_in("healthcheck.actions")(target) and target != "healthcheck.actions.state")
                     or _in("healthcheck.slurm")(target) or _in("healthcheck.health")(target)}
        assert forbidden == set(), name
        assert not any("scontrol" in repr(ast.dump(call)) for call in _calls(name)), name
    assert {name for name in _importers(_in("healthcheck.watch")) if not _in("healthcheck.watch")(name)} == set()


# -- the compiled config: "The hooks (and slurm-gpu-watch) load the config with Config.load(cached=True)"

def test_only_the_hook_skeleton_and_the_watcher_load_the_cached_config():
    callers = set()
    for name in MODULES:
        for call in _calls(name):
            if any(kw.arg == "cached" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                   for kw in call.keywords):
                callers.add(name)
    assert callers == {"healthcheck.hooklib.skeleton", "healthcheck.watch.service"}
    assert _importers(lambda target: target == "healthcheck.compiled") == {"healthcheck.config",
                                                                          "healthcheck.records.classify"}


# -- "Files with content are written with healthcheck/safeio/fsutil.py"

WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
# Opened for writing outside fsutil, each named on the page: empty lock and marker files.
RAW_WRITERS = {
    "healthcheck.records.store": "an empty marker",
    "healthcheck.records.outbox": "the outbox's lock",
    "healthcheck.probes.child": "/dev/null for a probe's child",
}


def _raw_writes(name: str) -> List[int]:
    lines = []
    for call in _calls(name):
        called = _dotted(call.func)
        if called == "os.open" and len(call.args) > 1:
            flags = {node.attr for node in ast.walk(call.args[1]) if isinstance(node, ast.Attribute)}
            if flags & WRITE_FLAGS:
                lines.append(call.lineno)
        elif called == "open" and len(call.args) > 1 and isinstance(call.args[1], ast.Constant) \
                and set(str(call.args[1].value)) & set("wax+"):
            lines.append(call.lineno)
    return lines


def test_the_node_side_writes_files_only_through_fsutil():
    writers = {name for name in MODULES
               if name.startswith("healthcheck.") and name != "healthcheck.safeio.fsutil" and _raw_writes(name)}
    assert writers == set(RAW_WRITERS)


# -- Data, not code: "<file> (read by <module>)"

READ_BY = {
    "defaults.toml": {"healthcheck.config"},
    "nvml-functions.tsv": {"healthcheck.driver_support"},
    "job-classes.toml": {"healthcheck.records.classify"},
    "gpu-oom-signatures.tsv": {"healthcheck.records.gpu_oom"},
    "sim-defaults.toml": {"healthcheck.sim.profile"},
}


def _data_reads() -> Dict[str, Set[str]]:
    found: Dict[str, Set[str]] = {}
    for name in MODULES:
        tree = _tree(name)
        constants = {target.id: node.value.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     for target in node.targets if isinstance(target, ast.Name)
                     and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
        for call in _calls(name):
            if _dotted(call.func).split(".")[-1] not in ("read_text", "package_toml") or not call.args:
                continue
            arg = call.args[0]
            value = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
            if isinstance(value, str):
                found.setdefault(value, set()).add(name)
    return found


def test_each_data_file_is_read_by_the_module_the_page_names():
    reads = _data_reads()
    page = _page()
    for data, readers in READ_BY.items():
        assert reads.get(data) == readers, data
        for reader in readers:
            assert os.path.relpath(MODULES[reader], ROOT).replace("/__init__.py", "/") in page or \
                os.path.relpath(MODULES[reader], ROOT) in page, reader


# -- the health state: "written by the drain gate (its drain record, for every hook) and the health check"

def test_the_health_state_is_kept_by_the_gate_and_the_health_check():
    users = _importers(lambda target: target == "healthcheck.actions.state")
    assert users == {"healthcheck.actions.gate", "healthcheck.health.run", "healthcheck.health.outputs",
                     "slurm_hooks.cli.drained_cmd", "healthcheck.watch.service"}
    saves = {name for name in users for call in _calls(name) if _dotted(call.func).endswith(".save")
             or _dotted(call.func) == "save"}
    assert "slurm_hooks.cli.drained_cmd" not in saves           # the CLI reads it; the gate writes for it
    assert "healthcheck.watch.service" not in saves             # the watcher reads it, read only


# -- the page's citations: every test it names exists, so a claim cannot point at a test that is gone

def test_every_test_the_page_cites_exists():
    import re

    text = open(PAGE, encoding="utf-8").read()
    files = set(re.findall(r"tests/[\w/]+\.py", text))
    assert "tests/test_architecture_claims.py" in files
    for path in files:
        assert os.path.exists(os.path.join(ROOT, path)), path
    defined = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "tests")):
        for name in names:
            if name.endswith(".py"):
                source = open(os.path.join(folder, name), encoding="utf-8").read()
                defined |= set(re.findall(r"^def (test_\w+)", source, re.M))
    cited = set(re.findall(r"`(test_\w+)`", text))
    assert cited and cited <= defined, sorted(cited - defined)
