"""The package's data files (``healthcheck/data/...``), found as plain files.

Every hook run reads some of them (the built-in defaults, the Xid catalog). ``importlib.resources``
would find them too, but importing it costs about 8 ms per process (it pulls in tempfile, shutil,
zipfile and pathlib), a tenth of the floor in docs/performance.md. pip installs package data as
plain files beside the modules (wheel or editable), so the path is known; only an import from a
zip archive, which this project does not ship as, falls back to ``importlib.resources``.
"""
from __future__ import annotations

import os

# healthcheck/data, beside this package (healthcheck/safeio): the healthcheck package's own data.
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def data_path(*parts: str) -> str:
    """The path of a data file or directory under ``healthcheck/data``."""
    if os.path.isdir(DATA_DIR):
        return os.path.join(DATA_DIR, *parts)
    from importlib import resources  # a zip import: no plain directory to point at

    return str(resources.files("healthcheck").joinpath("data", *parts))


def read_text(*parts: str) -> str:
    """A data file's text (UTF-8)."""
    if os.path.isdir(DATA_DIR):
        with open(os.path.join(DATA_DIR, *parts), encoding="utf-8") as handle:
            return handle.read()
    from importlib import resources

    return resources.files("healthcheck").joinpath("data", *parts).read_text("utf-8")
