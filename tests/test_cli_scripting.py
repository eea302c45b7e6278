"""The CLI for scripts: --json documents with "v", check --only/--verbose, hostlists read as
Slurm reads them, and `check --sim PROFILE` judging each shipped profile by its own expectations."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck.config import shipped
from healthcheck.sim.profile import load_profile

from .conftest import run_cli

EXPECTING = [name for name in shipped.shipped_names()
             if load_profile(shipped.resolve(name)).get("expect", {}).get("findings")]


@pytest.fixture(autouse=True)
def no_config(isolated_env, tmp_path):
    """As an admin trying it without a config (the README's `slurm-gpu check --sim PROFILE`)."""
    isolated_env.setenv("SLURM_GPU_HOOKS_CONFIG", str(tmp_path / "absent.toml"))
    isolated_env.delenv("SLURM_GPU_HOOKS_CONFIG")


@pytest.mark.parametrize("name", EXPECTING)
def test_check_sim_shows_every_finding_a_shipped_profile_expects(name):
    expected = set(load_profile(shipped.resolve(name))["expect"]["findings"])
    result = run_cli(["check", "--sim", name, "--json"])
    found = {finding["check"] for finding in json.loads(result.stdout)["findings"]}
    assert found == expected, result.stdout
    assert result.exit_code != 0


def test_most_shipped_profiles_expect_a_finding():
    assert len(EXPECTING) >= 20


def test_an_explicit_tier_runs_only_that_tier():
    """--tier health: the prolog-only gpu.processes is not added for h100-stray-process."""
    assert run_cli(["check", "--sim", "h100-stray-process", "--tier", "health"]).exit_code == 0
    assert run_cli(["check", "--sim", "h100-stray-process"]).exit_code == 2


def test_only_runs_the_named_checks_and_verbose_lists_the_passing_ones():
    result = run_cli(["check", "--sim", "h100-ecc-dbe", "--only", "gpu.ecc.uncorrectable", "--verbose", "--json"])
    doc = json.loads(result.stdout)
    assert doc["v"] == 1 and {f["check"] for f in doc["findings"]} == {"gpu.ecc.uncorrectable"}
    assert doc["checks"] == {"gpu.ecc.uncorrectable": "fail"}
    text = run_cli(["check", "--sim", "h100-ecc-dbe", "--only", "gpu.count", "--only", "nvlink.down", "-v"])
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:-1]] == [["OK", "gpu.count"], ["OK", "nvlink.down"]]
    quiet = run_cli(["check", "--sim", "h100-ecc-dbe", "--only", "gpu.count"])
    assert len(quiet.stdout.splitlines()) == 1          # the summary line only


def test_only_an_unknown_check_is_one_line_and_could_not_check():
    result = run_cli(["check", "--sim", "h100-healthy", "--only", "gpu.eccc"])
    assert result.exit_code == 3 and len(result.stderr.strip().splitlines()) == 1
    assert "--only gpu.eccc: not a check id" in result.stderr


def test_xid_explain_json():
    result = run_cli(["xid", "explain", "79", "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["v"] == 1
    assert (doc["kind"], doc["code"], doc["in_catalog"], doc["action"]) == ("xid", 79, True, "reboot")
    sxid = json.loads(run_cli(["xid", "explain", "sxid:20034", "--json"]).stdout)
    assert sxid["kind"] == "sxid" and "Fatal" in sxid["sxid_actions"]


def test_sim_profiles_json_lists_every_shipped_profile():
    doc = json.loads(run_cli(["sim", "profiles", "--json"]).stdout)
    assert doc["v"] == 1 and [row["name"] for row in doc["profiles"]] == shipped.shipped_names()
    dbe = next(row for row in doc["profiles"] if row["name"] == "h100-ecc-dbe")
    assert dbe["expect"] == ["gpu.ecc.uncorrectable", "kernel.xid"] and os.path.isfile(dbe["path"])


def test_config_check_json_ok_and_not_ok(tmp_path):
    from .conftest import ETC

    good = run_cli(["config", "check", "--json", os.path.join(ETC, "slurm-gpu-hooks.toml")])
    doc = json.loads(good.stdout)
    assert good.exit_code == 0 and doc["v"] == 1 and doc["ok"] and doc["problems"] == []
    assert doc["config"]["drain"]["reason_prefix"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[health]\nconfirm_runs = \"two\"\n")
    result = run_cli(["config", "check", "--json", str(bad)])
    doc = json.loads(result.stdout)
    assert result.exit_code == 2 and doc["ok"] is False and doc["config"] is None
    assert len(doc["problems"]) == 1 and "confirm_runs" in doc["problems"][0]


def test_resume_json_for_a_node_that_is_not_drained(tmp_path, sim_config):
    """Argument building only (a stand-in scontrol); the lab proves resume against Slurm."""
    fixture = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "scontrol-show-node-idle.txt")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\nexec cat {fixture}\n")
    (bindir / "scontrol").chmod(0o755)
    with open(sim_config, "a") as handle:
        handle.write(f'[slurm]\nbin_dir = "{bindir}"\n')
    result = run_cli(["resume", "gpu1", "--json", "--config", sim_config])
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["v"] == 1, result.stderr
    [node] = doc["nodes"]
    assert node["node"] == "gpu1" and node["resumed"] is False and "nothing to resume" in node["message"]


def test_summary_takes_a_hostlist_with_commas_inside_brackets(tmp_path):
    from .test_summary import COL, lab_lines

    header, *rows = lab_lines()
    lines = [header]
    for number, line in enumerate(rows[:3]):
        parts = line.rstrip("\n").split("|")
        parts[COL["NodeList"]] = ("gpu0042", "gpu0314", "gpu0007")[number]
        lines.append("|".join(parts) + "\n")
    path = tmp_path / "sacct.txt"
    path.write_text("".join(lines))
    result = run_cli(["summary", "--input", str(path), "--node", "gpu[0042,0314]", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["v"] == 1 and doc["jobs"] == 2
    both = run_cli(["summary", "--input", str(path), "--node", "gpu0042,gpu[0007]", "--json"])
    assert json.loads(both.stdout)["jobs"] == 2


@pytest.mark.parametrize("argv", [["xid", "scan", "--json", "-"], ["job", "1", "--json"]])
def test_existing_json_documents_keep_their_keys_and_add_v(argv, tmp_path, sim_config):
    if argv[0] == "xid":
        from click.testing import CliRunner

        from slurm_hooks.cli import main

        line = "[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3, GPU has fallen off the bus.\n"
        result = CliRunner().invoke(main, argv, input=line)
        doc = json.loads(result.output.splitlines()[0])
        assert doc["v"] == 1 and doc["code"] == 79
        return
    from healthcheck.records import store

    store.write_record(str(tmp_path / "state"), {"job_id": "1", "node": "gpu1", "class": "COMPLETED",
                                                 "evidence": [], "cause": None})
    with open(sim_config, "a") as handle:
        handle.write('[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    result = run_cli([*argv, "--config", sim_config])
    doc = json.loads(result.stdout)
    assert doc["v"] == 1 and {"job_id", "class", "nodes", "sources"} <= set(doc)


def test_the_man_page_is_current():
    """man/slurm-gpu.1 is what the click help renders now (regenerate it: see slurm_hooks/cli/manpage.py)."""
    from importlib.metadata import version

    from slurm_hooks.cli import main
    from slurm_hooks.cli.manpage import render

    from .conftest import ROOT

    with open(os.path.join(ROOT, "man", "slurm-gpu.1"), encoding="utf-8") as handle:
        shipped_page = handle.read()
    assert shipped_page == render(main, version("slurm-gpu-hooks")), \
        "man/slurm-gpu.1 is stale: python -m slurm_hooks.cli.manpage > man/slurm-gpu.1"
    for command in ("slurm-gpu check", "slurm-gpu xid explain", "slurm-gpu summary", "EXIT STATUS"):
        assert command in shipped_page


def test_one_exit_status_table_in_help_man_and_docs():
    from slurm_hooks.cli import EXIT_STATUS

    from .conftest import ROOT

    helped = " ".join(run_cli(["--help"]).stdout.split())
    with open(os.path.join(ROOT, "docs", "operations.md"), encoding="utf-8") as handle:
        docs = handle.read().split("## Exit status", 1)[1].split("\n## ", 1)[0]
    rows = [tuple(cell.strip().strip("`") for cell in line.strip("|").split("|"))
            for line in docs.splitlines() if line.startswith("| ") and not line.startswith(("| command", "| ---"))]
    assert rows == [(name, codes) for name, codes in EXIT_STATUS]
    for name, codes in EXIT_STATUS:
        assert f"{name} {codes}" in helped


@pytest.mark.parametrize("hook", ["prolog", "epilog", "taskprolog", "healthcheck"])
def test_each_hook_help_is_for_admins(hook):
    import subprocess
    import sys

    module = {"healthcheck": "healthcheck.healthcheck"}.get(hook, f"slurm_hooks.{hook}")
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Exit status:" in text and "slurm.conf" in text and "Docs:" in text
    assert "``" not in text and "Import path" not in text      # not the developer's docstring
