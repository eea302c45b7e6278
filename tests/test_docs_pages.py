"""The admin documentation: each page opens with what its reader wants to do, the files it
names exist, and the example files in etc/ fit the built-in defaults."""
from __future__ import annotations

import glob
import os
import re

import pytest


from .conftest import ETC, ROOT

PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("page", PAGES, ids=[os.path.basename(p) for p in PAGES])
def test_each_page_opens_with_what_the_reader_wants_to_do(page):
    text = _read(page)
    lines = text.splitlines()
    assert lines[0].startswith("# "), page
    opening = text.split("\n\n")[1]
    assert re.match(r"You (want|saw|run|are)\b", opening), f"{os.path.basename(page)} opens with: {opening[:80]!r}"


@pytest.mark.parametrize("page", PAGES + [os.path.join(ROOT, "README.md")],
                         ids=[os.path.basename(p) for p in PAGES] + ["README.md"])
def test_the_files_a_page_names_exist(page):
    named = set(re.findall(r"`((?:docs|etc|healthcheck|slurm_hooks|tests|scripts)/[\w./-]+)`", _read(page)))
    missing = sorted(path for path in named if "*" not in path and "<" not in path
                     and not os.path.exists(os.path.join(ROOT, path)))
    assert not missing, f"{os.path.basename(page)} names files that do not exist: {', '.join(missing)}"


@pytest.mark.parametrize("page", PAGES, ids=[os.path.basename(p) for p in PAGES])
def test_the_config_keys_a_page_names_exist(page):
    """`[section] key` in a page, for a config section, is a key the validator knows (docs follow
    renames). Other sections are simulator profiles' ([node], [expect])."""
    from .test_docs_configuration import schema_keys

    known = schema_keys()
    sections = {key.split(".")[0] for key in known}
    named = set(re.findall(r"`\[(\w+)\] (\w+)", _read(page)))
    wrong = sorted(f"[{section}] {key}" for section, key in named
                   if section in sections and not any(k == f"{section}.{key}" or k.startswith(f"{section}.{key}.")
                                                          for k in known))
    assert not wrong, f"{os.path.basename(page)} names config keys the validator does not know: {', '.join(wrong)}"
