"""`slurm-gpu slurm-conf --slurm VERSION` on the lab's own release: the settings it prints (the
health-check ones, and PrologTimeout/EpilogTimeout/HealthCheckTimeout where the release has
them) are accepted by that release's slurmctld: `scontrol reconfigure` succeeds, the appended
settings are in force, and slurmctld logs no error about any of them. The lab's slurm.conf is put
back afterwards."""
from __future__ import annotations

import os
import re

import pytest

from slurm_hooks.cli.slurm_conf_cmd import parse_release, release_lines

from .conftest import lab_release, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.every_release]

HOOK_PATHS = ("Prolog", "Epilog", "EpilogSlurmctld", "TaskProlog", "HealthCheckProgram", "PrologFlags")
INTERVAL = 120      # above HealthCheckTimeout (26.05 wants it so); the lab's own is 10


def settings(text: str):
    return [tuple(line.split("=", 1)) for line in text.splitlines() if line and not line.startswith("#")]


def test_the_lines_printed_for_the_labs_release_are_accepted_by_its_slurmctld(lab, cli):
    release = lab_release()
    printed = cli("slurm-conf", "--slurm", release, "--bin-dir", lab.paths.hooks, "--interval", str(INTERVAL),
                  "--node-state", "IDLE")
    assert printed.returncode == 0, printed.stderr
    lines = settings(printed.stdout)
    added = [line["setting"] for line in release_lines(parse_release(release))]
    assert [key for key, _ in lines if key in added] == added
    assert ("PrologTimeout" in dict(lines)) == (parse_release(release) >= (25, 5))
    assert ("HealthCheckTimeout" in dict(lines)) == (parse_release(release) >= (26, 5))
    # The lab's hooks stay (their wrappers are the lab's); every other printed setting is appended.
    appended = [f"{key}={value}" for key, value in lines if key not in HOOK_PATHS]
    with open(lab.paths.slurm_conf, encoding="utf-8") as handle:
        original = handle.read()
    log_start = os.path.getsize(lab.paths.slurmctld_log)
    try:
        with open(lab.paths.slurm_conf, "w", encoding="utf-8") as handle:
            handle.write(original + "\n".join(appended) + "\n")
        done = lab.run("scontrol", "reconfigure")
        assert done.returncode == 0, done.stderr
        shown = wait_for("the appended settings in force",
                         lambda: _shown_if(lab, r"^HealthCheckNodeState\s*=\s*IDLE"), timeout=60)
        assert re.search(rf"^HealthCheckInterval\s*=\s*{INTERVAL}\b", shown, re.MULTILINE), shown
        for key, value in lines:
            if re.search(rf"^{key}\s*=", shown, re.MULTILINE) and key not in HOOK_PATHS:
                assert re.search(rf"^{key}\s*=\s*{re.escape(value)}\b", shown, re.MULTILINE), (key, shown)
        with open(lab.paths.slurmctld_log, encoding="utf-8", errors="replace") as handle:
            handle.seek(log_start)
            errors = [line for line in handle if "error:" in line and "specified more than once" not in line]
        about_ours = [line for line in errors if any(key in line for key, _ in lines)]
        assert about_ours == [], about_ours
    finally:
        with open(lab.paths.slurm_conf, "w", encoding="utf-8") as handle:
            handle.write(original)
        lab.run("scontrol", "reconfigure")
        wait_for("the lab's own settings back", lambda: _shown_if(lab, r"^HealthCheckNodeState\s*=\s*ANY"),
                 timeout=60)


def _shown_if(lab, pattern: str) -> str:
    shown = lab.run("scontrol", "show", "config").stdout
    return shown if re.search(pattern, shown, re.MULTILINE) else ""
