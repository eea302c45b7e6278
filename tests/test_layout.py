"""The source layout shows the architecture: few loose modules at ``healthcheck/``'s top level,
each folder's name saying what it holds, and no two modules with one file name (a reader who
sees ``tally.py`` knows which one is meant). See docs/architecture.md, "Layout"."""
from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("healthcheck", "slurm_hooks")
MAX_TOP_LEVEL = 12


def _modules(package: str):
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def test_healthcheck_top_level_holds_at_most_twelve_modules():
    top = sorted(p.name for p in (ROOT / "healthcheck").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_two_modules_share_a_file_name():
    by_name = collections.defaultdict(list)
    for package in PACKAGES:
        for path in _modules(package):
            if path.name != "__init__.py":
                by_name[path.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_grouping_packages_import_nothing():
    """``safeio``, ``hooklib``, ``counters`` and ``taskenv`` only group modules: importing one
    of them must not pull its modules onto a hook's import path."""
    for name in ("safeio", "hooklib", "counters", "taskenv"):
        tree = ast.parse((ROOT / "healthcheck" / name / "__init__.py").read_text())
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert imports == [], name
        assert ast.get_docstring(tree), name          # the folder says what it holds


def test_no_test_double_is_installed():
    """Stand-ins for tests (``FakeBackend``) live in ``tests/``, not in the installed packages:
    no product module defines a ``Fake*`` class, and none imports from ``tests``."""
    offenders = []
    for package in PACKAGES:
        for path in _modules(package):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name.startswith("Fake"):
                    offenders.append(f"{path.relative_to(ROOT)}: class {node.name}")
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
                    offenders.append(f"{path.relative_to(ROOT)}: imports {node.module}")
    assert offenders == []


def test_the_fake_backend_has_every_method_of_the_interface():
    """The unit tests' ``FakeBackend`` stays a ``SlurmBackend``: every method, same parameters."""
    import inspect

    from healthcheck.slurm.backend import SlurmBackend
    from .fake_backend import FakeBackend

    wanted = {name for name, value in vars(SlurmBackend).items()
              if callable(value) and not name.startswith("_")}
    assert wanted >= {"node", "drain", "resume"}
    for name in sorted(wanted):
        assert list(inspect.signature(getattr(FakeBackend, name)).parameters) == \
            list(inspect.signature(getattr(SlurmBackend, name)).parameters), name
