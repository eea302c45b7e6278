"""The hooks' compiled config (healthcheck/compiled.py): a valid load is reused while the file's
bytes and the code's are the same, never when they changed, never from an entry another user
could have written, and an invalid file is never cached."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck import compiled
from healthcheck.safeio import tomlio
from healthcheck.config import Config, ConfigError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setattr(compiled, "cache_dir", lambda: str(directory))
    return directory


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def _no_parser(monkeypatch):
    def refuse(text):
        raise AssertionError("parsed again")
    monkeypatch.setattr(tomlio, "loads", refuse)


def test_a_second_load_of_the_same_file_is_not_parsed_again(tmp_path, cache, monkeypatch):
    path = _config(tmp_path, '[paths]\nstate_dir = "/var/tmp/x"\n[health]\nconfirm_runs = 3\n')
    first = Config.load(path, {}, cached=True)
    entries = os.listdir(cache)
    assert len(entries) == 1 and oct(os.stat(cache / entries[0]).st_mode & 0o777) == "0o600"
    _no_parser(monkeypatch)
    second = Config.load(path, {}, cached=True)
    assert second.data == first.data and second.document == first.document
    assert second.section("health")["confirm_runs"] == 3 and second.sets("health", "confirm_runs")
    assert second.path == path and second.state_dir == "/var/tmp/x"


def test_a_changed_file_is_read_again(tmp_path, cache):
    path = _config(tmp_path, "[health]\nconfirm_runs = 3\n")
    assert Config.load(path, {}, cached=True).section("health")["confirm_runs"] == 3
    _config(tmp_path, "[health]\nconfirm_runs = 4\n")
    assert Config.load(path, {}, cached=True).section("health")["confirm_runs"] == 4


def test_an_invalid_file_is_refused_every_time_and_never_cached(tmp_path, cache):
    path = _config(tmp_path, "[health]\nconfirm_runs = 0\n")
    for _ in range(2):
        with pytest.raises(ConfigError):
            Config.load(path, {}, cached=True)
    assert not cache.exists() or os.listdir(cache) == []


@pytest.mark.parametrize("spoil", ["group-writable", "link", "wrong-key", "not-json"])
def test_an_entry_that_is_not_ours_or_not_whole_is_not_believed(tmp_path, cache, spoil):
    path = _config(tmp_path, "[health]\nconfirm_runs = 3\n")
    Config.load(path, {}, cached=True)
    entry = cache / os.listdir(cache)[0]
    forged = json.loads(entry.read_text())
    forged["data"]["health"]["confirm_runs"] = 99
    if spoil == "group-writable":
        entry.write_text(json.dumps(forged))
        entry.chmod(0o620)
    elif spoil == "link":
        other = tmp_path / "forged.json"
        other.write_text(json.dumps(forged))
        entry.unlink()
        entry.symlink_to(other)
    elif spoil == "wrong-key":
        forged["key"] = "0" * 64
        entry.write_text(json.dumps(forged))
    else:
        entry.write_text("{not json")
    assert Config.load(path, {}, cached=True).section("health")["confirm_runs"] == 3


def test_without_cached_or_as_another_user_nothing_is_kept(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setattr(compiled, "CACHE_DIR", str(directory))
    path = _config(tmp_path, "[health]\nconfirm_runs = 3\n")
    Config.load(path, {})
    assert not directory.exists()
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    assert compiled.cache_dir() is None
    Config.load(path, {}, cached=True)
    assert not directory.exists()


def test_the_key_follows_the_code_that_decides_validity(tmp_path):
    raw = b"[health]\nconfirm_runs = 3\n"
    assert compiled.key("/etc/a.toml", raw) == compiled.key("/etc/a.toml", raw)
    assert compiled.key("/etc/a.toml", raw) != compiled.key("/etc/b.toml", raw)
    assert compiled.key("/etc/a.toml", raw) != compiled.key("/etc/a.toml", raw + b"\n")
    here = os.path.dirname(compiled.__file__)
    assert all(os.path.exists(os.path.join(here, name)) for name in compiled._CODE)


def _package_imports(package_dir: str, relpath: str):
    """The package's modules ``relpath`` imports (module level and inside functions, relative
    or absolute) and the package data files it reads by name, as paths under the package."""
    import ast
    import re

    def module_file(dotted: str):
        base = os.path.join(package_dir, *dotted.split(".")) if dotted else package_dir
        if os.path.isdir(base):
            return os.path.relpath(os.path.join(base, "__init__.py"), package_dir)
        return os.path.relpath(base + ".py", package_dir) if os.path.exists(base + ".py") else None

    with open(os.path.join(package_dir, relpath), encoding="utf-8") as handle:
        text = handle.read()
    parts = os.path.dirname(relpath).split(os.sep) if os.path.dirname(relpath) else []
    found = {os.path.join(*parts[:i + 1], "__init__.py") for i in range(len(parts))} | {"__init__.py"}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = parts[:len(parts) - (node.level - 1)]
            dotted = ".".join(base + ([node.module] if node.module else []))
            candidates = [dotted] + [".".join(filter(None, [dotted, alias.name])) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("healthcheck."):
            candidates = [node.module[len("healthcheck."):]]
        elif isinstance(node, ast.Import):
            candidates = [a.name[len("healthcheck."):] for a in node.names if a.name.startswith("healthcheck.")]
        else:
            continue
        found.update(f for f in map(module_file, candidates) if f)
    # Data files read by name: read_text("xid-actions.tsv") and the like.
    found.update("data/" + name for name in re.findall(r"read_(?:text|bytes)\(\"([\w.-]+\.(?:toml|tsv|json))\"", text))
    return found


def test_the_key_covers_every_module_and_data_file_the_compiled_form_depends_on():
    """A change to any module the validation imports (transitively, e.g. plain.py, which builds
    facts.py's classes) or to a data file it reads must change the key: each is in _CODE."""
    here = os.path.dirname(compiled.__file__)
    seen, todo = set(), ["compiled.py", "config/__init__.py"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.endswith(".py"):
            todo.extend(_package_imports(here, name))
    assert "plain.py" in seen and "data/defaults.toml" in seen
    missing = sorted(seen - set(compiled._CODE))
    assert missing == [], f"the compiled config's key misses {missing}"


def test_a_change_to_plain_py_changes_the_key(tmp_path, monkeypatch):
    raw = b"[health]\nconfirm_runs = 3\n"
    before = compiled.key("/etc/a.toml", raw)
    real_stat = os.stat
    plain_py = os.path.join(os.path.dirname(compiled.__file__), "plain.py")

    def stat(path, *args, **kwargs):
        info = real_stat(path, *args, **kwargs)
        if os.path.abspath(path) == plain_py:
            return os.stat_result((info.st_mode, info.st_ino, info.st_dev, info.st_nlink, info.st_uid, info.st_gid,
                                   info.st_size + 1, info.st_atime, info.st_mtime, info.st_ctime))
        return info
    monkeypatch.setattr(os, "stat", stat)
    assert compiled.key("/etc/a.toml", raw) != before


def test_the_cache_stays_small_whatever_the_number_of_config_files(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_ENTRIES", 3)
    for number in range(6):
        folder = tmp_path / f"c{number}"
        folder.mkdir()
        Config.load(_config(folder, "[health]\nconfirm_runs = 3\n"), {}, cached=True)
    assert len(os.listdir(cache)) == 3


def test_a_package_data_file_is_parsed_once_for_its_bytes(cache, monkeypatch):
    first = compiled.package_toml("job-classes.toml")
    assert "hardware_precedence" in first
    _no_parser(monkeypatch)
    assert compiled.package_toml("job-classes.toml") == first
    monkeypatch.setattr(compiled, "cache_dir", lambda: None)
    with pytest.raises(AssertionError, match="parsed again"):
        compiled.package_toml("job-classes.toml")
