from healthcheck.drain_reason import DrainReason, format_reason, is_ours, parse_reason
from healthcheck.slurm.cli_backend import parse_scontrol_record
from healthcheck.config.settings import DrainSettings

from .conftest import builtin_settings

# The shipped [drain] reason_prefix and max_reason_len (defaults.toml).
_DRAIN = builtin_settings(DrainSettings)
PREFIX, WIDTH = _DRAIN.reason_prefix, _DRAIN.max_reason_len


def test_round_trip_keeps_check_subject_keys_and_xid():
    text = format_reason(DrainReason("kernel.xid", "gpu5", {"xid": "79"}, "Xid 79 (fell off the bus) on GPU 5"),
                         PREFIX, WIDTH)
    assert text == "gpu-hooks: v1 kernel.xid gpu5 xid:79; Xid 79 (fell off the bus) on GPU 5"
    back = parse_reason(text, PREFIX)
    assert (back.check, back.subject, back.keys, back.xid) == ("kernel.xid", "gpu5", {"xid": "79"}, 79)
    assert back.cause == "kernel.xid gpu5 xid:79"


def test_long_summary_is_cut_to_max_len_and_still_parses():
    text = format_reason(DrainReason("ib.port", "mlx5_0:1", {"state": "DOWN"}, "word " * 80), PREFIX, max_len=120)
    assert len(text) <= 120 and text.endswith("...")
    assert parse_reason(text, PREFIX).subject == "mlx5_0:1"


def test_tokens_cannot_carry_spaces_or_equals_that_scontrol_would_split():
    text = format_reason(DrainReason("gpu.ecc.uncorrectable", "gpu 3=x", {"dbe": "2 x=1"}, "a\nb\tc"), PREFIX, WIDTH)
    assert "=" not in text.split(";")[0] and "\n" not in text and "\t" not in text
    record = parse_scontrol_record(f"NodeName=gpu2 State=IDLE+DRAIN Reason={text} [root@2026-11-30T05:20:00] Comment=(null)")
    assert record["Reason"].startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu_3_x dbe:2_x_1")


def test_foreign_and_unparsable_reasons():
    assert parse_reason("admin: replacing PSU", PREFIX) is None and not is_ours("admin: gpu-hooks:", PREFIX)
    assert parse_reason("", "gpu-hooks:") is None
    old = parse_reason("gpu-hooks: something an older version wrote", PREFIX)
    assert old is not None and old.check is None


def test_custom_prefix():
    text = format_reason(DrainReason("gpu.lost", "gpu1", {}, "lost"), prefix="HC:", max_len=WIDTH)
    assert text.startswith("HC: v1 gpu.lost gpu1") and parse_reason(text, "HC:").check == "gpu.lost"
    assert parse_reason(text, PREFIX) is None


def test_slurms_reboot_issued_suffix_is_read_as_slurms_not_ours():
    """slurmctld appends " : reboot issued" to the reason of a node it reboots and keeps it after
    the boot (measured on 22.05, 24.11 and 26.05): the cause and summary read back are ours."""
    written = format_reason(DrainReason("gpu.lost", "gpu5", {"reboots": "1"}, "GPU 5 has fallen off the bus"),
                            PREFIX, WIDTH)
    shown = written + " : reboot issued"
    parsed = parse_reason(shown, PREFIX)
    assert parsed == parse_reason(written, PREFIX)
    assert parsed.summary == "GPU 5 has fallen off the bus" and parsed.cause == "gpu.lost gpu5"
    assert parse_reason(written + " : reboot issued : reboot issued", PREFIX) == parsed
    # only Slurm's exact suffix at the end is removed, nothing of a summary that mentions it
    assert parse_reason(written + " : reboot issued later", PREFIX).summary.endswith(": reboot issued later")
