"""scripts/build-packages: the .deb (Debian 12 and 13) and the .rpm (EL9), built for real into
a temporary directory and read back with the distributions' own tools (dpkg-deb, lintian,
systemd-analyze, rpm -qp), and the .deb installed, upgraded, removed and purged by dpkg. Nothing
is installed into this machine's root filesystem: dpkg runs with --root on a temporary
directory, either chrootless (DPKG_ROOT set: the maintainer scripts make no venv there) or as a
chroot whose /usr and /etc are overlays of this machine's, inside a private mount namespace, so
that postinst, prerm and postrm run as on a node. The tools come from scripts/bootstrap.sh; a
missing one fails the test, it is not skipped.

Marked ``packages`` (two package builds and three venvs, about 40 s in all): ``pytest -m packages``."""
from __future__ import annotations

import configparser
import glob
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from typing import Dict, List, Set

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from healthcheck.config import DEFAULT_CONFIG_PATH

from .conftest import ROOT

pytestmark = pytest.mark.packages

BUILD = os.path.join(ROOT, "scripts", "build-packages")
OPT = "/opt/slurm-gpu-hooks"
WHEELS = "/usr/lib/slurm-gpu-hooks/wheels"
HELPER = "/usr/lib/slurm-gpu-hooks/venv-setup"
UNIT = "/usr/lib/systemd/system/slurm-gpu-watch.service"
ENABLES = re.compile(r"\b(systemctl|deb-systemd-helper)\b[^\n]*\benable\b")
DEB_PYTHONS = ("3.11", "3.13")      # Debian 12, Debian 13
RPM_PYTHONS = ("3.9",)              # EL9


def _setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(os.path.join(ROOT, "setup.cfg"))
    return parser


VERSION = _setup_cfg()["metadata"]["version"]
COMMANDS = sorted(line.split("=")[0].strip()
                  for line in _setup_cfg()["options.entry_points"]["console_scripts"].strip().splitlines())
DEB_NAME = f"slurm-gpu-hooks_{VERSION}-1_amd64.deb"
VENV = f"{VERSION}-1"                # the venv's name: the package's version
RPM_NAME = f"slurm-gpu-hooks-{VERSION}-1.el9.x86_64.rpm"


def need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: scripts/bootstrap.sh installs it (apt-get install lintian rpm "
                        f"dpkg-dev systemd)", pytrace=False)


def run(argv: List[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("text", True)
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(argv, capture_output=True, timeout=kw.pop("timeout", 300), **kw)


def build(out, *extra: str) -> subprocess.CompletedProcess:
    need("dpkg-deb", "rpmbuild")
    env = dict(os.environ, PYTHON=sys.executable)
    done = run([BUILD, "--out", str(out), *extra], env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Revision 1 and a rebuilt revision 2 of both packages."""
    first, second = tmp_path_factory.mktemp("rev1"), tmp_path_factory.mktemp("rev2")
    done = build(first)
    assert done.stdout.split() == [str(first / DEB_NAME), str(first / RPM_NAME)]
    build(second, "--revision", "2")
    return {"deb": str(first / DEB_NAME), "rpm": str(first / RPM_NAME),
            "deb2": str(second / f"slurm-gpu-hooks_{VERSION}-2_amd64.deb")}


def deb_entries(deb: str) -> Dict[str, tarfile.TarInfo]:
    listing = run(["dpkg-deb", "--fsys-tarfile", deb], text=False)
    assert listing.returncode == 0
    archive = tarfile.open(fileobj=io.BytesIO(listing.stdout))
    return {"/" + member.name.lstrip("./").rstrip("/"): member for member in archive.getmembers()}


def control_members(deb: str) -> Dict[str, tarfile.TarInfo]:
    listing = run(["dpkg-deb", "--ctrl-tarfile", deb], text=False)
    archive = tarfile.open(fileobj=io.BytesIO(listing.stdout))
    return {member.name.lstrip("./"): member for member in archive.getmembers() if member.isfile()}


def deb_field(deb: str, field: str) -> str:
    done = run(["dpkg-deb", "-f", deb, field])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# -- the .deb -------------------------------------------------------------------------------------

def test_the_deb_holds_the_install_root_owned_with_explicit_modes(built):
    entries = deb_entries(built["deb"])
    assert all(m.uname == "root" and m.gname == "root" and m.uid == 0 and m.gid == 0 for m in entries.values())
    expected_modes = {DEFAULT_CONFIG_PATH: 0o644, HELPER: 0o755, UNIT: 0o644,
                      "/usr/lib/tmpfiles.d/slurm-gpu-hooks.conf": 0o644,
                      "/usr/share/man/man1/slurm-gpu.1.gz": 0o644,
                      "/usr/share/doc/slurm-gpu-hooks/copyright": 0o644,
                      "/usr/share/doc/slurm-gpu-hooks/changelog.Debian.gz": 0o644}
    for path, mode in expected_modes.items():
        assert path in entries, path
        assert entries[path].isfile() and entries[path].mode == mode, (path, oct(entries[path].mode))
    for member in entries.values():
        if member.isdir():
            assert member.mode == 0o755, member.name
    # Every console script of setup.cfg on PATH, through the stable path slurm.conf names.
    links = {path: m.linkname for path, m in entries.items() if path.startswith("/usr/bin/")}
    assert links == {f"/usr/bin/{c}": f"{OPT}/current/bin/{c}" for c in COMMANDS}
    # dpkg owns nothing under /opt: the venv is postinst's (dpkg would replace `current` before
    # the new venv exists).
    assert not [path for path in entries if path.startswith("/opt")]
    config = control_members(built["deb"])
    assert set(config) == {"control", "conffiles", "md5sums", "postinst", "prerm", "postrm"}
    for script in ("postinst", "prerm", "postrm"):
        assert config[script].mode == 0o755 and config[script].uname == "root", script


def test_the_deb_installs_the_repository_files_where_the_code_reads_them(built, tmp_path):
    done = run(["dpkg-deb", "-x", built["deb"], str(tmp_path)])
    assert done.returncode == 0, done.stderr
    # The conffile is the config the hooks read by default (healthcheck.config), not a new path.
    assert (tmp_path / DEFAULT_CONFIG_PATH.lstrip("/")).read_bytes() == open(
        os.path.join(ROOT, "etc", "slurm-gpu-hooks.toml"), "rb").read()
    assert (tmp_path / UNIT.lstrip("/")).read_bytes() == open(
        os.path.join(ROOT, "etc", "systemd", "slurm-gpu-watch.service"), "rb").read()
    assert (tmp_path / "usr/lib/tmpfiles.d/slurm-gpu-hooks.conf").read_bytes() == open(
        os.path.join(ROOT, "etc", "tmpfiles.d", "slurm-gpu-hooks.conf"), "rb").read()
    with gzip.open(tmp_path / "usr/share/man/man1/slurm-gpu.1.gz") as page:
        assert page.read() == open(os.path.join(ROOT, "man", "slurm-gpu.1"), "rb").read()
    # The wheel in the package is this checkout's version.
    # ... and the only one: venv-setup installs "slurm-gpu-hooks" from there, whatever its version.
    assert [p.name for p in (tmp_path / WHEELS.lstrip("/")).glob("slurm_gpu_hooks-*")] == [
        f"slurm_gpu_hooks-{VERSION}-py3-none-any.whl"]


def test_the_deb_declares_its_conffile_dependencies_and_scripts(built):
    assert deb_field(built["deb"], "Package") == "slurm-gpu-hooks"
    assert deb_field(built["deb"], "Version") == f"{VERSION}-1"
    assert deb_field(built["deb"], "Architecture") == "amd64"      # markupsafe's wheels are x86_64
    depends = [d.strip() for d in deb_field(built["deb"], "Depends").split(",")]
    assert "python3-venv" in depends                 # Debian's python3 has no ensurepip without it
    assert "python3 (>= 3.11)" in depends and "python3 (<< 3.14)" in depends
    assert "prometheus-node-exporter" in deb_field(built["deb"], "Recommends")
    info = run(["dpkg-deb", "-I", built["deb"], "conffiles"])
    assert info.stdout.split() == [DEFAULT_CONFIG_PATH]
    postinst = run(["dpkg-deb", "-I", built["deb"], "postinst"]).stdout
    assert f"{HELPER} install \"$VERSION\" {WHEELS} {OPT}" in postinst
    assert f"VERSION={VENV}\n" in postinst
    assert not ENABLES.search(postinst)             # the watcher is installed, never enabled
    prerm = run(["dpkg-deb", "-I", built["deb"], "prerm"]).stdout
    assert f"{HELPER} remove {OPT}" in prerm and "  remove)" in prerm


def test_lintian_reports_no_error_and_no_warning_without_an_override(built):
    need("lintian")
    done = run(["lintian", "--no-cfg", "--fail-on", "error,warning", built["deb"]], timeout=300)
    tags = [line for line in done.stdout.splitlines() if re.match(r"^[EW]: ", line)]
    assert not tags, done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    # Every override says why (a comment above it).
    with open(os.path.join(ROOT, "packaging", "debian", "lintian-overrides"), encoding="utf-8") as handle:
        previous = ""
        for line in handle:
            if line.startswith("slurm-gpu-hooks:"):
                assert previous.startswith(("#", "slurm-gpu-hooks:")), line
            previous = line if line.strip() else ""


def wheel_requirements(wheel: str, python: str) -> List[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode("utf-8"))
    env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    return [r for r in map(Requirement, metadata.get_all("Requires-Dist") or [])
            if r.marker is None or r.marker.evaluate(env)]


def assert_complete(wheels: List[str], python: str) -> None:
    """Every requirement, from the project's wheel down, has a wheel of an allowed version that
    this Python can install (py3, or this Python's own cpXY tag)."""
    tag = "cp" + python.replace(".", "")
    usable = {}
    for wheel in wheels:
        name, version, _, tags = parse_wheel_filename(os.path.basename(wheel))
        if any(t.interpreter in ("py3", tag) for t in tags):
            usable[canonicalize_name(name)] = (version, wheel)
    todo, seen = [Requirement(f"slurm-gpu-hooks=={VERSION}")], set()    # type: List[Requirement], Set[str]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        assert name in usable, f"Python {python}: no wheel for {requirement}"
        version, wheel = usable[name]
        assert requirement.specifier.contains(version, prereleases=True), (python, requirement, version)
        if name not in seen:
            seen.add(name)
            todo.extend(wheel_requirements(wheel, python))


def test_each_package_ships_every_wheel_its_distributions_python_needs(built, tmp_path):
    deb, rpm = tmp_path / "deb", tmp_path / "rpm"
    assert run(["dpkg-deb", "-x", built["deb"], str(deb)]).returncode == 0
    extract_rpm(built["rpm"], rpm)
    deb_wheels = glob.glob(str(deb / WHEELS.lstrip("/") / "*.whl"))
    rpm_wheels = glob.glob(str(rpm / WHEELS.lstrip("/") / "*.whl"))
    for python in DEB_PYTHONS:
        assert_complete(deb_wheels, python)
    for python in RPM_PYTHONS:
        assert_complete(rpm_wheels, python)
    # tomli only where the Python lacks tomllib (3.9, python_requires in setup.cfg)
    assert any("/tomli-" in w for w in rpm_wheels) and not any("/tomli-" in w for w in deb_wheels)


# -- what postinst does: venv-setup on a temporary root ------------------------------------------------

def extract_rpm(rpm: str, dest) -> None:
    need("rpm2archive")
    os.makedirs(dest, exist_ok=True)
    archive = run(["rpm2archive", "-"], stdin=open(rpm, "rb"), text=False)
    assert archive.returncode == 0, archive.stderr
    with tarfile.open(fileobj=io.BytesIO(archive.stdout), mode="r:gz") as tar:
        if hasattr(tarfile, "tar_filter"):      # the links to /opt are absolute: not the "data" filter
            tar.extractall(str(dest), filter="tar")
        else:
            tar.extractall(str(dest))


def venv_setup(*argv: str) -> subprocess.CompletedProcess:
    return run([os.path.join(ROOT, "packaging", "venv-setup"), *argv], timeout=600,
               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"})


def mark(directory) -> None:
    os.makedirs(directory / "bin")
    (directory / ".slurm-gpu-hooks-package").write_text("")


@pytest.fixture(scope="module")
def deb_root(built, tmp_path_factory):
    """The .deb unpacked into a temporary root, then what its postinst does, run there with the
    system's python3: the package's venvs of two earlier versions (current names 0.0.9), a
    hand-made one, and an unfinished try of this version's are already there."""
    root = tmp_path_factory.mktemp("root")
    assert run(["dpkg-deb", "-x", built["deb"], str(root)]).returncode == 0
    opt = root / OPT.lstrip("/")
    for old in ("0.0.8", "0.0.9"):
        mark(opt / old)
    os.makedirs(opt / "0.0.7" / "bin")           # made by hand (docs/install.md): not the package's
    os.symlink("0.0.9", opt / "current")
    os.makedirs(opt / VENV / "bin")
    (opt / VENV / ".slurm-gpu-hooks-package.incomplete").write_text("")
    (opt / VENV / "bin" / "half-written").write_text("")
    done = venv_setup("install", VENV, str(root / WHEELS.lstrip("/")), str(opt), "/usr/bin/python3")
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def test_postinst_makes_the_venv_from_the_shipped_wheels_and_flips_current(deb_root, tmp_path):
    opt = deb_root / OPT.lstrip("/")
    assert os.readlink(opt / "current") == VENV
    assert os.stat(opt).st_mode & 0o777 == 0o755
    assert sorted(p.name for p in (opt / VENV).glob(".slurm-gpu-hooks-package*")) == [".slurm-gpu-hooks-package"]
    assert not (opt / VENV / "bin" / "half-written").exists()               # the unfinished try is gone
    assert "home = /usr/bin" in (opt / VENV / "pyvenv.cfg").read_text()     # the system's python3
    for command in COMMANDS:
        link = os.readlink(deb_root / "usr" / "bin" / command)
        assert os.access(str(deb_root) + link, os.X_OK), link
    checked = run([str(opt / "current" / "bin" / "slurm-gpu"), "config", "check",
                   str(deb_root / DEFAULT_CONFIG_PATH.lstrip("/"))], cwd=str(tmp_path))
    assert checked.returncode == 0, checked.stderr
    # The previous version stays (rollback, hooks still running it); older package venvs go;
    # a venv made by hand is never touched.
    assert sorted(os.listdir(opt)) == sorted(["0.0.7", "0.0.9", VENV, "current"])
    # postinst run again (a reinstall): the complete venv is kept as it is, nothing else changes.
    before = (opt / VENV / "bin" / "slurm-gpu").stat().st_mtime_ns
    again = venv_setup("install", VENV, str(deb_root / WHEELS.lstrip("/")), str(opt), "/usr/bin/python3")
    assert again.returncode == 0, again.stderr
    assert (opt / VENV / "bin" / "slurm-gpu").stat().st_mtime_ns == before
    assert sorted(os.listdir(opt)) == sorted(["0.0.7", "0.0.9", VENV, "current"])


def test_systemd_analyze_verify_passes_on_the_unit(deb_root):
    """Against the unpacked root: ExecStart must exist there (the venv postinst made)."""
    need("systemd-analyze")
    units = deb_root / "lib" / "systemd" / "system"
    if not units.exists():                      # the targets the unit names (multi-user.target)
        shutil.copytree("/lib/systemd/system", str(units), symlinks=True)
    done = run(["systemd-analyze", "verify", f"--root={deb_root}", os.path.basename(UNIT)])
    assert done.returncode == 0 and "slurm-gpu-watch" not in done.stdout + done.stderr, done.stdout + done.stderr


def other_pythons() -> List[str]:
    """This machine's Python of each target distribution (3.9: EL9, 3.13: Debian 13) where it has
    one, else its own python3 (Debian 12's 3.11): at least one, never an empty (skipped) set."""
    found = {"3.11": "/usr/bin/python3"}
    for minor in ("3.9", "3.13"):
        candidates = [f"/usr/bin/python{minor}"] + sorted(
            glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python{minor}")))
        for candidate in candidates:
            if os.access(candidate, os.X_OK):
                found[minor] = candidate
                break
    if len(found) > 1:
        del found["3.11"]                       # the fixture already installs with it
    return sorted(found.values())


@pytest.mark.parametrize("python", other_pythons())
def test_the_other_distributions_pythons_install_their_packages_wheels(built, python, tmp_path):
    """Where this machine has a Python 3.9 (EL9's) or 3.13 (Debian 13's), its package's wheels
    install offline with it (the host's 3.11 is the fixture's)."""
    minor = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    root = tmp_path / "root"
    if minor in RPM_PYTHONS:
        extract_rpm(built["rpm"], root)
    else:
        assert run(["dpkg-deb", "-x", built["deb"], str(root)]).returncode == 0
    opt = root / OPT.lstrip("/")
    done = venv_setup("install", VENV, str(root / WHEELS.lstrip("/")), str(opt), python)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = run([str(opt / "current" / "bin" / "slurm-gpu"), "config", "check",
                   str(root / DEFAULT_CONFIG_PATH.lstrip("/"))], cwd=str(tmp_path))
    assert checked.returncode == 0, checked.stderr


def test_removal_takes_only_the_package_venvs(tmp_path):
    opt = tmp_path / "opt"
    for version in ("0.0.9", "0.1.0"):
        mark(opt / version)
    os.makedirs(opt / "0.0.7" / "bin")
    os.symlink("0.1.0", opt / "current")
    done = venv_setup("remove", str(opt))
    assert done.returncode == 0, done.stderr
    assert os.listdir(opt) == ["0.0.7"]
    (opt / "0.0.7" / "bin").rmdir()
    (opt / "0.0.7").rmdir()
    mark(opt / "0.1.0")
    assert venv_setup("remove", str(opt)).returncode == 0
    assert not opt.exists()                      # nothing of anyone's left: /opt/slurm-gpu-hooks goes


def test_venv_setup_refuses_links_and_bad_versions(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "opt")
    done = venv_setup("install", VERSION, str(tmp_path), str(tmp_path / "opt"), "/usr/bin/python3")
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "symbolic link" in done.stderr
    assert os.listdir(tmp_path / "elsewhere") == []
    bad = venv_setup("install", "../x", str(tmp_path), str(tmp_path / "o2"), "/usr/bin/python3")
    assert bad.returncode != 0 and "bad version" in bad.stderr and not (tmp_path / "o2").exists()
    # A directory of that name the package did not make (by hand, docs/install.md) stays.
    os.makedirs(tmp_path / "o3" / VENV / "bin")
    foreign = venv_setup("install", VENV, str(tmp_path), str(tmp_path / "o3"), "/usr/bin/python3")
    assert foreign.returncode != 0 and "not a venv this package made" in foreign.stderr
    assert os.listdir(tmp_path / "o3" / VENV) == ["bin"]


# -- dpkg: install, edit the config, upgrade to a rebuilt package, purge -----------------------------

def dpkg(root, *argv: str) -> subprocess.CompletedProcess:
    need("dpkg")
    # Chrootless: dpkg runs the maintainer scripts here with DPKG_ROOT set; they make no venv
    # and touch nothing outside it then.
    return run(["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", *argv])


def test_upgrading_to_a_rebuilt_package_keeps_an_edited_config(built, tmp_path):
    before = os.path.lexists(OPT)
    root = tmp_path / "root"
    for sub in ("info", "updates", "triggers"):
        os.makedirs(root / "var" / "lib" / "dpkg" / sub)
    (root / "var" / "lib" / "dpkg" / "status").write_text("")
    first = dpkg(root, "-i", built["deb"])
    assert first.returncode == 0, first.stdout + first.stderr
    config = root / DEFAULT_CONFIG_PATH.lstrip("/")
    assert config.read_bytes() == open(os.path.join(ROOT, "etc", "slurm-gpu-hooks.toml"), "rb").read()
    # The tmpfiles.d entry, applied by postinst (systemd-tmpfiles --root).
    assert os.stat(root / "var/lib/slurm-gpu-hooks").st_mode & 0o777 == 0o750
    assert os.stat(root / "run/slurm-gpu-hooks").st_mode & 0o777 == 0o700
    edited = config.read_text().replace("enabled = true", "enabled = false", 1)
    assert edited != config.read_text()
    config.write_text(edited)
    second = dpkg(root, "-i", built["deb2"])
    assert second.returncode == 0, second.stdout + second.stderr
    status = run(["dpkg-query", f"--root={root}", "-W", "-f", "${Version} ${Status}", "slurm-gpu-hooks"])
    assert status.stdout == f"{VERSION}-2 install ok installed", status.stdout + status.stderr
    assert config.read_text() == edited                          # the admin's edit survives
    assert not list(config.parent.glob("config.toml.dpkg-*"))     # and no prompt was needed
    purged = dpkg(root, "--purge", "slurm-gpu-hooks")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert not config.exists() and not (root / "var/lib/slurm-gpu-hooks").exists()
    assert not (root / "usr/bin/slurm-gpu").exists()
    assert os.path.lexists(OPT) == before                        # this machine's /opt untouched


# -- dpkg for real: the maintainer scripts in a chroot of this machine's own /usr ----------------------
#
# A private mount namespace (unshare -m, every mount private) holding a temporary root whose
# /usr and /etc are overlays of this machine's (writes go to a temporary upper directory), with
# /dev and /proc: dpkg --root chroots into it and runs postinst, prerm and postrm as on a node,
# with Debian 12's python3. The mounts die with the namespace; this machine's root is only
# ever a read-only lower layer.
SESSION = r"""
set -eu
top=$1; shift
mount --make-rprivate /
mkdir -p "$top/root/usr" "$top/root/etc" "$top/root/dev" "$top/root/proc" "$top/root/tmp" \
    "$top/upper/usr" "$top/upper/etc" "$top/work/usr" "$top/work/etc"
for link in bin sbin lib lib64; do
  if [ -L "/$link" ]; then ln -sfn "$(readlink "/$link")" "$top/root/$link"; fi
done
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$top/upper/usr,workdir=$top/work/usr" "$top/root/usr"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$top/upper/etc,workdir=$top/work/etc" "$top/root/etc"
mount --bind /dev "$top/root/dev"
mount -t proc proc "$top/root/proc"
"$@"
"""


def session(top, *argv: str) -> subprocess.CompletedProcess:
    need("unshare", "mount", "chroot", "dpkg")
    return run(["unshare", "-m", "bash", "-c", SESSION, "session", str(top), *argv], timeout=600,
               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})


def test_dpkg_runs_the_maintainer_scripts_in_a_chroot_install_upgrade_remove_purge(built, tmp_path):
    if os.geteuid() != 0:
        pytest.fail("this test mounts (unshare -m, overlay): run it as root, as the test command does",
                    pytrace=False)
    before = os.path.lexists(OPT)
    root = tmp_path / "root"
    for sub in ("info", "updates", "triggers"):
        os.makedirs(root / "var" / "lib" / "dpkg" / sub)
    (root / "var" / "lib" / "dpkg" / "status").write_text("")
    opt = root / OPT.lstrip("/")

    def dpkg_in(*argv: str) -> subprocess.CompletedProcess:
        # --force-depends: the temporary root's dpkg database lists no python3 (its /usr has it).
        done = session(tmp_path, "dpkg", f"--root={root}", "--force-depends", *argv)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    def inside(*argv: str) -> subprocess.CompletedProcess:
        return session(tmp_path, "chroot", str(root), *argv)

    dpkg_in("-i", built["deb"])
    assert os.readlink(opt / "current") == VENV                           # postinst made it, in there
    checked = inside("/usr/bin/slurm-gpu", "config", "check", DEFAULT_CONFIG_PATH)
    assert checked.returncode == 0, checked.stderr
    assert "home = /usr/bin" in (opt / VENV / "pyvenv.cfg").read_text()
    assert os.stat(root / "var/lib/slurm-gpu-hooks").st_mode & 0o777 == 0o750  # systemd-tmpfiles
    edit = inside("sed", "-i", "0,/^enabled = true/s//enabled = false/", DEFAULT_CONFIG_PATH)
    assert edit.returncode == 0, edit.stderr
    edited = inside("cat", DEFAULT_CONFIG_PATH).stdout
    assert "enabled = false" in edited

    dpkg_in("-i", built["deb2"])                                        # the rebuilt package
    assert os.readlink(opt / "current") == f"{VERSION}-2"
    assert sorted(os.listdir(opt)) == sorted([VENV, f"{VERSION}-2", "current"])    # rollback kept
    assert inside("cat", DEFAULT_CONFIG_PATH).stdout == edited
    assert inside("/usr/bin/slurm-gpu", "config", "check", DEFAULT_CONFIG_PATH).returncode == 0

    dpkg_in("--remove", "slurm-gpu-hooks")
    assert not opt.exists()                                             # prerm took the venvs
    assert inside("cat", DEFAULT_CONFIG_PATH).stdout == edited          # remove keeps the config
    assert (root / "var/lib/slurm-gpu-hooks").is_dir()
    dpkg_in("--purge", "slurm-gpu-hooks")
    assert inside("test", "-e", DEFAULT_CONFIG_PATH).returncode == 1
    assert not (root / "var/lib/slurm-gpu-hooks").exists()
    assert os.path.lexists(OPT) == before                              # this machine's /opt untouched


# -- the .rpm -------------------------------------------------------------------------------------

def rpm_query(rpm: str, *argv: str) -> str:
    need("rpm")
    done = run(["rpm", "-qp", *argv, rpm])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_rpm_holds_the_same_files_as_the_deb(built):
    listed = set(rpm_query(built["rpm"], "--list").split())
    debs = {path for path, member in deb_entries(built["deb"]).items() if not member.isdir()}
    debian_only = {"/usr/share/doc/slurm-gpu-hooks/changelog.Debian.gz",
                   "/usr/share/lintian/overrides/slurm-gpu-hooks"}
    wheels = {p for p in listed if p.startswith(WHEELS + "/")}
    assert listed - wheels - {WHEELS, "/etc/slurm-gpu-hooks", "/usr/lib/slurm-gpu-hooks"} == \
        {p for p in debs if not p.startswith(WHEELS + "/")} - debian_only
    assert any(re.search(r"/markupsafe-[^/]*-cp39-", w) for w in wheels)
    assert f"{WHEELS}/slurm_gpu_hooks-{VERSION}-py3-none-any.whl" in wheels
    rows = rpm_query(built["rpm"], "--queryformat",
                     "[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES} %{FILELINKTOS}\n]")
    modes = {}
    for row in rows.splitlines():
        perms, owner, path, *link = row.split()
        assert owner == "root:root", row
        modes[path] = (perms, link[0] if link else "")
    assert modes[DEFAULT_CONFIG_PATH][0] == "-rw-r--r--" and modes[HELPER][0] == "-rwxr-xr-x"
    assert modes[UNIT][0] == "-rw-r--r--"
    for command in COMMANDS:
        assert modes[f"/usr/bin/{command}"] == ("lrwxrwxrwx", f"{OPT}/current/bin/{command}")


def test_the_rpm_config_is_never_replaced_and_its_scriptlets_make_and_remove_the_venv(built):
    assert rpm_query(built["rpm"], "--configfiles").split() == [DEFAULT_CONFIG_PATH]
    flags = rpm_query(built["rpm"], "--queryformat", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]")
    assert f"cn {DEFAULT_CONFIG_PATH}" in flags.splitlines()     # %config(noreplace): .rpmnew on upgrade
    scripts = rpm_query(built["rpm"], "--scripts")
    post = scripts.split("postinstall scriptlet")[1].split("scriptlet")[0]
    assert f"{HELPER} install {VERSION}-1.el9 {WHEELS} {OPT}" in post and not ENABLES.search(post)
    preun = scripts.split("preuninstall scriptlet")[1].split("scriptlet")[0]
    assert '[ "$1" -eq 0 ]' in preun and f"{HELPER} remove {OPT}" in preun      # erase only, not upgrade
    requires = rpm_query(built["rpm"], "--requires").splitlines()
    assert "python(abi) = 3.9" in requires and "/usr/bin/python3" in requires
    assert rpm_query(built["rpm"], "--queryformat", "%{VERSION}-%{RELEASE} %{ARCH}") == f"{VERSION}-1.el9 x86_64"


def test_build_packages_refuses_a_bad_revision_in_one_line(tmp_path):
    done = run([BUILD, "--out", str(tmp_path), "--revision", "x"])
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "--revision" in done.stderr and os.listdir(tmp_path) == []


def test_install_md_names_the_places_the_package_installs(built):
    """docs/install.md's table of the packages: every file path it names is in the .deb (under
    /opt: what venv-setup makes), and it names every path the .deb installs outside the docs."""
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as handle:
        page = handle.read()
    section = page.split("## Or: the packages")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    named = set()
    for row in table:
        for path in re.findall(r"`(/[^`]+)`", row):
            named.add(path.rstrip("/"))
    entries = deb_entries(built["deb"])
    for path in named:
        if path.startswith(OPT):
            assert path in (f"{OPT}/<version>", f"{OPT}/current", f"{OPT}/current/bin"), path
        elif path in ("/var/lib/slurm-gpu-hooks", "/run/slurm-gpu-hooks"):
            tmpfiles = open(os.path.join(ROOT, "etc", "tmpfiles.d", "slurm-gpu-hooks.conf")).read()
            assert re.search(rf"^d {re.escape(path)} ", tmpfiles, re.M), path
        else:
            assert path in entries, path
    files = {p for p, m in entries.items() if not m.isdir() and not p.startswith(("/usr/share/doc/",
                                                                                "/usr/share/lintian/", WHEELS + "/"))}
    bin_row = next(row for row in table if "`/usr/bin/slurm-gpu`" in row)
    for path in files:
        name = os.path.basename(path)
        if path.startswith("/usr/bin/"):         # `/usr/bin/slurm-gpu`, `slurm-gpu-prolog`, `-epilog`, ...
            assert f"`{name}`" in bin_row or f"`/usr/bin/{name}`" in bin_row or \
                f"`{name[len('slurm-gpu'):]}`" in bin_row, path
        else:
            assert path in named or os.path.dirname(path) in named, path
