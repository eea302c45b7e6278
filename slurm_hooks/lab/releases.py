"""Which Slurm release the lab runs: the table (``slurm_hooks/data/lab-releases.toml``), the
release a lab directory was last brought up with (``$LAB/etc/release``), and the commands of
that release (host binaries, or the ``$LAB/bin`` wrappers that enter its root filesystem)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from typing import Dict, Optional

from . import LabError
from .paths import LabPaths

RELEASE_ENV = "SLURM_GPU_LAB_RELEASE"


@dataclass(frozen=True)
class Release:
    version: str        # "24.11"
    debian: str         # the Debian suite whose packages it is: "trixie"
    rootfs: bool        # False: the host's own packages
    mirror: str = ""

    def describe(self) -> str:
        where = f"Debian {self.debian} root filesystem" if self.rootfs else f"host packages (Debian {self.debian})"
        return f"Slurm {self.version} ({where})"


def _table() -> Dict[str, object]:
    from healthcheck.safeio.tomlio import loads

    return loads(resources.files("slurm_hooks").joinpath("data/lab-releases.toml").read_text("utf-8"))


def releases() -> Dict[str, Release]:
    raw = _table()
    mirror = str(raw.get("mirror", ""))
    return {version: Release(version, str(row["debian"]), bool(row["rootfs"]), mirror)
            for version, row in dict(raw["releases"]).items()}


def default_version() -> str:
    return str(_table()["default"])


def get(version: Optional[str]) -> Release:
    """The release called ``version`` (None or "": the default); one clear line when unknown."""
    table = releases()
    chosen = version or default_version()
    if chosen not in table:
        raise LabError(f"no Slurm release {chosen!r} in the lab (known: {', '.join(sorted(table))})")
    return table[chosen]


def recorded(lab: LabPaths) -> Optional[str]:
    """The release this lab directory was last brought up with (None: never, or before releases)."""
    try:
        with open(lab.release_file, encoding="ascii") as handle:
            text = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text in releases() else None


def current(lab: LabPaths) -> Release:
    """The release whose commands talk to this lab: the recorded one, else the default."""
    return get(recorded(lab))
