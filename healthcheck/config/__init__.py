"""The one TOML config file: where it is, and typed access to it.

Built-in defaults live in ``healthcheck/data/defaults.toml`` (data, not code); the admin's
file is merged over them and the result is validated against ``CONFIG_SCHEMA``
(``healthcheck/config/keys.py``: what the file may hold).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar

from .. import compiled
from ..findings import action_for
from ..safeio import datafiles, tomlio
from ..schema import Problem, merge, validate
from . import shipped
from .keys import CONFIG_SCHEMA, TIERS, cross_checks, map_deprecated, node_matches

__all__ = ["CONFIG_SCHEMA", "TIERS", "Config", "ConfigError", "builtin_defaults", "config_path", "node_name",
           "read_document"]

T = TypeVar("T")

DEFAULT_CONFIG_PATH = "/etc/slurm-gpu-hooks/config.toml"
CONFIG_ENV = "SLURM_GPU_HOOKS_CONFIG"


class ConfigError(Exception):
    """Every problem found in a config file, each formatted as one line."""

    def __init__(self, path: str, problems: List[Problem]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self) -> List[str]:
        return [f"{self.path}: {key}: {what}; {allowed}" for key, what, allowed in self.problems]


def builtin_defaults() -> Dict[str, Any]:
    """``healthcheck/data/defaults.toml``, parsed (a fresh copy: callers may change it)."""
    import copy             # only when the defaults are merged again (not from the compiled cache)

    return copy.deepcopy(_parsed_defaults())


@functools.lru_cache(maxsize=1)
def _parsed_defaults() -> Dict[str, Any]:
    # Read and parsed once per process: every config load, validation and XidSettings shares it.
    text = datafiles.read_text("defaults.toml")
    return tomlio.loads(text)


def config_path(explicit: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
    return explicit or env.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def read_document(path: str, raw: Optional[bytes] = None) -> Dict[str, Any]:
    """The admin's file, parsed (``raw``: its bytes, already read); ConfigError (one line per
    problem) when it cannot be read or is not TOML."""
    try:
        return tomlio.load_file(path) if raw is None else tomlio.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, [("(file)", "does not exist", "a readable TOML file")]) from None
    except PermissionError:
        raise ConfigError(path, [("(file)", "cannot be read (permission denied)", "a readable TOML file")]) from None
    except IsADirectoryError:
        raise ConfigError(path, [("(file)", "is a directory", "a readable TOML file")]) from None
    except tomlio.FileRefused as exc:
        raise ConfigError(path, [("(file)", f"is {exc.strerror}",
                                  f"a regular TOML file of at most {tomlio.MAX_TOML_BYTES} bytes")]) from None
    except (tomlio.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [("(syntax)", str(exc), "valid TOML")]) from None
    except (OSError, ValueError) as exc:
        # A symlink loop, a path through a file (ENOTDIR), an over-long name, a NUL byte.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(path, [("(file)", f"cannot be read ({reason})", "a readable TOML file")]) from None


class Config:
    """The effective configuration: defaults merged with the admin's file, validated."""

    def __init__(self, data: Dict[str, Any], path: Optional[str] = None,
                 document: Optional[Dict[str, Any]] = None):
        self.data = data
        self.path = path
        self.document = document or {}      # what the admin's file itself says, before defaults
        self.base_dir = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
        self._typed: Dict[type, Any] = {}   # typed sections built so far (``typed``)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def load(cls, explicit: Optional[str] = None, env: Mapping[str, str] = os.environ,
             cached: bool = False) -> "Config":
        """Load the config; a missing *default* file means built-in defaults. ``cached`` (the
        hooks): a file whose bytes, and this code's, are those of an earlier valid load is not
        parsed and validated again (``compiled``)."""
        path = config_path(explicit, env)
        if path == DEFAULT_CONFIG_PATH and not explicit and not os.path.exists(path):
            return cls.from_document({}, None)
        if cached:
            return compiled.load(cls, path, read_document)
        return cls.from_document(read_document(path), path)

    @classmethod
    def from_document(cls, doc: Dict[str, Any], path: Optional[str]) -> "Config":
        defaults = builtin_defaults()
        problems = validate(doc, CONFIG_SCHEMA)
        if not problems:
            problems = cross_checks(doc, defaults)
        if problems:
            raise ConfigError(path or "(built-in)", problems)
        doc, _ = map_deprecated(doc)
        return cls(merge(defaults, doc), path, doc)

    @classmethod
    def builtin(cls) -> "Config":
        """The built-in defaults alone (``defaults.toml``: the schema's own, not validated again)."""
        return cls(builtin_defaults())

    # -- access ---------------------------------------------------------------------------
    def sets(self, section: str, key: str) -> bool:
        """Whether the admin's file gives ``[section] key`` (rather than the built-in default)."""
        return key in self.document.get(section, {})

    def deprecations(self) -> List[str]:
        """One line for each older key the admin's file sets (``keys.DEPRECATED_KEYS``)."""
        return [f"{self.path}: {key}: deprecated; {instead}" for key, instead in map_deprecated(self.document)[1]]

    def section(self, name: str) -> Dict[str, Any]:
        """``[name]`` as a dict (``config show``, tests); code reads a typed section (``typed``)."""
        return self.data.get(name, {})

    def typed(self, kind: Type[T]) -> T:
        """The typed section ``kind`` (``config/settings.py``): built on first use from this
        config, then kept, so each section is read and cast once and only where it is read."""
        if kind not in self._typed:
            self._typed[kind] = kind.from_config(self)  # type: ignore[attr-defined]
        return self._typed[kind]

    def resolve(self, path: str) -> str:
        """A path from the config file, relative to the file's own directory."""
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(self.base_dir, path))

    @property
    def state_dir(self) -> str:
        return self.resolve(self.data["paths"]["state_dir"])

    @property
    def backend(self) -> str:
        return self.data["gpu"]["backend"]

    def expected_hardware(self, node: str) -> Dict[str, Any]:
        """The first ``[[nodes]]`` entry whose ``match`` names ``node`` (empty when none)."""
        for entry in self.data.get("nodes", []):
            if node_matches(entry["match"], node):
                return entry
        return {}

    def sim_profile_path(self, node: str) -> Optional[str]:
        """The profile file for ``node``: ``[sim] nodes.<node>``, else ``[sim] profile``; a bare
        name is a shipped profile, a path is relative to the config file (ValueError: unknown name)."""
        sim = self.section("sim")
        chosen = sim.get("nodes", {}).get(node) or sim.get("profile")
        return self.resolve_profile(chosen) if chosen else None

    def resolve_profile(self, value: str) -> str:
        return shipped.resolve(value, self.base_dir)

    def threshold(self, name: str) -> float:
        return self.data["thresholds"][name]

    def action(self, check_id: str) -> str:
        return action_for(self.data["actions"], check_id)

    def tier(self, name: str) -> List[str]:
        return list(self.data["tiers"].get(name, []))

    def as_toml(self) -> str:
        return tomlio.dumps(self.data)


def node_name(explicit: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
    """``--node``, else ``SLURMD_NODENAME`` (several slurmd may share a host), else the short hostname."""
    if explicit or env.get("SLURMD_NODENAME"):
        return explicit or env["SLURMD_NODENAME"]
    import socket  # only here: Slurm always names the node to its hooks, and socket costs ~4 ms to import

    return socket.gethostname().split(".")[0]
