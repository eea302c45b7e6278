"""slurm-gpu summary on real-format accounting: sacct output captured from the lab after the
scenarios (tests/data/summary/), with AdminComment entries of ours added in our own format."""
from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import Counter

import pytest
from healthcheck.records import admin_comment
from tests.conftest import builtin_settings, run_cli
from slurm_hooks.summary import accounting, drains
from slurm_hooks.summary.accounting import SACCT_FIELDS, SACCT_FORMAT, AccountingError, read_rows
from slurm_hooks.summary.verdict import SOURCE_ACCOUNTING, SOURCE_HOOKS, UNFINISHED, classify, quick_cause
from slurm_hooks.summary.offenders import OffenderRules, poisson_tail, rank_nodes
from slurm_hooks.summary.report import build
from slurm_hooks.summary.rows import gpus_of
from slurm_hooks.summary.tally import Filters, NodeTally, Tally
from healthcheck.config.settings import SummarySettings

DATA = os.path.join(os.path.dirname(__file__), "data", "summary")
LAB_SACCT = os.path.join(DATA, "sacct-lab-scenarios.txt")
LAB_SINFO = os.path.join(DATA, "sinfo-lab.json")
LAB_EVENTS = os.path.join(DATA, "sacctmgr-events-lab.txt")
COL = {name: i for i, name in enumerate(SACCT_FIELDS)}
MAX_LINE = builtin_settings(SummarySettings).max_line_bytes     # the shipped [summary] max_line_bytes


def lab_lines():
    with open(LAB_SACCT, encoding="utf-8") as handle:
        return handle.read().splitlines(keepends=True)


def with_comments(comments):
    """The lab's sacct output with AdminComment set for some jobs ({JobIDRaw: text})."""
    out = []
    for line in lab_lines():
        parts = line.rstrip("\n").split("|")
        if parts[0] in comments and parts[0] != "JobIDRaw":
            parts[COL["AdminComment"]] = comments[parts[0]]
        out.append("|".join(parts) + "\n")
    return out


# The hooks' view of the lab's hardware scenarios (jobs 7, 10, 13, 15 in the capture).
HOOKED = {
    "7": " ".join([admin_comment.encode({"node": "gpu1", "class": "GPU_LOST", "gpu": 3, "xid": 79}),
                   admin_comment.encode({"node": "*", "class": "GPU_LOST", "nodes": "gpu1"})]),
    "13": admin_comment.encode({"node": "gpu2", "class": "GPU_ECC", "gpu": 0, "xid": 48}),
    "15": "JS1:c29tZSBqb2JzdGF0cyBibG9i " + admin_comment.encode({"node": "gpu3", "class": "NVLINK", "gpu": 1, "xid": 74}),
    "10": admin_comment.encode({"node": "*", "class": "INFINIBAND", "check": "ib.port.state"}),
    "2": admin_comment.encode({"node": "*", "class": "COMPLETED", "nodes": "gpu1", "t": 1796049494}),
}


def tally_of(lines, filters=None):
    tally = Tally(filters)
    problems = []
    tally.add(read_rows(lines, problems))
    assert problems == []
    return tally


def expected_from_capture(lines, comments):
    """Per cause: jobs and GPU-seconds, computed straight from the text (independent of the tally)."""
    jobs, gpu_seconds = Counter(), Counter()
    for line in lines[1:]:
        parts = line.rstrip("\n").split("|")
        cause = parts[COL["State"]].split(" ")[0]
        if parts[0] in comments:
            entries = admin_comment.parse(comments[parts[0]])
            job_level = [e for e in entries if e["node"] == "*"]
            cause = (job_level or entries)[-1]["class"]
        match = re.search(r"gres/gpu=(\d+)", parts[COL["AllocTRES"]])
        jobs[cause] += 1
        gpu_seconds[cause] += (int(match.group(1)) if match else 0) * int(parts[COL["ElapsedRaw"]])
    return jobs, gpu_seconds


# -- the format contract ------------------------------------------------------------------------
def test_sacct_format_is_the_contract():
    result = run_cli(["summary", "--sacct-format"])
    assert result.exit_code == 0
    assert result.output.strip() == SACCT_FORMAT
    assert SACCT_FORMAT.split(",")[-2:] == ["AdminComment", "JobName"]      # free text last
    assert lab_lines()[0].rstrip("\n") == "|".join(SACCT_FIELDS)


def test_live_sacct_arguments_ask_for_every_incarnation_of_every_user():
    args = accounting.sacct_arguments("2026-11-01T00:00:00", "2026-11-02T00:00:00", users=["alice"], job_ids=["7"])
    assert {"-a", "-D", "-X", "-n", "-P"} <= set(args)
    assert f"--format={SACCT_FORMAT}" in args and "--delimiter=\x1f" in args
    assert "--starttime=2026-11-01T00:00:00" in args and "--user=alice" in args and "--jobs=7" in args


# -- reading ----------------------------------------------------------------------------------------
def test_reads_the_lab_capture_with_every_incarnation():
    rows = list(read_rows(lab_lines(), []))
    assert len(rows) == 16
    requeued = [r for r in rows if r[COL["JobIDRaw"]] == "11"]
    assert [r[COL["State"]] for r in requeued] == ["PREEMPTED", "COMPLETED"]
    assert len({r[COL["DBIndex"]] for r in requeued}) == 2


def test_pipes_in_job_names_and_in_our_entries_are_put_back():
    entry = admin_comment.encode({"node": "*", "class": "FAILED", "msg": "a|b SGH1: c"})
    line = lab_lines()[6].rstrip("\n").split("|")
    line[COL["AdminComment"]] = entry
    line[COL["JobName"]] = "train|v2|final"
    rows = list(read_rows(["|".join(line) + "\n"], []))
    assert len(rows) == 1
    assert rows[0][COL["AdminComment"]] == entry
    assert accounting.job_name(rows[0]) == "train|v2|final"


def test_live_delimiter_is_detected():
    text = lab_lines()[2].replace("|", "\x1f")
    rows = list(read_rows([text], []))
    assert rows[0][COL["State"]] == "COMPLETED" and accounting.job_name(rows[0]) == "lab-completed"


def test_a_header_of_another_format_is_refused():
    with pytest.raises(AccountingError, match="expected JobIDRaw,JobID"):
        list(read_rows(["JobID|State|ExitCode\n", "1|COMPLETED|0:0\n"], []))


def test_lines_of_another_shape_are_reported_not_hidden():
    problems = []
    rows = list(read_rows(lab_lines()[:3] + ["garbage\n", "\n", "1|2|3\n"], problems))
    assert len(rows) == 2
    assert len(problems) == 2 and "17 fields" in problems[0]


# -- classification ---------------------------------------------------------------------------------
def test_jobs_without_an_entry_are_classified_from_sacct_state():
    verdict = classify("CANCELLED by 0", "")
    assert (verdict.cause, verdict.source, verdict.hardware) == ("CANCELLED", SOURCE_ACCOUNTING, False)
    assert classify("FAILED", "JS1:abcdef admin note").source == SOURCE_ACCOUNTING


def test_job_level_entry_decides_and_node_entries_name_the_hardware():
    verdict = classify("FAILED", HOOKED["7"], ("gpu1",))
    assert (verdict.cause, verdict.source, verdict.hardware) == ("GPU_LOST", SOURCE_HOOKS, True)
    assert [(c.node, c.gpu, c.xid) for c in verdict.culprits] == [("gpu1", 3, 79)]
    assert verdict.xids == (79,)


def test_a_node_entry_alone_decides_a_hardware_cause_on_a_multi_node_job():
    comment = admin_comment.encode({"node": "gpu2", "class": "FAILED"}) + " " + \
        admin_comment.encode({"node": "gpu3", "class": "GPU_XID", "gpu": 5, "xid": 94})
    verdict = classify("FAILED", comment, ("gpu1", "gpu2", "gpu3"))
    assert verdict.cause == "GPU_XID" and [c.node for c in verdict.culprits] == ["gpu3"]


def test_a_job_level_hardware_entry_on_a_one_node_job_names_that_node():
    verdict = classify("FAILED", HOOKED["10"], ("gpu1",))
    assert verdict.cause == "INFINIBAND" and verdict.culprits[0].node == "gpu1"
    assert classify("FAILED", HOOKED["10"], ("gpu1", "gpu2")).culprits == []


def test_damaged_entries_are_skipped():
    assert classify("TIMEOUT", 'SGH1:{"v":1,"node":"*","class":').cause == "TIMEOUT"


@pytest.mark.parametrize("comment", [
    admin_comment.encode({"node": "*", "class": "COMPLETED", "nodes": "gpu[1-3]", "t": 1796049494}),
    admin_comment.encode({"node": "*", "class": "FAILED", "exit": 3, "msg": "x"}),
    "JS1:blob " + admin_comment.encode({"node": "*", "class": "TIMEOUT"}),
])
def test_the_fast_path_agrees_with_the_full_parser(comment):
    assert quick_cause(comment) == classify("COMPLETED", comment).cause


def test_the_tally_decides_every_row_of_a_month_as_the_full_parser_does(tmp_path):
    """The tally reads simple entries in place (both forms, after a jobstats blob too) and
    leaves the rest to ``classify``: per cause and source, a generated month counts the same as
    ``classify`` on every row."""
    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 3000, seed=3)
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    expected = Counter()
    for row in read_rows(lines, []):
        if row[COL["State"]].split(" ")[0] in UNFINISHED:
            continue
        verdict = classify(row[COL["State"]], row[COL["AdminComment"]], tuple(Tally()._nodes(row[COL["NodeList"]])))
        expected[(verdict.cause, verdict.source)] += 1
    report = build(tally_of(lines), {}, [], [])
    got = Counter()
    for cause, row in report["by_cause"].items():
        got[(cause, SOURCE_HOOKS)] += row["jobs"] - row["from_accounting"]
        got[(cause, SOURCE_ACCOUNTING)] += row["from_accounting"]
    assert +got == +expected
    prefixed = [line for line in lines if re.search(r"\|js1:\S+ sgh1:\{`v`:1,`node`:`\*`", line)]
    assert len(prefixed) > 100           # the generator's jobstats blobs before a job-level entry


def stored(text):
    """AdminComment as sacctmgr stores it on 22.05.8: lower case, every quote a backtick."""
    return text.lower().replace('"', "`").replace("'", "`")


def test_entries_as_sacctmgr_stores_them_are_read():
    simple = admin_comment.encode({"node": "*", "class": "OUT_OF_MEMORY", "nodes": "gpu1", "t": 1})
    assert quick_cause(stored(simple)) == "OUT_OF_MEMORY"
    verdict = classify("FAILED", stored(HOOKED["7"]), ("gpu1",))
    assert (verdict.cause, verdict.source, verdict.xids) == ("GPU_LOST", SOURCE_HOOKS, (79,))
    assert quick_cause(stored(HOOKED["7"])) is None
    lines = with_comments({job: stored(text) for job, text in HOOKED.items()})
    report = build(tally_of(lines), {}, [], [])
    jobs, _ = expected_from_capture(with_comments(HOOKED), HOOKED)
    assert {c: r["jobs"] for c, r in report["by_cause"].items()} == dict(jobs)
    assert {x["xid"] for x in report["by_xid"]} == {79, 48, 74}


def test_a_pipe_inside_a_stored_entry_is_put_back():
    entry = stored(admin_comment.encode({"node": "*", "class": "FAILED", "msg": "a|b"}))
    line = lab_lines()[6].rstrip("\n").split("|")
    line[COL["AdminComment"]] = entry
    line[COL["JobName"]] = "x|y"
    rows = list(read_rows(["|".join(line) + "\n"], []))
    assert rows[0][COL["AdminComment"]] == entry and accounting.job_name(rows[0]) == "x|y"


@pytest.mark.parametrize("comment", [HOOKED["7"], HOOKED["10"], HOOKED["13"],
                                     admin_comment.encode({"node": "*", "class": "FAILED", "xid": 13})])
def test_the_fast_path_leaves_hardware_and_xids_to_the_full_parser(comment):
    assert quick_cause(comment) is None


def test_gpus_from_alloc_tres():
    assert gpus_of("billing=1,cpu=1,gres/gpu=2,mem=125M,node=1") == 2
    assert gpus_of("billing=8,cpu=8,gres/gpu:h100=4,gres/gpu:a100=2,node=2") == 6
    assert gpus_of("billing=1,cpu=1,gres/gpumem=80G,mem=125M,node=1") == 0


# -- the tally and the JSON contract ---------------------------------------------------------------------
def test_counts_and_gpu_hours_per_cause_match_the_capture():
    lines = with_comments(HOOKED)
    report = build(tally_of(lines), {"since": None, "until": None}, [], [])
    jobs, gpu_seconds = expected_from_capture(lines, HOOKED)
    assert {c: r["jobs"] for c, r in report["by_cause"].items()} == dict(jobs)
    for cause, seconds in gpu_seconds.items():
        assert report["by_cause"][cause]["gpu_hours"] == pytest.approx(seconds / 3600, abs=1e-3)
    assert report["jobs"] == 16
    assert report["by_cause"]["COMPLETED"]["from_accounting"] == jobs["COMPLETED"] - 1
    assert report["hardware"]["jobs"] == 4


def test_the_json_contract_keys():
    report = build(tally_of(with_comments(HOOKED)), {"since": "a", "until": "b"}, [], [])
    assert {"window", "jobs", "by_cause", "by_node", "by_xid", "drained"} <= set(report)
    for row in report["by_cause"].values():
        assert {"jobs", "gpu_hours"} <= set(row)
    assert json.loads(json.dumps(report)) == report


def test_nodes_gpus_and_xids_behind_hardware_endings():
    report = build(tally_of(with_comments(HOOKED)), {}, [], [])
    by_node = {n["node"]: n for n in report["by_node"]}
    assert by_node["gpu1"]["hardware_endings"] == 2          # Xid 79 and the IB port
    assert by_node["gpu2"]["hardware_endings"] == 1 and by_node["gpu3"]["hardware_endings"] == 1
    import hostlist

    ran_on = Counter(node for r in read_rows(lab_lines(), []) for node in hostlist.expand_hostlist(r[COL["NodeList"]]))
    assert {name: n["jobs"] for name, n in by_node.items()} == dict(ran_on)     # gpu[1-3] counts on each
    xids = {x["xid"]: x for x in report["by_xid"]}
    assert set(xids) == {79, 48, 74}
    assert xids[79]["mnemonic"] and xids[79]["nodes"] == {"gpu1": 1}
    assert {(g["node"], g["gpu"]) for g in report["by_gpu"]} == {("gpu1", 3), ("gpu2", 0), ("gpu3", 1)}


def test_node_hours_are_the_jobs_elapsed_time_on_each_node():
    report = build(tally_of(lab_lines()), {}, [], [])
    rows = list(read_rows(lab_lines(), []))
    gpu3 = sum(int(r[COL["ElapsedRaw"]]) for r in rows if "gpu3" in r[COL["NodeList"]] or "[1-3]" in r[COL["NodeList"]])
    assert {n["node"]: n["node_hours"] for n in report["by_node"]}["gpu3"] == pytest.approx(gpu3 / 3600, abs=1e-3)


@pytest.mark.parametrize("filters, expected_jobs", [
    (Filters(states=frozenset({"FAILED"})), 5),
    (Filters(partitions=frozenset({"high"})), 2),
    (Filters(nodes=frozenset({"gpu3"})), 3),                              # node-fail, nvlink, three-nodes
    (Filters(causes=frozenset({"GPU_LOST", "GPU_ECC"})), 2),
    (Filters(since="2026-11-30T14:38:20", until="2026-11-30T14:38:40"), 4),  # jobs 11 (twice), 12, 13
    (Filters(job_ids=frozenset({"11"})), 2),
    (Filters(users=frozenset({"nobody"})), 0),
])
def test_filters(filters, expected_jobs):
    assert tally_of(with_comments(HOOKED), filters).jobs == expected_jobs


def test_unfinished_jobs_are_not_endings():
    line = lab_lines()[2].replace("|COMPLETED|", "|RUNNING|").replace("2026-11-30T14:38:14", "Unknown")
    tally = tally_of([line])
    assert (tally.jobs, tally.unfinished) == (0, 1)


# -- repeat offenders -------------------------------------------------------------------------------------
def test_poisson_tail():
    assert poisson_tail(1, 1.0) == pytest.approx(1 - 2.718281828 ** -1)
    assert poisson_tail(0, 3.0) == 1.0 and poisson_tail(2, 0.0) == 0.0
    assert poisson_tail(10, 1.0) < 1e-6


def _nodes(**spec):
    return {name: NodeTally(jobs=10, node_seconds=hours * 3600, hardware=hw) for name, (hours, hw) in spec.items()}


def test_a_node_far_above_the_fleet_rate_is_flagged_and_ranked_first():
    nodes = _nodes(**{f"n{i:02d}": (100.0, 1) for i in range(40)}, lemon=(100.0, 8))
    ranked = rank_nodes(nodes, builtin_settings(OffenderRules))
    assert ranked[0]["node"] == "lemon" and ranked[0]["flagged"]
    assert "8 hardware-caused endings" in ranked[0]["why"]
    assert not any(n["flagged"] for n in ranked[1:])


def test_a_busy_node_is_not_flagged_for_being_busy():
    nodes = _nodes(**{f"n{i:02d}": (100.0, 1) for i in range(40)}, busy=(1000.0, 10))
    assert not any(n["flagged"] for n in rank_nodes(nodes, builtin_settings(OffenderRules)))


def test_one_unlucky_ending_is_not_a_pattern():
    nodes = _nodes(**{f"n{i:02d}": (100.0, 0) for i in range(40)}, once=(1.0, 1))
    assert not any(n["flagged"] for n in rank_nodes(nodes, builtin_settings(OffenderRules)))


def test_offender_thresholds_come_from_config(tmp_path):
    from healthcheck.config import Config

    path = tmp_path / "c.toml"
    path.write_text("[summary]\noffender_min_events = 5\noffender_ratio = 2.5\noffender_max_p = 0.02\n")
    assert OffenderRules.from_config(Config.load(str(path))) == OffenderRules(5, 2.5, 0.02)


# -- drains ----------------------------------------------------------------------------------------------
def test_drained_now_from_sinfo_json_reads_our_reason():
    with open(LAB_SINFO, encoding="utf-8") as handle:
        drained = drains.drained_from_sinfo(json.load(handle), "gpu-hooks:")
    assert [d["node"] for d in drained] == ["gpu2"]
    assert drained[0]["ours"] and drained[0]["check"] == "kernel.xid" and drained[0]["xid"] == 79
    assert drained[0]["state"] == "IDLE+DRAIN" and drained[0]["set_by"] == "root"


RELEASES = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "releases")


@pytest.mark.parametrize("release, name", [
    ("22.05", "sinfo-json-drained.json"),               # a list of nodes
    ("24.11", "sinfo-json-drained.json"),               # groups of nodes, once per partition
    ("26.05", "sinfo-json-drained.json"),
    ("24.11", "scontrol-json-show-node-drained.json"),  # what the summary asks from 23.02 on
    ("26.05", "scontrol-json-show-node-drained.json"),
])
def test_drained_now_from_each_releases_captured_json(release, name):
    """The lab's own captures (`slurm-gpu lab capture`): gpu3 drained with a reason of ours."""
    with open(os.path.join(RELEASES, release, name), encoding="utf-8") as handle:
        drained = drains.drained_from_sinfo(json.load(handle), "gpu-hooks:")
    assert [(d["node"], d["state"], d["ours"], d["check"]) for d in drained] == [("gpu3", "IDLE+DRAIN", True, "capture")]
    assert drained[0]["since"].startswith("2026-")


def test_a_document_with_neither_nodes_nor_groups_is_refused():
    with pytest.raises(ValueError, match="no \"nodes\" or \"sinfo\" list"):
        drains.drained_from_sinfo({"meta": {}}, "gpu-hooks:")


def test_drains_in_the_window_from_sacctmgr_events():
    with open(LAB_EVENTS, encoding="utf-8") as handle:
        events = list(drains.drain_events(handle, "2026-11-30T14:00:00", "2026-11-30T15:00:00", "gpu-hooks:"))
    assert Counter(events) == Counter({("gpu1", True): 1, ("gpu2", False): 1, ("gpu2", True): 1,
                                       ("gpu3", True): 1, ("gpu3", False): 1})


# -- the command -------------------------------------------------------------------------------------------
def run(*args):
    return run_cli(["summary", *args])


@pytest.fixture
def hooked_input(tmp_path):
    path = tmp_path / "sacct.txt"
    path.write_text("".join(with_comments(HOOKED)))
    return str(path)


def test_json_from_input_with_saved_sinfo_and_events(hooked_input):
    result = run("--input", hooked_input, "--sinfo-json", LAB_SINFO, "--events", LAB_EVENTS, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["jobs"] == 16 and report["by_cause"]["GPU_LOST"]["jobs"] == 1
    assert [d["node"] for d in report["drained"]] == ["gpu2"]
    assert {n["node"]: n["drains"] for n in report["by_node"]} == {"gpu1": 1, "gpu2": 2, "gpu3": 2}


def test_input_alone_says_what_it_does_not_know(hooked_input):
    result = run("--input", hooked_input)
    assert result.exit_code == 0
    assert "GPU_LOST" in result.stdout and "COMPLETED(*)" in result.stdout and "TIMEOUT*" in result.stdout
    assert "nodes drained now: not known" in result.stdout


def test_per_job_json_is_one_valid_object(hooked_input):
    result = run("--input", hooked_input, "--json", "--jobs")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert len(report["job_rows"]) == report["jobs"] == 16
    row = [r for r in report["job_rows"] if r["job"] == "7"][0]
    assert (row["cause"], row["source"], row["gpus"], row["culprits"], row["xids"]) == \
        ("GPU_LOST", "hooks", 2, "gpu1:gpu3", "79")


def test_csv_quotes_every_field_and_disarms_formulas(tmp_path):
    line = lab_lines()[2].rstrip("\n").split("|")
    line[COL["JobName"]] = '=HYPERLINK("http://x"),"quoted"'
    path = tmp_path / "s.txt"
    path.write_text("|".join(line) + "\n")
    result = run("--input", str(path), "--csv", "--jobs")
    assert result.exit_code == 0
    assert result.stdout.startswith('"job","name"')
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert rows[0]["name"] == '\'=HYPERLINK("http://x"),"quoted"'
    by_node = run("--input", str(path), "--csv", "--by", "node")
    assert list(csv.reader(io.StringIO(by_node.stdout)))[1][0] == "gpu1"


def test_terminal_output_escapes_control_characters(tmp_path):
    line = lab_lines()[2].rstrip("\n").split("|")
    line[COL["JobName"]] = "evil\x1b[2Jname"
    path = tmp_path / "s.txt"
    path.write_text("|".join(line) + "\n")
    result = run("--input", str(path), "--jobs")
    assert "\x1b" not in result.stdout and "evil\\x1b[2Jname" in result.stdout


@pytest.mark.parametrize("args, code, message", [
    (["--input", "/nonexistent/sacct.txt"], 1, "No such file"),
    (["--since", "yesterday-ish"], 2, "not a time"),
    (["--until", "soonish", "--input", "-"], 2, "--until 'soonish'"),
    (["--since", "2026-11-02T00:00:00", "--until", "2026-11-01T00:00:00", "--input", "-"], 2, "before --until"),
    (["--json", "--csv", "--input", "-"], 2, "exclude each other"),
    (["--sinfo-json", "x.json"], 2, "go with --input"),
    (["--node", "gpu[1-", "--input", "-"], 2, "not a node name"),
])
def test_bad_input_is_one_line_and_non_zero(args, code, message):
    result = run(*args)
    assert result.exit_code == code
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_a_foreign_header_is_one_line_and_exit_1(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("JobID|JobName|State\n1|x|COMPLETED\n")
    result = run("--input", str(path))
    assert result.exit_code == 1 and "--sacct-format" in result.stderr


def test_malformed_lines_are_counted_and_the_exit_says_so(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("".join(lab_lines()) + "not|a|row\n")
    result = run("--input", str(path), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["jobs"] == 16
    assert "not a sacct row" in result.stderr


# -- the HTML page ------------------------------------------------------------------------------------------
def test_html_is_self_contained_and_escapes_job_names(tmp_path):
    comments = dict(HOOKED)
    line_names = {"7": "<script>alert(1)</script>"}
    lines = []
    for line in with_comments(comments):
        parts = line.rstrip("\n").split("|")
        if parts[0] in line_names:
            parts[-1] = line_names[parts[0]]
        lines.append("|".join(parts) + "\n")
    path = tmp_path / "s.txt"
    path.write_text("".join(lines))
    out = tmp_path / "r.html"
    result = run("--input", str(path), "--sinfo-json", LAB_SINFO, "--html", str(out))
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)=\"?(https?:)?//", page)
    assert page.count("<svg") == 4                       # over time, lost per cause, share, nodes
    from healthcheck.xid.catalog import XidCatalog
    from markupsafe import escape

    assert str(escape(XidCatalog().entry(79).mnemonic)) in page
    assert "gpu-hooks: v1 kernel.xid gpu0 xid:79; test" in page     # drained now, with its reason


def generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_sacct", os.path.join(os.path.dirname(__file__), "..", "bench", "gen_sacct.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_generator_is_deterministic_and_parses_cleanly(tmp_path):
    gen = generator()
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    rows = gen.write_jobs(str(a), 3000, seed=7)
    gen.write_jobs(str(b), 3000, seed=7)
    assert a.read_bytes() == b.read_bytes()
    with open(a, encoding="utf-8") as handle:
        tally = tally_of(handle)
    assert tally.jobs == rows >= 3000
    report = build(tally, {}, [], [])
    assert report["hardware"]["jobs"] > 0 and report["by_xid"]
    assert any(cause.startswith("CANCELLED") for cause in report["by_cause"])


# -- several processes ---------------------------------------------------------------------------------
def test_byte_ranges_start_at_lines_and_cover_the_file(tmp_path):
    from slurm_hooks.summary.parallel import byte_ranges

    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 500, seed=5)
    data = path.read_bytes()
    ranges = byte_ranges(str(path), 7)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data) and len(ranges) == 7
    assert all(end == start for (_, end), (start, _) in zip(ranges, ranges[1:]))
    assert all(data[start - 1:start] == b"\n" for start, _ in ranges[1:])


def test_several_workers_give_the_report_of_one_pass(tmp_path):
    from slurm_hooks.summary.parallel import tally_file

    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 6000, seed=11)
    with open(path, encoding="utf-8") as handle:
        one = build(tally_of(handle), {}, [], [])
    problems = []
    many = build(tally_file(str(path), Filters(), 3, problems, accounting.LineCap(MAX_LINE)), {}, [], [])
    assert problems == [] and many["jobs"] == one["jobs"] > 6000
    assert many == one


def test_the_command_prints_the_same_json_with_one_worker_and_with_several(tmp_path, monkeypatch):
    """``summary --input --json`` byte for byte the same whether one process reads the file or
    several do (each their own byte range), on a generated month: hostile names, both entry
    forms, lemons, requeues, lines with the delimiter in the job name, one without its end."""
    from slurm_hooks.summary import parallel

    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 4000, seed=7)
    with open(path, "rb+") as handle:          # the last line without its line end
        handle.seek(-1, os.SEEK_END)
        handle.truncate()
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_WORKER", 1)   # a small file read by several,
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_RANGE", 1)    # each taking several ranges
    calls = []
    monkeypatch.setattr(parallel, "byte_ranges", lambda p, n, real=parallel.byte_ranges: calls.append(n) or real(p, n))
    outputs = {}
    for workers in ("1", "2", "3"):
        result = run("--input", str(path), "--json", "--workers", workers)
        assert result.exit_code == 0, result.stderr
        outputs[workers] = result.stdout
    assert calls == [2 * parallel.RANGES_PER_WORKER, 3 * parallel.RANGES_PER_WORKER]  # 1, then 2 and 3 processes
    report = json.loads(outputs["1"])
    assert report["jobs"] > 4000 and report["by_xid"] and report["largest_hardware_losses"]
    assert outputs["1"] == outputs["2"] == outputs["3"]


def test_lines_that_are_not_rows_are_told_as_one_pass_tells_them_whoever_read_them(tmp_path, monkeypatch):
    """Each process takes ranges from a shared queue, so which process reads a bad line varies
    from run to run; the problems are the file's first examples and its whole count."""
    from slurm_hooks.summary import parallel

    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 3000, seed=4)
    lines = path.read_text().splitlines(keepends=True)
    for at in range(100, len(lines), len(lines) // 9):     # nine bad lines spread over the file
        lines[at] = f"garbage line {at}\n"
    path.write_text("".join(lines))
    with open(path, "rb") as handle:
        one_pass = []
        single = Tally()
        single.add_chunks(accounting.row_blocks(handle, accounting.LineCap(MAX_LINE), one_pass))
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_RANGE", 1)
    for workers in (2, 3):
        problems = []
        many = parallel.tally_file(str(path), Filters(), workers, problems, accounting.LineCap(MAX_LINE))
        assert problems == one_pass and len(problems) == 4 and problems[-1].startswith("9 lines in all")
        assert build(many, {}, [], []) == build(single, {}, [], [])


def test_a_tally_travels_pickled_without_its_caches_and_counts_on(tmp_path):
    import pickle

    lines = with_comments(HOOKED)
    whole = tally_of(lines)
    first = tally_of(lines[:8])
    assert first._node_cache                           # filled while counting
    travelled = pickle.loads(pickle.dumps(first))
    assert travelled._node_cache == {} and not travelled._gpu_counts and travelled.on_job is None
    travelled.add(read_rows(lines[8:], []))           # the caches are there again, empty
    assert build(travelled, {}, [], []) == build(whole, {}, [], [])


def test_a_reader_process_that_dies_or_fails_is_one_line_and_a_failure(tmp_path, monkeypatch):
    from slurm_hooks.summary import parallel

    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 2000, seed=2)
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_WORKER", 1)
    real, parent = parallel._work, os.getpid()

    def dies(job, queue):
        if os.getpid() != parent:          # a forked child
            os._exit(3)
        return real(job, queue)

    monkeypatch.setattr(parallel, "_work", dies)
    result = run("--input", str(path), "--json", "--workers", "2")
    assert result.exit_code != 0 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "reader process ended with status 3" in result.stderr

    def fails(job, queue):
        if os.getpid() != parent:
            raise OSError(5, "Input/output error")
        return real(job, queue)

    monkeypatch.setattr(parallel, "_work", fails)
    with pytest.raises(OSError, match="Input/output error"):
        parallel.tally_file(str(path), Filters(), 3, [], accounting.LineCap(MAX_LINE))


def test_a_fork_that_fails_leaves_the_file_to_the_processes_there(tmp_path, monkeypatch):
    from slurm_hooks.summary import parallel

    path = tmp_path / "s.txt"
    generator().write_jobs(str(path), 2000, seed=6)
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_RANGE", 1)
    expected = build(parallel.tally_file(str(path), Filters(), 1, [], accounting.LineCap(MAX_LINE)), {}, [], [])
    real_fork, forks = os.fork, []

    def fork_once():
        if forks:
            raise OSError(11, "Resource temporarily unavailable")
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork_once)
    problems = []
    many = parallel.tally_file(str(path), Filters(), 3, problems, accounting.LineCap(MAX_LINE))
    assert build(many, {}, [], []) == expected
    assert forks == [1] and problems == []


def test_a_foreign_header_stops_the_workers_too(tmp_path):
    from slurm_hooks.summary.parallel import tally_file

    path = tmp_path / "s.txt"
    path.write_text("JobID|State\n" + "1|COMPLETED\n" * 1000)
    with pytest.raises(AccountingError):
        tally_file(str(path), Filters(), 2, [], accounting.LineCap(MAX_LINE))


def test_two_sacct_files_put_together_are_read_the_same_by_one_process_or_several(tmp_path, monkeypatch):
    """`cat oct.txt nov.txt`: the second header is not a job, and a line that begins a reader's
    byte range is read as one pass reads it (only the file's first line is checked as a header)."""
    from slurm_hooks.summary import parallel

    first, second, path = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "ab.txt"
    generator().write_jobs(str(first), 800, seed=1)
    generator().write_jobs(str(second), 800, seed=2)
    apart = [parallel.tally_file(str(p), Filters(), 1, [], accounting.LineCap(MAX_LINE)) for p in (first, second)]
    cut = first.stat().st_size                                 # where the second header begins
    foreign = b"JobID|State|not our format\n"                  # a header-like line, not a header
    path.write_bytes(first.read_bytes() + second.read_bytes() + foreign + second.read_bytes().split(b"\n", 1)[1])
    one_pass = []
    with open(path, "rb") as handle:
        single = Tally()
        single.add_chunks(accounting.row_blocks(handle, accounting.LineCap(MAX_LINE), one_pass))
    assert single.jobs == apart[0].jobs + 2 * apart[1].jobs and len(one_pass) == 1 and "not a sacct row" in one_pass[0]
    assert single.unfinished == apart[0].unfinished + 2 * apart[1].unfinished   # a header is no job at all
    size, foreign_at = path.stat().st_size, path.read_bytes().index(foreign)
    monkeypatch.setattr(parallel, "byte_ranges", lambda p, n: [(0, cut), (cut, foreign_at), (foreign_at, size)])
    for workers in (1, 2, 3):
        problems = []
        many = parallel.tally_file(str(path), Filters(), workers, problems, accounting.LineCap(MAX_LINE))
        assert problems == one_pass and build(many, {}, [], []) == build(single, {}, [], [])


# -- sacct as the command runs it -----------------------------------------------------------------------
def test_line_feed_puts_lines_back_together_across_chunks():
    from slurm_hooks.summary.accounting import LineFeed

    got = []
    feed = LineFeed(got.extend, accounting.LineCap(MAX_LINE))
    text = "1\x1fé|x\n2\x1fb\n3\x1fc".encode()
    for i in range(len(text)):                       # one byte at a time: a character split too
        feed.feed(text[i:i + 1])
    feed.close()
    assert got == ["1\x1fé|x\n", "2\x1fb\n", "3\x1fc"]


def test_line_feed_cuts_rows_at_newlines_only_whatever_a_job_name_holds():
    """A job name is the user's: characters str.splitlines takes for line ends (\x1c-\x1e, \x85,
    \u2028, \r) stay inside its row; a name cannot start a row of its own."""
    from slurm_hooks.summary.accounting import LineFeed

    got = []
    feed = LineFeed(got.extend, accounting.LineCap(MAX_LINE))
    forged = "42\x1fCOMPLETED\x1f0:0"
    names = ["a\x1e" + forged, "b\x1c" + forged, "c\x1d" + forged, "d\x85" + forged, "e\u2028" + forged,
             "f\r" + forged, "g\x0b\x0c" + forged]
    feed.feed("".join(f"{i}\x1f{name}\n" for i, name in enumerate(names)).encode())
    feed.close()
    assert got == [f"{i}\x1f{name}\n" for i, name in enumerate(names)]


def fake_slurm(tmp_path, sacct_body):
    """A bin_dir with a stand-in sacct (only for the command plumbing; the lab test runs the real one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = bin_dir / "sacct"
    sacct.write_text("#!/bin/sh\n" + sacct_body)
    sacct.chmod(0o755)
    config = tmp_path / "c.toml"
    config.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n')
    return str(config)


def test_live_sacct_output_is_streamed_and_what_slurm_cannot_say_is_noted(tmp_path):
    data = tmp_path / "rows"
    data.write_text("".join(line.replace("|", "\x1f") for line in lab_lines()[1:]))
    config = fake_slurm(tmp_path, f'cat "{data}"\n')
    result = run("--config", config, "--since", "2026-11-01T00:00:00", "--until", "2026-12-01T00:00:00", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["jobs"] == 16 and report["source"] == "sacct"
    assert any("nodes drained now: not known" in note for note in report["notes"])
    assert any("drains per node: not counted" in note for note in report["notes"])


def test_a_failing_sacct_is_one_line_and_exit_1(tmp_path):
    config = fake_slurm(tmp_path, 'echo "sacct: error: Problem talking to the database: Connection refused" >&2\nexit 1\n')
    result = run("--config", config, "--json")
    assert result.exit_code == 1
    assert result.stderr.strip() == ("slurm-gpu: summary: sacct failed: "
                                     "sacct: error: Problem talking to the database: Connection refused")


def test_a_node_hardware_entry_beats_the_job_level_entry_as_the_epilog_decides():
    """EpilogSlurmctld writes the job-level entry without the node's evidence: FAILED there and
    GPU_LOST on gpu2 is a GPU_LOST job (records.classify.job_class), in either stored form."""
    from healthcheck.records import admin_comment
    from healthcheck.records.classify import job_class
    from slurm_hooks.summary.verdict import classify

    entries = [{"node": "*", "class": "FAILED", "exit": 1},
               {"node": "gpu2", "class": "GPU_XID", "gpu": 1, "xid": 48},
               {"node": "gpu3", "class": "GPU_LOST", "gpu": 3, "xid": 79}]
    comment = admin_comment.merge("JS1:abc", entries)
    for text in (comment, comment.lower().replace('"', "`")):
        verdict = classify("FAILED", text, ("gpu1", "gpu2", "gpu3"))
        assert verdict.cause == job_class(entries) == "GPU_LOST"
        assert verdict.hardware and verdict.culprits[0].node == "gpu3" and verdict.culprits[0].gpu == 3
    assert classify("FAILED", admin_comment.merge("", entries[:1]), ("gpu1",)).cause == "FAILED"


# -- GPU_OOM (issue 16): a class the summary counts without code of its own ------------------------------
GPU_OOM_ENTRIES = [{"node": "*", "class": "FAILED", "exit": 1, "nodes": "gpu1"},
                   {"node": "gpu1", "class": "GPU_OOM", "oom": "pytorch", "exit": 1}]


def test_a_node_gpu_oom_entry_beats_the_job_level_failed_but_not_host_oom():
    comment = admin_comment.merge("JS1:abc", GPU_OOM_ENTRIES)
    for text in (comment, comment.lower().replace('"', "`")):
        verdict = classify("FAILED", text, ("gpu1",))
        assert (verdict.cause, verdict.source, verdict.hardware, verdict.culprits) == \
            ("GPU_OOM", SOURCE_HOOKS, False, [])
    host = admin_comment.merge("", [{"node": "*", "class": "OUT_OF_MEMORY"}, GPU_OOM_ENTRIES[1]])
    assert classify("OUT_OF_MEMORY", host, ("gpu1",)).cause == "OUT_OF_MEMORY"
    lost = admin_comment.merge(comment, [{"node": "gpu2", "class": "GPU_LOST", "gpu": 3, "xid": 79}])
    assert classify("FAILED", lost, ("gpu1", "gpu2")).cause == "GPU_LOST"


def test_gpu_oom_jobs_are_counted_in_json_csv_and_html(tmp_path):
    failed = [line.split("|")[0] for line in lab_lines()[1:] if line.split("|")[COL["State"]] == "FAILED"]
    assert failed, "the capture has a FAILED job"
    path = tmp_path / "s.txt"
    path.write_text("".join(with_comments({failed[0]: admin_comment.merge("", GPU_OOM_ENTRIES)})))
    report = json.loads(run("--input", str(path), "--json").stdout)
    assert report["by_cause"]["GPU_OOM"]["jobs"] == 1
    rows = list(csv.DictReader(io.StringIO(run("--input", str(path), "--csv", "--jobs").stdout)))
    assert [r["cause"] for r in rows if r["job"] == failed[0]] == ["GPU_OOM"]
    out = tmp_path / "r.html"
    assert run("--input", str(path), "--html", str(out)).exit_code == 0
    assert "GPU_OOM" in out.read_text()


# -- hostile input (issue 24): long lines, impossible values, control characters ------------------
def _row(**fields):
    line = lab_lines()[2].rstrip("\n").split("|")
    for name, value in fields.items():
        line[COL[name]] = value
    return "|".join(line) + "\n"


def test_a_line_past_the_cap_is_skipped_counted_and_said(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[summary]\nmax_line_bytes = 4096\n")
    path = tmp_path / "s.txt"
    long_line = _row(JobIDRaw="99", JobID="99", JobName="x" * 300_000)
    path.write_text("".join(lab_lines()[:3]) + long_line + "".join(lab_lines()[3:]))
    result = run("--config", str(config), "--input", str(path), "--json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["jobs"] == 16                                          # every other row counted
    assert "1 line(s) longer than 4096 bytes ([summary] max_line_bytes) were skipped" in result.stderr
    assert any("longer than 4096 bytes" in note for note in report["notes"])
    # the same through the reader the parallel path uses (several processes), and from stdin
    from slurm_hooks.summary.accounting import LineCap
    from slurm_hooks.summary.parallel import tally_file

    cap = LineCap(4096)
    assert tally_file(str(path), Filters(), 2, [], cap).jobs == 16 and cap.skipped == 1
    with open(path, "rb") as handle:
        lines = list(LineCap(4096).lines(handle))
    assert len(lines) == len(lab_lines()) and all(len(line) < 4096 for line in lines)


def test_the_live_feed_skips_a_line_past_the_cap_across_chunks():
    from slurm_hooks.summary.accounting import LineCap, LineFeed

    got = []
    cap = LineCap(1024)
    feed = LineFeed(got.extend, cap)
    for chunk in (b"1\x1fa\n2\x1f", b"y" * 700, b"y" * 700, b"y" * 700 + b"\n3\x1fc\n", b"4\x1f" + b"z" * 3000 + b"\n5\n"):
        feed.feed(chunk)
    feed.close()
    assert got == ["1\x1fa\n", "3\x1fc\n", "5\n"] and cap.skipped == 2


@pytest.mark.parametrize("fields", [
    {"ElapsedRaw": "-3600"},
    {"ElapsedRaw": "9" * 12},                                            # 31,000 years
    {"AllocTRES": "billing=1,cpu=1,gres/gpu=99999999999,node=1"},
])
def test_impossible_values_are_rejected_and_counted(tmp_path, fields):
    path = tmp_path / "s.txt"
    path.write_text("".join(lab_lines()) + _row(JobIDRaw="99", JobID="99", **fields))
    result = run("--input", str(path), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    clean = json.loads(run("--input", LAB_SACCT, "--json").stdout)
    assert report["jobs"] == clean["jobs"] == 16
    assert report["gpu_hours"] == clean["gpu_hours"]
    assert "1 row(s) with impossible values were not counted" in result.stderr


def test_csv_escapes_control_characters(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(_row(JobName="a\x1b[2Jb\x00c\x07d"))
    for args in (["--csv", "--jobs"], ["--jobs"]):
        result = run("--input", str(path), *args)
        assert result.exit_code == 0
        assert not any(ch in result.stdout for ch in "\x1b\x00\x07"), args
        assert "a\\x1b[2Jb\\x00c\\x07d" in result.stdout


@pytest.mark.parametrize("cap", [16, 64, 4 << 20])
def test_the_block_reader_gives_the_line_readers_lines_and_skips(tmp_path, cap, monkeypatch):
    """LineCap.blocks (a saved file's reader) cuts, caps and counts exactly as LineCap.lines:
    at b"\\n" only (a job name may hold \\x1c or \\u2028), across block edges, within byte ranges."""
    from slurm_hooks.summary import accounting
    from slurm_hooks.summary.accounting import LineCap
    from slurm_hooks.summary.parallel import byte_ranges

    monkeypatch.setattr(accounting, "BLOCK_BYTES", 7)       # every line crosses a block edge
    text = ("a|b\n" + "x" * 40 + "\n\n" + "n\u2028m\x1cé|z\n" + "y" * 17 + "\n" + "tail|é").encode()
    path = tmp_path / "s.txt"
    path.write_bytes(text)
    for parts in (1, 2, 3):
        for start, end in byte_ranges(str(path), parts):
            with open(path, "rb") as handle:
                handle.seek(start)
                one = LineCap(cap)
                expected = list(one.lines(handle, end, start))
                handle.seek(start)
                other = LineCap(cap)
                got = [line for block in other.blocks(handle, end, start) for line in block]
            assert got == expected and other.skipped == one.skipped, (parts, start, end)
    with open(path, "rb") as handle:               # an end inside a line: that line is read to its end
        got = [line for block in LineCap(cap).blocks(handle, 6, 0) for line in block]
    with open(path, "rb") as handle:
        assert got == list(LineCap(cap).lines(handle, 6, 0))


def test_rows_read_a_block_at_a_time_are_the_rows_read_a_line_at_a_time(tmp_path):
    from slurm_hooks.summary.accounting import LineCap, row_blocks

    lines = [",".join(SACCT_FIELDS).replace(",", "|") + "\n"] + lab_lines()[:5] + ["garbage\n", "\n"] \
        + lab_lines()[5:] + ["1|2|3\n"] * 5
    path = tmp_path / "s.txt"
    path.write_text("".join(lines))
    problems_lines, problems_blocks = [], []
    expected = list(read_rows(lines, problems_lines))
    with open(path, "rb") as handle:
        got = [row for block in row_blocks(handle, LineCap(MAX_LINE), problems_blocks) for row in block]
    assert got == expected and problems_blocks == problems_lines
    assert problems_lines[-1] == "6 lines in all were not rows of the expected format"
