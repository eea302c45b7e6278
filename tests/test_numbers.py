"""Numbers that validate: no nan or inf, timeouts bounded below the hooks' own deadline, and
counter readings far beyond any real counter (10**400) never crash the history."""
from __future__ import annotations

import glob
import os

import pytest

from healthcheck.config import Config, ConfigError
from healthcheck.counters.growth_rate import growth
from healthcheck.counters.history import CounterHistory
from healthcheck.sim.profile import ProfileError, load_profile

from .conftest import run_cli


@pytest.mark.parametrize("text,key", [
    ("[gpu]\nprobe_timeout_s = inf\n", "gpu.probe_timeout_s"),
    ("[gpu]\nprobe_timeout_s = nan\n", "gpu.probe_timeout_s"),
    ("[gpu]\nprobe_timeout_s = 1e9\n", "gpu.probe_timeout_s"),
    ("[xid]\nsource_timeout_s = -inf\n", "xid.source_timeout_s"),
    ("[xid]\nsource_timeout_s = 86400\n", "xid.source_timeout_s"),
    ("[slurm]\ntimeout_s = 3600\n", "slurm.timeout_s"),
    ("[dcgm]\ntimeout_s = inf\n", "dcgm.timeout_s"),
    ("[prolog]\ndeadline_s = inf\n", "prolog.deadline_s"),
    ("[prolog]\ndeadline_s = 3600\n", "prolog.deadline_s"),
    ("[records]\nepilog_deadline_s = nan\n", "records.epilog_deadline_s"),
    ("[records]\nepilog_deadline_s = 0\n", "records.epilog_deadline_s"),
    ("[xid]\nflood_window_s = nan\n", "xid.flood_window_s"),
    ('[xid.escalate]\n"13" = { count = 5, window_s = nan, action = "reset_gpu" }\n', "xid.escalate.13.window_s"),
    ('[xid.escalate]\n"13" = { count = 5, window_s = 3600, burst_s = inf, action = "reset_gpu" }\n',
     "xid.escalate.13.burst_s"),
    ("[thresholds]\necc_correctable_max_per_window = nan\n", "thresholds.ecc_correctable_max_per_window"),
    ("[thresholds]\ntemperature_margin_c = inf\n", "thresholds.temperature_margin_c"),
])
def test_config_check_rejects_numbers_no_hook_can_use(tmp_path, text, key):
    path = tmp_path / "c.toml"
    path.write_text(text)
    result = run_cli(["config", "check", str(path)])
    assert result.exit_code == 2, result.stdout
    assert any(line.startswith(f"{path}: {key}") for line in result.stderr.splitlines()), result.stderr
    assert "Traceback" not in result.stderr


def test_check_with_an_infinite_probe_timeout_gives_one_line_not_a_crash(sim_config, tmp_path):
    with open(sim_config, encoding="utf-8") as handle:
        text = handle.read()
    assert "probe_timeout_s = 20.0" in text
    text = text.replace("probe_timeout_s = 20.0", "probe_timeout_s = inf")
    path = tmp_path / "inf.toml"
    path.write_text(text)
    result = run_cli(["check", "--config", str(path), "--node", "gpu1"])
    assert result.exit_code != 0 and "Traceback" not in result.stderr
    assert "probe_timeout_s" in result.stderr and "not a finite number" in result.stderr


def test_the_shipped_configs_stay_within_the_bounds():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    Config.load(os.path.join(root, "etc", "slurm-gpu-hooks.toml"))
    Config.from_document({}, None)


def test_huge_readings_are_not_history_and_do_not_crash_it(tmp_path):
    history = CounterHistory(str(tmp_path), "gpu1")
    history.record({"ib.mlx5_0:1.symbol_error": (10 ** 400, 3600.0), "gpu.0.ecc": (5, 3600.0)}, 1000.0)
    series = history.load()
    assert "ib.mlx5_0:1.symbol_error" not in series and series["gpu.0.ecc"] == [[1000.0, 5.0]]
    assert growth(series["gpu.0.ecc"], 10 ** 400, 2000.0, 3600.0) is None
    assert growth(series["gpu.0.ecc"], float("nan"), 2000.0, 3600.0) is None
    assert growth(series["gpu.0.ecc"], 7, 2000.0, 3600.0) == (2.0, 1000.0)


def test_a_profile_with_a_counter_beyond_64_bits_is_refused(tmp_path):
    path = tmp_path / "huge.toml"
    path.write_text("[[gpu]]\necc = { volatile_uncorrected = 1" + "0" * 400 + " }\n"
                    '[[ib]]\nhca = "mlx5_0"\nport = 1\ncounters = { symbol_error = 18446744073709551616 }\n')
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    assert "above the maximum" in str(caught.value) and len(str(caught.value)) < 2000


def test_check_survives_a_sysfs_counter_of_400_digits(sim_config, tmp_path):
    assert run_cli(["check", "--config", sim_config, "--node", "gpu1"]).exit_code == 0
    counters = glob.glob(str(tmp_path / "state" / "sim" / "gpu1" / "sys" / "class" / "infiniband" / "*" /
                             "ports" / "1" / "counters" / "symbol_error"))
    assert counters, "the simulator rendered IB counters"
    for path in counters:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("1" + "0" * 400 + "\n")
    for _ in range(2):              # the second run compares with the first run's history
        result = run_cli(["check", "--config", sim_config, "--node", "gpu1", "--json"])
        assert "Traceback" not in result.stderr and result.exit_code in (0, 1), result.stderr
        assert '"check.error"' not in result.stdout
