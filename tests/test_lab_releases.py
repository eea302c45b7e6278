"""The lab's Slurm releases without starting anything: the table, what `lab up --slurm` records,
the commands and hook wrappers each release gets, `lab env`, and the wheel's dependencies."""
from __future__ import annotations

import os
import subprocess

import pytest

from healthcheck.config import Config
from slurm_hooks.lab import LabError, cluster, releases, render, rootfs
from slurm_hooks.lab.install import BINARIES, command
from slurm_hooks.lab.paths import LabPaths


@pytest.fixture
def lab(tmp_path):
    return LabPaths(str(tmp_path / "lab"))


def record(lab: LabPaths, version: str) -> None:
    os.makedirs(lab.etc, exist_ok=True)
    with open(lab.release_file, "w", encoding="ascii") as handle:
        handle.write(version + "\n")


def test_the_table_has_the_three_releases_from_debian():
    table = releases.releases()
    assert {v: (r.debian, r.rootfs) for v, r in table.items()} == {
        "22.05": ("bookworm", False), "24.11": ("trixie", True), "26.05": ("sid", True)}
    assert releases.default_version() in table
    assert all(r.mirror.startswith("http") for r in table.values())


def test_an_unknown_release_is_one_line_naming_the_known_ones():
    with pytest.raises(LabError, match=r"no Slurm release '9\.99' in the lab \(known: 22\.05, 24\.11, 26\.05\)"):
        releases.get("9.99")


def test_the_recorded_release_decides_the_commands(lab):
    assert releases.recorded(lab) is None and releases.current(lab).version == releases.default_version()
    record(lab, "24.11")
    assert releases.current(lab).version == "24.11"
    assert command(lab, "scontrol") == os.path.join(lab.bin, "scontrol")
    record(lab, "22.05")
    assert command(lab, "scontrol") == "/usr/bin/scontrol"
    record(lab, "nonsense")
    assert releases.recorded(lab) is None


def test_a_rootfs_release_wrapper_runs_the_binary_inside_or_enters_first(lab):
    text = rootfs.wrapper_text(lab, releases.get("24.11"), "sacct")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[0] == "[ -f /usr/lib/slurm-gpu-lab/24.11 ] && exec /usr/bin/sacct \"$@\""
    assert lines[1].startswith("exec /usr/bin/unshare --mount --propagation private -- /bin/sh -c ")
    assert lines[1].endswith(f"{lab.rootfs('24.11')} /usr/bin/sacct \"$@\"")


def test_a_host_release_wrapper_runs_the_hosts_binary(lab, tmp_path):
    text = rootfs.wrapper_text(lab, releases.get("22.05"), "scontrol")
    assert text.splitlines()[-1] == 'exec /usr/bin/scontrol "$@"'
    script = tmp_path / "w"
    script.write_text(text.replace("/usr/bin/scontrol", "/bin/echo"))
    script.chmod(0o755)
    out = subprocess.run([str(script), "a b", "c"], capture_output=True, text=True, timeout=10)
    assert out.stdout == "a b c\n"


def test_every_lab_command_gets_a_wrapper(lab):
    os.makedirs(lab.root)
    written = rootfs.write_wrappers(lab, releases.get("26.05"))
    assert sorted(os.path.basename(path) for path in written) == sorted(BINARIES)
    assert "sacctmgr" in BINARIES and all(os.access(path, os.X_OK) for path in written)
    assert rootfs.write_wrappers(lab, releases.get("26.05")) == []       # unchanged: nothing rewritten


def test_rootfs_hooks_run_from_the_venv_inside_and_enter_when_run_from_the_host(lab):
    opts = render.RenderOptions.for_release(lab, releases.get("26.05"))
    assert (opts.bin_dir, opts.rootfs, opts.slurm_bin) == (f"{rootfs.VENV}/bin", lab.rootfs("26.05"), lab.bin)
    # The venv is not built here: the wrapper falls back to its python, inside the root filesystem.
    text = render.hook_wrapper(lab, "healthcheck", opts)
    assert f"[ -f /usr/lib/slurm-gpu-lab/26.05 ] || exec /usr/bin/unshare" in text
    assert text.rstrip().endswith(f"exec {rootfs.VENV}/bin/python -I -m healthcheck.healthcheck")
    host = render.hook_wrapper(lab, "healthcheck", render.RenderOptions.for_release(lab, releases.get("22.05")))
    assert "unshare" not in host


def test_the_hooks_config_names_the_labs_commands(lab, tmp_path):
    opts = render.RenderOptions.for_release(lab, releases.get("24.11"))
    path = tmp_path / "hooks.toml"
    path.write_text(render.hooks_config(lab, opts))
    assert Config.load(str(path)).section("slurm")["bin_dir"] == lab.bin


def test_lab_env_puts_the_labs_commands_first_and_names_the_release(lab):
    record(lab, "26.05")
    lines = cluster.env_lines(lab)
    assert f"export SLURM_GPU_LAB_RELEASE=26.05" in lines
    assert lines[-1] == f'export PATH={lab.bin}:"$PATH"'
    shown = subprocess.run(["/bin/sh", "-c", "\n".join(lines) + '\necho "$PATH"'], capture_output=True,
                           text=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
    assert shown.stdout.strip() == f"{lab.bin}:/usr/bin:/bin"


def test_the_wheels_requirements_for_a_newer_python_drop_the_tomli_backport(tmp_path):
    import zipfile

    wheel = tmp_path / "x-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("x-1.dist-info/METADATA", "Name: x\nRequires-Dist: click>=8.0\n"
                         'Requires-Dist: tomli>=1.2; python_version < "3.11"\n'
                         'Requires-Dist: pytest>=7; extra == "test"\nRequires-Dist: python-hostlist>=1.21\n')
    assert rootfs._requirements(str(wheel)) == ["click>=8.0", "python-hostlist>=1.21"]
    assert rootfs._dist("python-hostlist>=1.21") == "python_hostlist"


def test_the_source_digest_changes_with_a_packaged_file(tmp_path):
    for name in ("setup.cfg", "healthcheck/a.py", "slurm_hooks/b.py"):
        os.makedirs(os.path.dirname(str(tmp_path / name)), exist_ok=True)
        (tmp_path / name).write_text("x")
    before = rootfs.source_digest(str(tmp_path))
    (tmp_path / "slurm_hooks" / "__pycache__").mkdir()
    (tmp_path / "slurm_hooks" / "__pycache__" / "b.pyc").write_text("junk")
    assert rootfs.source_digest(str(tmp_path)) == before
    (tmp_path / "slurm_hooks" / "b.py").write_text("y")
    assert rootfs.source_digest(str(tmp_path)) != before


def test_a_reinstall_switches_the_stable_link_in_one_rename_keeping_the_previous_venv(tmp_path):
    root = str(tmp_path)
    local = tmp_path / "usr" / "local"
    local.mkdir(parents=True)
    (local / "slurm-gpu-hooks").mkdir()          # a venv installed in place by an earlier lab
    for digest in ("aaa", "bbb", "ccc"):
        (local / f"slurm-gpu-hooks-{digest}").mkdir()
        rootfs._switch_link(root, rootfs.VENVS + digest)
        assert os.readlink(str(local / "slurm-gpu-hooks")) == f"slurm-gpu-hooks-{digest}"   # relative
    assert sorted(p.name for p in local.iterdir()) == ["slurm-gpu-hooks", "slurm-gpu-hooks-bbb",
                                                         "slurm-gpu-hooks-ccc"]


def test_the_wheels_source_copy_holds_every_file_setup_cfg_packages():
    """The rootfs install builds its wheel from a copy of PACKAGED: a data file setup.cfg names
    outside it (the Prometheus rules, the man page) made pip wheel fail and no rootfs lab start."""
    import configparser

    from slurm_hooks.lab.rootfs import PACKAGED

    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parsed = configparser.ConfigParser()
    parsed.read(os.path.join(top, "setup.cfg"))
    named = [path.strip() for value in parsed["options.data_files"].values()
             for path in value.splitlines() if path.strip()]
    assert named
    for path in named:
        assert path.split("/")[0] in PACKAGED, f"setup.cfg's data file {path} is not in the wheel's source copy"
