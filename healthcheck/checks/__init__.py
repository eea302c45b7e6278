"""The checks: one module per area (NHC style), each a pure function from facts to findings.

Which checks exist, what each needs and which function judges it is the check list,
``healthcheck/checklist.py``. Importing this package imports no check module and no probe: the
runner loads the modules its tier uses (``judge``, ``sampler``). ``docs/checks.md`` describes
every id.
"""
from __future__ import annotations

import importlib
from typing import Callable, Optional

from ..checklist import CheckSpec


def judge(spec: CheckSpec) -> Callable:
    """The function that judges ``spec`` (its module imported now)."""
    return _load(spec.target)


def sampler(spec: CheckSpec) -> Optional[Callable]:
    """The function giving the counters ``spec`` judges the growth of, if any."""
    return _load(spec.samples) if spec.samples else None


def _load(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
