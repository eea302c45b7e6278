"""The simulator profiles that ship inside the package, found by name.

``slurm-gpu check --sim h100-ecc-dbe`` and ``[sim] profile = "h100-healthy"`` name a shipped
profile; anything with a slash or ending in ``.toml`` is a path to a profile of the admin's own.
The shipped files live in ``healthcheck/data/sim/`` (package data), the one copy of them.
"""
from __future__ import annotations

import os
from typing import List, Optional

from ..safeio import datafiles

SUFFIX = ".toml"


def shipped_dir() -> str:
    """The directory holding the shipped profiles (a plain directory in any pip install)."""
    return datafiles.data_path("sim")


def shipped_names() -> List[str]:
    """Every shipped profile's name, sorted (``h100-healthy``, ``h100-ecc-dbe``, ...)."""
    return sorted(name[:-len(SUFFIX)] for name in os.listdir(shipped_dir()) if name.endswith(SUFFIX))


def is_name(value: str) -> bool:
    """A bare name (no directory part, no ``.toml``) names a shipped profile."""
    return bool(value) and "/" not in value and os.sep not in value and not value.endswith(SUFFIX)


def resolve(value: str, base_dir: Optional[str] = None) -> str:
    """The file behind ``value``: a shipped profile's path for a name, else ``value`` as a path
    (relative to ``base_dir`` when given). An unknown name raises ValueError listing the names."""
    if is_name(value):
        path = os.path.join(shipped_dir(), value + SUFFIX)
        if not os.path.isfile(path):
            raise ValueError(f"no shipped simulator profile named {value!r} "
                             f"(shipped: {', '.join(shipped_names())}; a file path needs a '/' or '.toml')")
        return path
    if base_dir is not None and not os.path.isabs(value):
        return os.path.normpath(os.path.join(base_dir, value))
    return value
