"""A Slurm release's Debian root filesystem: built once with ``debootstrap`` and cached under
the lab directory (``$LAB/rootfs/VERSION``), entered through a mount namespace.

Entering is one ``unshare --mount`` with three bind mounts: the root filesystem's ``/etc``,
``/usr`` and ``/opt`` over the host's (``/opt``: where a package of ours, installed into the root
filesystem with its own dpkg, makes its venv). The host is merged-/usr (``/bin``, ``/lib``, ``/sbin`` are links
into ``/usr``), so every program, library and user (``/etc/passwd``) is then the release's,
while ``/var``, ``/tmp``, ``/proc``, ``/dev``, ``/sys`` and ``/run`` stay the host's: the lab
directory, its state and job output keep their paths, pids are the host's, and the mounts
vanish with the last process that holds them (``lab down`` has no mount to undo).

The hooks run in there on that Debian's own python3, installed from a wheel built from the
checkout into a venv (``VENV``), as a site installs them; reinstalled when the checkout changed.

``$LAB/bin`` holds one small wrapper per command (``scontrol``, ``sbatch``, ``slurmd``, ...)
that enters the root filesystem and runs the release's binary, or runs it at once when it
already is in there (a hook calling ``scontrol``). Host releases get wrappers too, that run the
host's binary, so ``$LAB/bin`` always means "this lab's Slurm".
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence, Tuple

from . import LabError
from .install import BINARIES, PACKAGES
from .paths import LabPaths
from .releases import Release
from .commands import clean_env, last_line, run

Say = Callable[[str], None]

# What debootstrap installs besides its minimal base (--variant=minbase, no Recommends).
ROOTFS_PACKAGES = PACKAGES + ("python3", "python3-venv", "python3-jinja2")
# Inside the root filesystem: the hooks' venv (system site packages: Debian's jinja2), the
# marker that says "this /usr is release X", and what was built.
VENV = "/usr/local/slurm-gpu-hooks"      # a link to the venv of the source now installed
VENVS = "/usr/local/slurm-gpu-hooks-"    # + the source digest's first 12 hex digits
MARKER_DIR = "/usr/lib/slurm-gpu-lab"
BUILT_STAMP = MARKER_DIR + "/built"
SOURCE_STAMP = VENV + "/source.sha256"    # read through the link
# Copied from the host into the root filesystem's /etc at every `lab up`.
HOST_ETC = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
UNSHARE = "/usr/bin/unshare"
ENTER = ('/usr/bin/mount --bind "$0/etc" /etc && /usr/bin/mount --bind "$0/usr" /usr'
         ' && /usr/bin/mount --bind "$0/opt" /opt && exec "$@"')
# Directories ENTER binds that a root filesystem built before it bound them may lack.
BOUND_DIRS = ("/opt",)
MIRROR_ENV = "SLURM_GPU_LAB_MIRROR"
# What of the checkout goes into the wheel (setup.cfg's packages, and the files it reads).
PACKAGED = ("setup.cfg", "pyproject.toml", "README.md", "healthcheck", "slurm_hooks", "etc", "man")


def inside(root: str, path: str) -> str:
    """The host's path of ``path`` as the root filesystem at ``root`` has it."""
    return os.path.join(root, path.lstrip("/"))


def enter_argv(root: str, argv: Sequence[str]) -> List[str]:
    """Run ``argv`` (paths as the root filesystem has them) inside the root filesystem."""
    return [UNSHARE, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", ENTER, root, *argv]


def marker(release: Release) -> str:
    return f"{MARKER_DIR}/{release.version}"


# -- building ------------------------------------------------------------------------------------
def built(root: str) -> bool:
    try:
        with open(inside(root, BUILT_STAMP), encoding="utf-8") as handle:
            return handle.read().split() == list(ROOTFS_PACKAGES)
    except OSError:
        return False


def _ensure_debootstrap(say: Say) -> str:
    path = shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path:
        return path
    say("installing debootstrap (apt-get)")
    env = clean_env({"DEBIAN_FRONTEND": "noninteractive"})
    run(["apt-get", "update"], env=env, timeout=600, check=False)
    run(["apt-get", "install", "-y", "--no-install-recommends", "debootstrap"], env=env, timeout=600)
    path = shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not path:
        raise LabError("apt-get did not install debootstrap")
    return path


def build(lab: LabPaths, release: Release, say: Say) -> Optional[float]:
    """Build the release's root filesystem unless the cache has it; the seconds it took, or None."""
    root = lab.rootfs(release.version)
    if built(root):
        return None
    debootstrap = _ensure_debootstrap(say)
    began = time.monotonic()
    work = root + ".build"
    shutil.rmtree(work, ignore_errors=True)
    if os.path.lexists(root):
        shutil.rmtree(root)
    debs = os.path.join(lab.rootfs_dir, "debs")
    os.makedirs(debs, mode=0o755, exist_ok=True)
    mirror = os.environ.get(MIRROR_ENV) or release.mirror
    log = os.path.join(lab.log, f"debootstrap-{release.version}.log")
    say(f"building the Slurm {release.version} root filesystem: debootstrap {release.debian} from {mirror} "
        f"(first time only; log {log})")
    argv = [debootstrap, "--variant=minbase", "--include=" + ",".join(ROOTFS_PACKAGES),
            f"--cache-dir={debs}", release.debian, work, mirror]
    result = run(argv, env=clean_env({"DEBIAN_FRONTEND": "noninteractive"}), timeout=1800, check=False)
    with open(log, "w", encoding="utf-8") as handle:
        handle.write(result.stdout + result.stderr)
    if result.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise LabError(f"debootstrap {release.debian} failed (rc {result.returncode}): {last_line(result)}; see {log}")
    os.makedirs(inside(work, MARKER_DIR), mode=0o755, exist_ok=True)
    with open(inside(work, marker(release)), "w", encoding="ascii") as handle:
        handle.write(release.version + "\n")
    with open(inside(work, BUILT_STAMP), "w", encoding="utf-8") as handle:
        handle.write("\n".join(ROOTFS_PACKAGES) + "\n")
    os.rename(work, root)
    seconds = time.monotonic() - began
    say(f"built the Slurm {release.version} root filesystem in {seconds:.0f} s ({root})")
    return seconds


def sync_etc(root: str) -> None:
    """The host's name and resolver in the root filesystem (Slurm resolves the host's name), and
    the directories ENTER binds."""
    from .files import write_if_changed

    for path in BOUND_DIRS:
        os.makedirs(inside(root, path), mode=0o755, exist_ok=True)

    for path in HOST_ETC:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                write_if_changed(inside(root, path), handle.read(), 0o644)


def user_ids(root: str, name: str) -> Tuple[int, int]:
    """(uid, gid) of ``name`` in the root filesystem's /etc/passwd ("" root: the host's)."""
    if not root:
        import pwd

        record = pwd.getpwnam(name)
        return record.pw_uid, record.pw_gid
    with open(inside(root, "/etc/passwd"), encoding="utf-8") as handle:
        for line in handle:
            fields = line.rstrip("\n").split(":")
            if len(fields) >= 4 and fields[0] == name:
                return int(fields[2]), int(fields[3])
    raise LabError(f"no user {name!r} in {root}/etc/passwd")


# -- the hooks inside ----------------------------------------------------------------------------
def checkout() -> str:
    """The source tree this lab code runs from (a checkout: setup.cfg beside the packages)."""
    import slurm_hooks

    top = os.path.dirname(os.path.dirname(os.path.abspath(slurm_hooks.__file__)))
    if not os.path.isfile(os.path.join(top, "setup.cfg")):
        from .releases import releases

        host = " or ".join(f"--slurm {r.version}" for r in releases().values() if not r.rootfs)
        raise LabError(f"a Slurm root filesystem gets the hooks from a checkout; {top} is not one (no setup.cfg): "
                       f"run from a checkout of the repository, or `lab up {host}` (the host's packages)")
    return top


def source_digest(top: str) -> str:
    """What the wheel is built from, hashed: changes when any packaged file does."""
    digest = hashlib.sha256()
    for name in PACKAGED:
        path = os.path.join(top, name)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                digest.update(name.encode() + b"\0" + handle.read())
    for package in (name for name in PACKAGED if os.path.isdir(os.path.join(top, name))):
        for current, dirs, files in os.walk(os.path.join(top, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".pyc"):
                    continue
                path = os.path.join(current, name)
                with open(path, "rb") as handle:
                    digest.update(os.path.relpath(path, top).encode() + b"\0" + handle.read())
    return digest.hexdigest()


def _requirements(wheel: str) -> List[str]:
    """The wheel's Requires-Dist that apply to the root filesystem's python (markers dropped
    only for ``python_version < "3.11"``: every rootfs python is newer)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        meta = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode("utf-8")
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = line.split(":", 1)[1].strip()
            if "extra ==" in requirement or 'python_version < "3.11"' in requirement:
                continue
            out.append(requirement.split(";")[0].strip())
    return out


def install_hooks(lab: LabPaths, release: Release, say: Say) -> bool:
    """The checkout's wheel in the root filesystem's venv, unless it already holds this source.
    True when it (re)installed."""
    root = lab.rootfs(release.version)
    top = checkout()
    digest = source_digest(top)
    stamp = inside(root, SOURCE_STAMP)
    try:
        with open(stamp, encoding="ascii") as handle:
            if handle.read().strip() == digest:
                return False
    except OSError:
        pass
    began = time.monotonic()
    wheels = os.path.join(lab.rootfs_dir, "wheels")
    os.makedirs(wheels, mode=0o755, exist_ok=True)
    host_env = dict(os.environ)    # pip's own settings (index, proxy) are the caller's
    with tempfile.TemporaryDirectory(prefix="slurm-gpu-lab-wheel-") as out:
        source = os.path.join(out, "src")   # a clean copy: no stale build/ of the checkout gets in
        for name in PACKAGED:
            path = os.path.join(top, name)
            if os.path.isdir(path):
                shutil.copytree(path, os.path.join(source, name),
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif os.path.isfile(path):
                os.makedirs(source, exist_ok=True)
                shutil.copyfile(path, os.path.join(source, name))
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
             "-w", out, source], env=host_env, timeout=600, cwd=out)
        built_wheels = [name for name in os.listdir(out) if name.endswith(".whl")]
        if len(built_wheels) != 1:
            raise LabError(f"pip wheel built {built_wheels or 'nothing'} from {top}")
        wheel = os.path.join(wheels, built_wheels[0])
        shutil.copyfile(os.path.join(out, built_wheels[0]), wheel)
    requirements = _requirements(wheel)
    have = set(os.listdir(wheels))
    missing = [req for req in requirements
               if not any(name.lower().startswith(_dist(req) + "-") for name in have)]
    if missing:
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
             "-w", wheels, *missing], env=host_env, timeout=600, cwd="/")
    # A venv per source behind the stable VENV link, switched in one rename once complete (as
    # docs/install.md does with /opt): a hook started during a reinstall runs the old or the new
    # install, never half of one.
    target = VENVS + digest[:12]
    shutil.rmtree(inside(root, target), ignore_errors=True)
    run(enter_argv(root, ["/usr/bin/python3", "-m", "venv", "--system-site-packages", target]), timeout=300)
    pip = [f"{target}/bin/python", "-m", "pip", "--disable-pip-version-check", "-q"]
    run(enter_argv(root, [*pip, "install", "--no-index", "--find-links", wheels, wheel]), timeout=600)
    with open(inside(root, target + "/source.sha256"), "w", encoding="ascii") as handle:
        handle.write(digest + "\n")
    _switch_link(root, target)
    say(f"installed {os.path.basename(wheel)} into {VENV} of the Slurm {release.version} root filesystem "
        f"in {time.monotonic() - began:.1f} s")
    return True


def _switch_link(root: str, target: str) -> None:
    """Point VENV at ``target`` (one rename); keep the venv it pointed at before (a hook may still
    run from it), remove older ones."""
    link = inside(root, VENV)
    previous = ""
    if os.path.islink(link):
        previous = os.readlink(link)
    elif os.path.isdir(link):
        shutil.rmtree(link)             # a venv installed in place by an earlier lab
    temporary = link + ".new"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(os.path.basename(target), temporary)   # relative: the same inside and from the host
    os.replace(temporary, link)
    keep = {os.path.basename(target), os.path.basename(previous)}
    parent = os.path.dirname(link)
    for name in os.listdir(parent):
        if name.startswith(os.path.basename(VENVS)) and name not in keep:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _dist(requirement: str) -> str:
    """"python-hostlist>=1.21" -> "python_hostlist" (a wheel file's name part)."""
    name = requirement
    for stop in "<>=!~[ (":
        name = name.split(stop)[0]
    return name.strip().lower().replace("-", "_").replace(".", "_")


# -- $LAB/bin ------------------------------------------------------------------------------------
def wrapper_text(lab: LabPaths, release: Release, name: str) -> str:
    path = BINARIES[name]
    if not release.rootfs:
        return (f"#!/bin/sh\n# Generated by `slurm-gpu lab up`: the lab's {name} (Slurm {release.version}, "
                f"the host's packages).\nexec {shlex.quote(path)} \"$@\"\n")
    root = lab.rootfs(release.version)
    entered = " ".join(shlex.quote(part) for part in enter_argv(root, [path]))
    return (f"#!/bin/sh\n# Generated by `slurm-gpu lab up`: the lab's {name}, Slurm {release.version} from the "
            f"Debian {release.debian} root filesystem\n# {root} (entered through a mount namespace; "
            f"run at once when already inside).\n"
            f"[ -f {shlex.quote(marker(release))} ] && exec {shlex.quote(path)} \"$@\"\n"
            f"exec {entered} \"$@\"\n")


def write_wrappers(lab: LabPaths, release: Release) -> List[str]:
    """One wrapper per command in ``$LAB/bin``; return those that changed."""
    from .files import make_dir, write_if_changed

    make_dir(lab.bin)
    changed = []
    for name in BINARIES:
        target = os.path.join(lab.bin, name)
        if write_if_changed(target, wrapper_text(lab, release, name), 0o755):
            changed.append(target)
    return changed


def python(lab: LabPaths, release: Release) -> str:
    """The Python a lab job runs the lab's payload with (a path as the job sees it)."""
    return f"{VENV}/bin/python" if release.rootfs else os.path.abspath(sys.executable)
