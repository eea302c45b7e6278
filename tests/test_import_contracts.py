"""The product's layers and forbidden imports (``.importlinter``, drawn in docs/architecture.md)
hold: import-linter's ``lint-imports``, which the test command (scripts/test) also runs before
pytest. It reads every import, those inside functions too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT

# import-linter 2.17 (its acyclic_siblings contract) needs Python 3.11: the test command's main
# run has it; the contracts read the source, the same under any interpreter.
pytest.importorskip("importlinter")
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(root: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=root)     # the packages under ``root``, before the installed ones
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_contract_is_kept():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout, done.stdout


def test_an_import_that_climbs_back_up_breaks_the_layers(tmp_path):
    """The same run fails on a copy of the product where the config imports a probe (a lazy
    import inside a function, as the climbing imports were hidden before)."""
    for package in ("healthcheck", "slurm_hooks"):
        shutil.copytree(os.path.join(ROOT, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, ".importlinter"), tmp_path / ".importlinter")
    with open(tmp_path / "healthcheck" / "config" / "keys.py", "a", encoding="utf-8") as handle:
        handle.write("\n\ndef _climbs():\n    from ..probes import nvml  # noqa: F401\n")
    done = _lint(str(tmp_path))
    assert done.returncode != 0, done.stdout
    assert "healthcheck.config.keys -> healthcheck.probes.nvml" in done.stdout, done.stdout
