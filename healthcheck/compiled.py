"""The config as the hooks load it: parsed and validated once, then reused while nothing changed
(and the package's own TOML data files, ``package_toml``, the same way).

Every hook run used to parse ``defaults.toml`` and the admin's file with the TOML parser and
walk the schema over them (about 10 ms of a 60-80 ms hook, docs/performance.md). A valid load
is kept as JSON in ``CACHE_DIR`` (root only: ``/run``, a tmpfs gone at reboot), under a key
that is a SHA-256 of the file's bytes, its path, the interpreter and the size and mtime of the
code and data that decide validity (the schema, the defaults, the check registry, and every
module and data file they use: ``_CODE``). A later run
whose key matches reads that JSON instead; anything else (another file, another version, a
changed defaults file, a cache entry that is not ours or not whole) is a normal load.

The file is read here exactly as ``config.read_document`` reads it (a regular file of at most
4 MiB, never a FIFO), so its bytes are what is hashed and, on a miss, what is parsed. A cache
entry is trusted only when it is a regular file (not a link), owned by the running user and
writable by no one else, in a directory that is the same: another user cannot hand root a
config. ``Config.load(cached=True)`` uses it (the hooks, slurm-gpu-watch), and ``package_toml``
keeps the package's own TOML tables the same way (the epilog's job classes).
"""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any, Callable, Dict, Optional

from .safeio import datafiles, tomlio
from .safeio.fsutil import atomic_write
from .safeio.sha256 import sha256

CACHE_DIR = "/run/slurm-gpu-hooks"
_VERSION = "1"
MAX_ENTRY_BYTES = 1 << 20
# What decides whether a document is valid and what it merges into, relative to the package:
# the modules the validation and the compiled form import (at module level and inside their
# functions, transitively: ``plain.py`` builds the classes ``facts.py`` declares) and the data
# files they read. tests/test_config_compiled.py derives that set from the code and fails when
# a module or data file is missing here.
_CODE = ("__init__.py", "compiled.py", "config/__init__.py", "config/keys.py", "config/shipped.py", "schema.py",
         "findings.py", "facts.py", "plain.py", "checklist.py", "xid/__init__.py", "xid/xid_actions.py",
         "safeio/__init__.py", "safeio/datafiles.py", "safeio/fsutil.py", "safeio/jsontypes.py", "safeio/sha256.py", "safeio/tomlio.py",
         "data/defaults.toml", "data/xid-actions.tsv")
_HERE = os.path.dirname(os.path.abspath(__file__))


def cache_dir() -> Optional[str]:
    """Where entries live for this process; None: no cache (only root's hooks keep one)."""
    return CACHE_DIR if os.geteuid() == 0 else None


def key(path: str, raw: bytes) -> str:
    parts = [_VERSION, os.path.abspath(path), sys.version]
    for name in _CODE:
        try:
            info = os.stat(os.path.join(_HERE, name))
            parts.append(f"{name}:{info.st_size}:{info.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    digest = sha256("\0".join(parts).encode("utf-8", "surrogateescape"))
    digest.update(raw)
    return digest.hexdigest()


def _entry_path(directory: str, path: str) -> str:
    return os.path.join(directory, "config-" + sha256(os.path.abspath(path).encode("utf-8", "surrogateescape"))
                        .hexdigest()[:32] + ".json")


def _owned_private(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _read_entry(directory: str, entry: str) -> Optional[dict]:
    try:
        if not _owned_private(os.lstat(directory)) or not stat.S_ISDIR(os.lstat(directory).st_mode):
            return None
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _owned_private(info) or info.st_size > MAX_ENTRY_BYTES:
            return None
        raw = os.read(fd, MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _write_entry(directory: str, entry: str, content: dict) -> None:
    try:
        text = json.dumps(content, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return                               # a value JSON cannot hold: this file is not cached
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or not _owned_private(info):
            return
        atomic_write(entry, text, mode=0o600, durable=False)
        _prune(directory)
    except OSError:
        pass                                 # a cache that cannot be written costs speed, nothing else


MAX_ENTRIES = 64


def _prune(directory: str) -> None:
    """At most MAX_ENTRIES entries (one per config file path): the least recently written go."""
    names = [name for name in os.listdir(directory) if name.startswith(("config-", "data-")) and name.endswith(".json")]
    if len(names) <= MAX_ENTRIES:
        return
    dated = []
    for name in names:
        try:
            dated.append((os.lstat(os.path.join(directory, name)).st_mtime_ns, name))
        except OSError:
            continue
    for _, name in sorted(dated)[:len(dated) - MAX_ENTRIES]:
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def load(cls: Any, path: str, read_document: Callable[..., Dict[str, Any]]) -> Any:
    """``cls`` (Config) for ``path``: from the cache when its key matches, else read with
    ``read_document(path, raw)``, validated (``Config.from_document``; ConfigError as always)
    and then cached."""
    try:
        raw = tomlio.read_bytes(path)
    except (OSError, ValueError):
        return cls.from_document(read_document(path), path)    # read_document says what is wrong
    directory = cache_dir()
    wanted = key(path, raw) if directory else None
    entry = _entry_path(directory, path) if directory else ""
    if directory:
        found = _read_entry(directory, entry)
        if found and found.get("key") == wanted and isinstance(found.get("data"), dict) \
                and isinstance(found.get("document"), dict):
            return cls(found["data"], path, found["document"])
    config = cls.from_document(read_document(path, raw), path)
    if directory:
        _write_entry(directory, entry, {"key": wanted, "data": config.data, "document": config.document})
    return config


def package_toml(name: str) -> Dict[str, Any]:
    """The package's TOML data file ``name`` (``datafiles``: e.g. job-classes.toml), parsed; from
    the cache when an entry was made from these very bytes (the epilog reads one every job)."""
    text = datafiles.read_text(name)
    directory = cache_dir()
    if not directory:
        return tomlio.loads(text)
    wanted = sha256("\0".join([_VERSION, name, sys.version, text]).encode("utf-8", "surrogateescape")).hexdigest()
    # Named by the bytes too: two installs with different copies of the file (a node in an
    # upgrade, worktrees side by side) keep one entry each instead of rewriting one in turn.
    entry = os.path.join(directory, "data-" + wanted[:32] + ".json")
    found = _read_entry(directory, entry)
    if found and found.get("key") == wanted and isinstance(found.get("data"), dict):
        return found["data"]
    data = tomlio.loads(text)
    _write_entry(directory, entry, {"key": wanted, "data": data})
    return data
