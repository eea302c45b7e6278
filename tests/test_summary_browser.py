"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``, installed by
``scripts/test``) loads the page; the test reads the DOM Chromium rendered, checks that the
tables are filled, the charts drawn, the console quiet, and that a job named
``<script>alert(1)</script>`` is text. A screenshot is kept in ``test-artifacts/`` (git-ignored)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from typing import Dict, List

import pytest

from healthcheck.records import admin_comment
from tests.conftest import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
DATA = os.path.join(ROOT, "tests", "data", "summary")
EVIL_NAME = "<script>alert(1)</script>"
EVIL_USER = '"><img src=x onerror=alert(2)>'
CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium is not installed: scripts/test installs it (apt-get install chromium)", pytrace=False)


def browse(page: str, tmp_path, *action: str) -> subprocess.CompletedProcess:
    """Chromium headless on ``page`` with the console logged to stderr."""
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=2000", *action, "file://" + page],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


class Dom(HTMLParser):
    """What the rendered DOM holds: elements by tag, table rows by table id, text."""

    def __init__(self):
        super().__init__()
        self.tags: Dict[str, int] = {}
        self.rows: Dict[str, int] = {}
        self.cells: Dict[str, List[str]] = {}
        self.table = None
        self.in_tbody = False
        self.text: List[str] = []
        self.ids: List[str] = []
        self.attrs: List[Dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.attrs.append(attributes)
        if "id" in attributes:
            self.ids.append(attributes["id"])
        if tag == "table":
            self.table = attributes.get("id")
        elif tag == "tbody":
            self.in_tbody = True
        elif tag == "tr" and self.in_tbody and self.table:
            self.rows[self.table] = self.rows.get(self.table, 0) + 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self.in_tbody = False
        elif tag == "table":
            self.table = None

    def handle_data(self, data):
        self.text.append(data)
        if self.table and self.in_tbody and data.strip():
            self.cells.setdefault(self.table, []).append(data.strip())


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    """A report of the lab's scenarios as the hooks will record them, with hostile names."""
    tmp = tmp_path_factory.mktemp("summary-html")
    comments = {
        "7": admin_comment.encode({"node": "gpu1", "class": "GPU_LOST", "gpu": 3, "xid": 79}),
        "13": admin_comment.encode({"node": "gpu2", "class": "GPU_ECC", "gpu": 0, "xid": 48}),
        "15": admin_comment.encode({"node": "gpu3", "class": "NVLINK", "gpu": 1, "xid": 74}),
    }
    lines = []
    with open(os.path.join(DATA, "sacct-lab-scenarios.txt"), encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            parts = line.rstrip("\n").split("|")
            if number and parts[0] in comments:
                parts[-2] = comments[parts[0]]
            if parts[0] == "7":
                parts[-1] = EVIL_NAME
                parts[3] = EVIL_USER
            lines.append("|".join(parts) + "\n")
    sacct = tmp / "sacct.txt"
    sacct.write_text("".join(lines))
    page = tmp / "report.html"
    result = run_cli(["summary", "--input", str(sacct), "--sinfo-json", os.path.join(DATA, "sinfo-lab.json"),
                      "--events", os.path.join(DATA, "sacctmgr-events-lab.txt"), "--html", str(page)])
    assert result.exit_code == 0, result.stderr
    return str(page)


@pytest.fixture(scope="module")
def rendered(report_page, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chromium")
    result = browse(report_page, tmp, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom()
    dom.feed(result.stdout)
    return dom, result


def test_the_console_check_sees_a_console_error(tmp_path):
    """The control: a page that logs an error is caught by the same check."""
    page = tmp_path / "control.html"
    page.write_text('<!DOCTYPE html><html><body><script>console.error("control-error")</script></body></html>')
    result = browse(str(page), tmp_path, "--dump-dom")
    assert [line for line in result.stderr.splitlines() if CONSOLE.search(line) and "control-error" in line]


def test_no_console_errors(rendered):
    _, result = rendered
    assert [line for line in result.stderr.splitlines() if CONSOLE.search(line)] == []


def test_tables_are_filled(rendered):
    dom, _ = rendered
    assert dom.rows["table-causes"] == 10                 # 7 Slurm endings + 3 hardware causes
    assert dom.rows["table-xids"] == 3 and dom.rows["table-gpus"] == 3
    assert dom.rows["table-drained"] == 1 and "gpu2" in dom.cells["table-drained"]
    assert {"gpu1", "gpu2", "gpu3"} <= set(dom.cells["table-nodes"])
    assert "GPU_LOST" in dom.cells["table-losses"]


def test_charts_are_drawn(rendered):
    dom, _ = rendered
    assert {"chart-timeline", "chart-lost", "chart-share", "chart-nodes"} <= set(dom.ids)
    assert dom.tags.get("svg") == 4 and dom.tags.get("rect", 0) >= 20


def test_hostile_job_and_user_names_are_text(rendered):
    dom, _ = rendered
    assert "script" not in dom.tags and "img" not in dom.tags
    assert EVIL_NAME in dom.cells["table-losses"] and EVIL_USER in dom.cells["table-losses"]
    assert not any(key.startswith("on") for attributes in dom.attrs for key in attributes)


def test_nothing_is_fetched(report_page, rendered):
    dom, _ = rendered
    assert not [a for a in dom.attrs if {"src", "href", "srcset", "data", "action"} & set(a)]
    with open(report_page, encoding="utf-8") as handle:
        page = handle.read()
    assert "url(" not in page and "@import" not in page
    assert "default-src 'none'" in page                   # and the browser would refuse it anyway


def test_screenshot_is_kept(report_page, tmp_path):
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "summary-report.png")
    if os.path.exists(shot):
        os.unlink(shot)
    shutil.copyfile(report_page, os.path.join(ARTIFACTS, "summary-report.html"))
    result = browse(report_page, tmp_path, f"--screenshot={shot}", "--window-size=1100,2600")
    assert result.returncode == 0, result.stderr[-2000:]
    with open(shot, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(shot) > 20_000                  # a page, not a blank image
