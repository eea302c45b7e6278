"""TOML reading (tomllib on 3.11+, tomli below) and writing (tomli_w), in one place."""
from __future__ import annotations

import sys
from typing import Any, Dict

if sys.version_info >= (3, 11):
    import tomllib as _toml_reader
else:  # pragma: no cover - exercised on RHEL 9's Python 3.9
    import tomli as _toml_reader

TOMLDecodeError = _toml_reader.TOMLDecodeError


def loads(text: str) -> Dict[str, Any]:
    return _toml_reader.loads(text)


def load_file(path) -> Dict[str, Any]:
    with open(path, "rb") as handle:
        return _toml_reader.load(handle)


def dumps(doc: Dict[str, Any]) -> str:
    import tomli_w  # only writers pay for it

    return tomli_w.dumps(doc)


def parse_value(text: str) -> Any:
    """A single TOML value, e.g. ``1``, ``[4,5]``, ``"1: DOWN"``, ``{ gen = 4 }``."""
    return loads(f"v = {text}")["v"]
