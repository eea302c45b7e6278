"""``slurm-gpu config check`` and the config loader: every problem is one clear line, exit 2."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck.config import Config, ConfigError, node_name

from .conftest import ETC, run_cli

EXAMPLE = os.path.join(ETC, "slurm-gpu-hooks.toml")


def write(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


def check_fails(tmp_path, text):
    path = write(tmp_path, text)
    result = run_cli(["config", "check", path])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line]
    assert lines and all(line.startswith(f"{path}: ") for line in lines), lines
    return lines


def test_example_config_passes_and_prints_effective_config():
    result = run_cli(["config", "check", EXAMPLE])
    assert result.exit_code == 0, result.stderr
    assert 'backend = "nvml"' in result.stdout
    assert "[[nodes]]" in result.stdout


def test_unknown_key_is_one_line(tmp_path):
    lines = check_fails(tmp_path, '[gpu]\nbackend = "nvml"\nbakend = "sim"\n')
    assert len(lines) == 1
    assert "gpu.bakend: unknown key; allowed here: backend" in lines[0]


def test_wrong_type_names_the_allowed_type(tmp_path):
    lines = check_fails(tmp_path, '[[nodes]]\nmatch = "gpu1"\ngpus = "eight"\n')
    assert lines == [f"{tmp_path / 'bad.toml'}: nodes[0].gpus: has the wrong type (str 'eight'); an integer >= 0, <= 1024"]


def test_negative_threshold_is_an_error(tmp_path):
    lines = check_fails(tmp_path, '[gpu]\nprobe_timeout_s = -1\n')
    assert "gpu.probe_timeout_s: -1 is below the minimum" in lines[0]


def test_malformed_hostlist_is_an_error(tmp_path):
    lines = check_fails(tmp_path, '[[nodes]]\nmatch = "gpu[1-3"\ngpus = 8\n')
    assert "nodes[0].match: malformed hostlist 'gpu[1-3'" in lines[0]


def test_every_problem_is_reported_at_once(tmp_path):
    lines = check_fails(tmp_path, '[gpu]\nbackend = "cuda"\n[paths]\nstate = "/x"\n[[nodes]]\nmatch = "gpu[3-1]"\n')
    assert len(lines) == 3


def test_toml_syntax_error_is_one_line(tmp_path):
    lines = check_fails(tmp_path, "[gpu\nbackend=")
    assert len(lines) == 1 and "(syntax)" in lines[0]


def test_missing_explicit_file_is_an_error(tmp_path):
    result = run_cli(["config", "check", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_env_variable_selects_the_file(tmp_path, isolated_env):
    path = write(tmp_path, '[gpu]\nbackend = "sim"\n')
    isolated_env.setenv("SLURM_GPU_HOOKS_CONFIG", path)
    assert Config.load().backend == "sim"
    assert Config.load(EXAMPLE).backend == "nvml"      # --config wins over the environment


def test_missing_default_file_means_builtin_defaults(isolated_env):
    config = Config.load(env={})
    assert config.backend == "nvml" and config.state_dir == "/var/lib/slurm-gpu-hooks"


def test_first_matching_node_group_wins():
    config = Config.from_document({"nodes": [
        {"match": "gpu[1-3,7]", "gpus": 8}, {"match": "gpu*", "gpus": 4}]}, "/etc/x.toml")
    assert config.expected_hardware("gpu7")["gpus"] == 8
    assert config.expected_hardware("gpu4")["gpus"] == 4
    assert config.expected_hardware("cpu1") == {}


def test_sim_paths_are_relative_to_the_config_file():
    config = Config.from_document({"sim": {"profile": "sim/a.toml", "nodes": {"n2": "/abs/b.toml"}}},
                                  "/etc/slurm-gpu-hooks/config.toml")
    assert config.sim_profile_path("n1") == "/etc/slurm-gpu-hooks/sim/a.toml"
    assert config.sim_profile_path("n2") == "/abs/b.toml"


def test_node_name_order():
    assert node_name("cli", {"SLURMD_NODENAME": "env"}) == "cli"
    assert node_name(None, {"SLURMD_NODENAME": "env"}) == "env"
    assert node_name(None, {}) and "." not in node_name(None, {})


def test_config_error_lines_have_the_contract_format():
    with pytest.raises(ConfigError) as info:
        Config.from_document({"gpu": {"backend": "loud"}}, "f.toml")
    assert info.value.lines() == ["f.toml: gpu.backend: 'loud' is not allowed; one of 'nvml', 'sim'"]


def test_missing_simulator_profile_is_reported(tmp_path):
    lines = check_fails(tmp_path, '[gpu]\nbackend = "sim"\n[sim]\nnodes = { gpu1 = "sim/nope.toml" }\n')
    assert len(lines) == 1
    assert "sim.nodes.gpu1:" in lines[0] and "does not exist" in lines[0]


@pytest.mark.parametrize("text, key", [
    ("[records]\nverify_delay_s = 1e308\n", "records.verify_delay_s"),
    ("[summary]\nsacct_timeout_s = 1e308\n", "summary.sacct_timeout_s"),
    ("[health]\nconfirm_runs = 10000000000\n", "health.confirm_runs"),
    ("[records]\nverify_jitter_s = 1e300\n", "records.verify_jitter_s"),
    ("[thresholds]\nib_symbol_error_max_per_window = 1e300\n", "thresholds.ib_symbol_error_max_per_window"),
])
def test_values_that_would_break_the_tool_are_refused(tmp_path, text, key):
    """Issue 24: these passed config check and then broke every epilog (OverflowError in a sleep)
    or the summary (a traceback from sacct's deadline)."""
    lines = check_fails(tmp_path, text)
    assert len(lines) == 1 and f": {key}: " in lines[0] and "above the maximum" in lines[0], lines


def _at_maximum(schema, skip=("nodes",)):
    """Every numeric key of the named tables at its maximum (a key with its own check just below)."""
    from healthcheck.config import builtin_defaults
    from healthcheck.schema import Field

    doc = {}
    for table, spec in schema.items():
        if table in skip or not isinstance(spec, dict):
            continue
        for key, field in spec.items():
            if isinstance(field, Field) and field.kind in (int, float):
                value = field.kind(field.maximum)
                doc.setdefault(table, {})[key] = value - 1 if field.check is not None else value
    threshold = schema["thresholds"].values
    doc["thresholds"] = {key: threshold.maximum for key in builtin_defaults()["thresholds"]}
    return doc


def test_every_number_at_its_maximum_is_accepted_and_breaks_nothing(tmp_path, isolated_env):
    from healthcheck.safeio import tomlio
    from healthcheck.config import CONFIG_SCHEMA

    from .conftest import SIM_PROFILES

    doc = _at_maximum(CONFIG_SCHEMA)
    doc.setdefault("records", {})["delivery"] = "inline"
    path = tmp_path / "max.toml"
    path.write_text(tomlio.dumps(doc))
    assert run_cli(["config", "check", str(path)]).exit_code == 0
    doc["gpu"]["probe_timeout_s"] = 2.0         # the maximum (30 s) is allowed; a healthy node answers at once
    path.write_text(tomlio.dumps(doc))
    result = run_cli(["check", "--config", str(path), "--node", "gpu1", "--sim",
                      os.path.join(SIM_PROFILES, "h100-healthy.toml")])
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output + result.stderr and "Overflow" not in result.stderr


def test_an_older_key_maps_onto_its_new_key_with_one_line(tmp_path, monkeypatch):
    from healthcheck.config import keys

    monkeypatch.setitem(keys.DEPRECATED_KEYS, "watch.poll_s", ("watch.max_cpu", "set [watch] max_cpu"))
    path = write(tmp_path, "[watch]\npoll_s = 0.5\n")
    cfg = Config.load(path)
    assert cfg.section("watch")["max_cpu"] == 0.5
    assert cfg.deprecations() == [f"{path}: watch.poll_s: deprecated; set [watch] max_cpu"]
    result = run_cli(["config", "check", path])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == cfg.deprecations()
    # The new key, when the file sets it too, wins.
    both = Config.load(write(tmp_path, "[watch]\npoll_s = 0.5\nmax_cpu = 0.2\n"))
    assert both.section("watch")["max_cpu"] == 0.2


@pytest.mark.parametrize("line", ["serve_hooks = true", 'hook_socket = "/run/slurm-gpu-hooks/hooks.sock"'])
def test_a_retired_hook_server_key_loads_with_one_deprecation_line(tmp_path, line):
    """``[watch] serve_hooks``/``hook_socket`` (the hook server, retired): a site's config still
    loads and checks clean, with one line saying the key does nothing."""
    key = line.split(" ", 1)[0]
    path = write(tmp_path, f"[watch]\n{line}\n")
    cfg = Config.load(path)
    (line_said,) = cfg.deprecations()
    assert line_said.startswith(f"{path}: watch.{key}: deprecated; no effect"), line_said
    result = run_cli(["config", "check", path])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == cfg.deprecations()
    json_result = run_cli(["config", "check", "--json", path])
    assert json_result.exit_code == 0, json_result.output
    assert json.loads(json_result.stdout)["deprecated"] == cfg.deprecations()


def test_every_older_key_is_in_the_docs_table():
    from healthcheck.config.keys import CONFIG_SCHEMA, DEPRECATED_KEYS

    text = open(os.path.join(os.path.dirname(ETC), "docs", "configuration.md"), encoding="utf-8").read()
    table = text.split("## Older keys", 1)[1]
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    assert rows == set(DEPRECATED_KEYS)
    for old, (new, _) in DEPRECATED_KEYS.items():
        section, _, key = old.partition(".")
        assert key in CONFIG_SCHEMA[section], old          # still accepted
        if new:
            new_section, _, new_key = new.partition(".")
            assert new_key in CONFIG_SCHEMA[new_section], new


def test_nvml_events_is_an_accepted_no_op_with_one_line(tmp_path):
    """[watch] nvml_events: the watcher no longer opens NVML; a site's config still loads."""
    path = write(tmp_path, "[watch]\nnvml_events = true\n")
    cfg = Config.load(path)
    [line] = cfg.deprecations()
    assert line.startswith(f"{path}: watch.nvml_events: deprecated; nothing:")
    result = run_cli(["config", "check", path])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [line]


def test_inspect_after_reboots_is_now_the_one_reboot_limit(tmp_path):
    from healthcheck.health.policy import HealthPolicy
    from healthcheck.config.settings import RemediatePolicy

    path = write(tmp_path, "[health]\ninspect_after_reboots = 3\n")
    cfg = Config.load(path)
    assert cfg.deprecations() == [f"{path}: health.inspect_after_reboots: deprecated; "
                                  "set [remediate] max_reboots (the one reboot limit)"]
    assert HealthPolicy.from_config(cfg).inspect_after("79") == 3        # the Xid repeat
    assert RemediatePolicy.from_config(cfg).reboots_allowed("79") == 3   # the remediation's inspection
    both = Config.load(write(tmp_path, "[health]\ninspect_after_reboots = 3\n[remediate]\nmax_reboots = 5\n"))
    assert HealthPolicy.from_config(both).inspect_after("79") == 5


def test_inspect_after_reboots_xid_is_now_the_one_reboot_limit_per_xid(tmp_path):
    from healthcheck.health.policy import HealthPolicy
    from healthcheck.config.settings import RemediatePolicy

    path = write(tmp_path, '[health]\ninspect_after_reboots_xid = { "79" = 1 }\n')
    cfg = Config.load(path)
    assert cfg.deprecations() == [f"{path}: health.inspect_after_reboots_xid: deprecated; "
                                  "set [remediate] max_reboots_xid (the one reboot limit, per Xid)"]
    health, remediation = HealthPolicy.from_config(cfg), RemediatePolicy.from_config(cfg)
    assert (health.inspect_after("79"), health.inspect_after("48")) == (1, 2)
    assert (remediation.reboots_allowed("79"), remediation.reboots_allowed("48"), remediation.reboots_allowed()) == (1, 2, 2)
