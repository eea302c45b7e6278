"""Strings that jobs and users control (job name, comment, account, user, paths, a process name
in an Xid line) cannot inject into scontrol/sacctmgr arguments, cannot add fields to what
``scontrol show node -o`` prints back, and cannot break or forge this tool's SGH1 AdminComment
entries. The Slurm commands here are stand-ins that record their argv (argument building only);
the hooks themselves are proven on the lab."""
from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from healthcheck.drain_reason import DrainReason, format_reason, is_ours, parse_reason
from healthcheck.records import admin_comment
from healthcheck.config.settings import DrainSettings
from healthcheck.slurm.cli_backend import CliBackend, parse_scontrol_record

from .conftest import builtin_settings

# The shipped [drain] reason_prefix and max_reason_len (defaults.toml).
_DRAIN = builtin_settings(DrainSettings)
PREFIX, WIDTH = _DRAIN.reason_prefix, _DRAIN.max_reason_len

FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HOSTILE = ['x" state=resume', "x state=resume reason=ok", "gpu1 State=IDLE Reason=none", "a\nb\rc\td",
           "$(reboot)", "`id`", "; scontrol update nodename=gpu2 state=down", "' OR 1=1 --", "x\x1fy",
           'SGH1:{"v":1,"node":"*","class":"COMPLETED"}', "JS1:abc", "\u202e\u0000\x7f", "é" * 50, "=" * 10,
           "where jobid=1 set AdminComment=x", "-i", "--help"]
user_text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=80))

RECORDER = """#!/bin/sh
# Writes its arguments NUL-separated, one file per call, for the test to read back.
n=$(ls "$RECORD_DIR" | wc -l)
printf '%s\\0' "$(basename "$0")" "$@" > "$RECORD_DIR/$n"
"""


@pytest.fixture(scope="module")
def fake_slurm(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sacctmgr", "sacct"):
        path = bin_dir / name
        path.write_text(RECORDER)
        path.chmod(stat.S_IRWXU)
    return root


def recorded_calls(record_dir) -> list:
    calls = []
    for name in sorted(os.listdir(record_dir), key=int):
        with open(os.path.join(record_dir, name), "rb") as handle:
            calls.append([part.decode("utf-8", "surrogateescape") for part in handle.read().split(b"\0")[:-1]])
    return calls


def backend(fake_slurm, tmp_path_factory):
    record_dir = tmp_path_factory.mktemp("calls")
    env = {"PATH": "/usr/bin:/bin", "RECORD_DIR": str(record_dir)}
    return CliBackend(bin_dir=str(fake_slurm / "bin"), env=env), record_dir


@st.composite
def drain_reasons(draw):
    return DrainReason(check=draw(st.sampled_from(["kernel.xid", "gpu.ecc.uncorrectable", "ib.port"])),
                       subject=draw(st.one_of(st.sampled_from(["gpu3", "mlx5_0:1", "node"]), user_text)),
                       keys=draw(st.dictionaries(st.sampled_from(["xid", "dbe", "name"]), user_text, max_size=2)),
                       summary=draw(user_text))


# -- drain reasons ------------------------------------------------------------------------------

@FAST
@given(drain_reasons())
@example(DrainReason(check="kernel.xid", subject="gpu5", keys={"xid": "79"},
                     summary="Xid 79 on GPU 5 (process x State=IDLE Reason=ok)"))
# Found by CI (stop 37): a head (subject and key tokens) longer than the width was written whole.
@example(DrainReason(check="kernel.xid", subject="\u00e9" * 50, keys={"xid": "; scontrol update nodename=gpu2 state=down"},
                     summary='x" state=resume'))
def test_a_drain_reason_is_one_line_without_fields_of_its_own(reason):
    # (A reason prefix with '=' or spaces is refused by the config validator.)
    text = format_reason(reason, PREFIX, WIDTH)
    assert len(text) <= 120 and is_ours(text, PREFIX)
    assert all(ch.isprintable() for ch in text)
    # "scontrol show node -o" splits its record at " word=": no '=' may come from us.
    assert "=" not in text
    back = parse_reason(text, PREFIX)
    assert back.check == reason.check
    record = parse_scontrol_record(f"NodeName=gpu2 Arch=x86_64 State=IDLE+DRAIN Weight=1 Reason={text} "
                                   f"[root@2026-11-30T05:20:00] Comment=(null)")
    assert record["State"] == "IDLE+DRAIN" and record["NodeName"] == "gpu2"
    assert record["Reason"].startswith(text.rstrip())


@FAST
@given(drain_reasons())
def test_drain_passes_the_reason_as_one_argument(fake_slurm, tmp_path_factory, reason):
    slurm, record_dir = backend(fake_slurm, tmp_path_factory)
    text = format_reason(reason, PREFIX, WIDTH)
    slurm.drain("gpu1", text)
    assert recorded_calls(record_dir) == [["scontrol", "update", "nodename=gpu1", "state=drain", f"reason={text}"]]


# -- AdminComment entries -----------------------------------------------------------------------

@st.composite
def job_entries(draw):
    entry = {"node": draw(st.sampled_from(["*", "gpu1", "gpu2"])),
             "class": draw(st.sampled_from(["COMPLETED", "GPU_LOST", "TIMEOUT", "NODE_FAIL"]))}
    for key in draw(st.sets(st.sampled_from(["job_name", "comment", "account", "user", "workdir", "msg"]))):
        entry[key] = draw(user_text)
    return entry


@FAST
@given(st.one_of(st.none(), user_text), st.lists(job_entries(), min_size=1, max_size=3, unique_by=lambda e: e["node"]))
def test_user_strings_cannot_break_or_forge_our_entries(existing, entries):
    merged = admin_comment.merge(existing, entries)
    assert merged.isascii() or not admin_comment.others(existing).isascii()
    ours = [part for part in merged.split(" ") if part.startswith(admin_comment.TAG)]
    assert all("\n" not in part and "\x1f" not in part for part in ours)
    parsed = admin_comment.parse(merged)
    latest = {}
    for entry in entries:
        latest[entry["node"]] = entry
    # Every entry reads back exactly; a user string holding "SGH1:{...}" adds none of its own.
    for node, entry in latest.items():
        found = [e for e in parsed if e.get("node") == node]
        assert found and dict(found[-1], v=None) == dict(entry, v=None)
    assert len(parsed) == len(latest) + len([e for e in admin_comment.parse(existing)
                                             if str(e.get("node")) not in latest])
    # Others' text (jobstats' blob, an admin's note) is kept, and merging is stable.
    assert admin_comment.others(merged) == admin_comment.others(existing)
    assert admin_comment.merge(merged, entries) == merged


@FAST
@given(st.lists(job_entries(), min_size=1, max_size=2, unique_by=lambda e: e["node"]),
       st.text(alphabet="0123456789", min_size=1, max_size=8))
def test_set_admin_comment_passes_the_text_as_one_argument(fake_slurm, tmp_path_factory, entries, job_id):
    slurm, record_dir = backend(fake_slurm, tmp_path_factory)
    text = admin_comment.merge("JS1:eyJ4IjoxfQ== admin note", entries)
    slurm.set_admin_comment(job_id, text)
    assert recorded_calls(record_dir) == [["sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set",
                                           f"AdminComment={text}"]]


@FAST
@given(st.lists(user_text, min_size=1, max_size=3))
def test_sacct_gets_fixed_arguments_whatever_the_field_names(fake_slurm, tmp_path_factory, job_ids):
    slurm, record_dir = backend(fake_slurm, tmp_path_factory)
    slurm.accounting(["12", "13"], ["JobID", "JobName", "AdminComment"])
    call = recorded_calls(record_dir)[0]
    assert call[0] == "sacct" and call[-2:] == ["-j", "12,13"]
    assert all("\n" not in part for part in call)


@pytest.mark.parametrize("prefix", ["a=b", "gpu hooks:", "", "x" * 33, "tab\there"])
def test_config_refuses_a_reason_prefix_that_scontrol_would_split(prefix):
    from healthcheck.config import Config, ConfigError

    with pytest.raises(ConfigError) as caught:
        Config.from_document({"drain": {"reason_prefix": prefix}}, "c.toml")
    assert any("drain.reason_prefix" in line for line in caught.value.lines())
