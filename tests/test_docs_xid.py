"""docs/xid.md's table of common Xids says what the shipped catalog and mapping really do."""
from __future__ import annotations

import os
import re

from healthcheck.xid.catalog import XidCatalog

from .conftest import ROOT


def table_rows():
    with open(os.path.join(ROOT, "docs", "xid.md"), encoding="utf-8") as handle:
        return re.findall(r"^\| (\d+) \| ([^|]+) \| `(\w+)` \|", handle.read(), re.MULTILINE)


def test_every_row_names_the_catalogs_description_and_the_mapped_action():
    catalog = XidCatalog({})
    rows = table_rows()
    assert len(rows) >= 15
    for code, name, action in rows:
        entry = catalog.entry(int(code))
        assert entry is not None and entry.description.startswith(name.strip()), (code, name)
        assert catalog.catalog_action(int(code))[0] == action, f"docs/xid.md: Xid {code} is {action!r} in the table"
