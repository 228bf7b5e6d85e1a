#!/usr/bin/env python3
"""Make the container image the container tests run Monarch in, from nothing but Debian's
packages and this checkout: a Debian bookworm root filesystem (``debootstrap --variant=minbase``
with python3 and python3-venv), Monarch installed from the wheel this checkout builds (``pip wheel
--no-deps``, as tests/integration/test_wheel.py builds it) into a virtual environment at
/opt/monarch, its dependencies from a wheelhouse made here on the host (nothing inside the image
reaches a package index). Its PATH starts with /opt/monarch/bin.

Output, under ``--cache`` (default /var/tmp), keyed by a digest of its inputs (this script, the
wheel's sources):

- ``monarch-image-<key>/rootfs``: the root filesystem, for runs that bind mount and chroot into it
  (``scripts/container/chroot_run.sh``, the way Apptainer and Enroot run an unpacked image);
- with ``--podman``: the same imported into Podman as ``localhost/monarch-test:<key>``; with
  ``--rootless-user USER`` also into that user's own Podman storage, kept in
  ``monarch-podman-USER`` (its HOME for Podman, shared by the images of every key);
- ``monarch-image-<key>/image.json``: what was made and how long each step took.

The base root filesystem is cached apart (``monarch-image-base-<key>``: it depends on what
debootstrap is asked for alone), so a change to Monarch costs a wheel and an install, not a new debootstrap. A
second run with the same inputs costs the digest and a look: seconds. Older images of this
script are removed when a new one is made (the newest two are kept), with their Podman tags.
Runs as root (debootstrap, chroot). Prints image.json.

    python3 scripts/container/make_image.py [--podman] [--rootless-user nobody] [--cache DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv")
VENV = "/opt/monarch"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TAG = "localhost/monarch-test"
PREFIX = "monarch-image-"
# the wheel's sources, as tests/integration/test_wheel.py copies them
TOP_FILES = ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in")
SKIPPED = re.compile(r"(^|/)(__pycache__|\.[^/]*)(/|$)|\.(so|sha256|pyc)$")


class ImageError(Exception):
    pass


def log(msg: str) -> None:
    print(f"make_image: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], timeout: float = 900, **kw) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def script_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def source_files() -> list[Path]:
    files = [REPO / name for name in TOP_FILES if (REPO / name).exists()]
    for dirpath, dirnames, filenames in os.walk(REPO / "monarch"):
        dirnames[:] = sorted(d for d in dirnames if not SKIPPED.search(d + "/"))
        files += [Path(dirpath) / f for f in sorted(filenames) if not SKIPPED.search(f)]
    return files


def image_key() -> str:
    h = hashlib.sha256(script_digest().encode())
    for f in source_files():
        h.update(str(f.relative_to(REPO)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


BASE_FORMAT = 1  # raise it when make_base makes something else


def base_key() -> str:
    """The base root filesystem's key: what debootstrap is asked for (not the rest of this script)."""
    return hashlib.sha256(f"{BASE_FORMAT} {SUITE} {MIRROR} minbase {' '.join(PACKAGES)}".encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked(cache: Path):
    """One maker at a time on this machine (two test sessions at once wait for each other)."""
    with open(cache / f"{PREFIX}lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def timed(timings: dict, step: str):
    t0 = time.monotonic()
    yield
    timings[step] = round(time.monotonic() - t0, 1)
    log(f"{step}: {timings[step]} s")


def in_root(rootfs: Path, *cmd: str, timeout: float = 600) -> str:
    """``cmd`` chrooted in ``rootfs``, in a private mount namespace with /proc and /dev (pip and
    venv need them)."""
    script = ('set -e; mount -t proc proc "$0/proc"; mount --rbind /dev "$0/dev"; '
              'exec chroot "$0" /usr/bin/env -i PATH=' + PATH + ' HOME=/root LANG=C.UTF-8 "$@"')
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(rootfs), *cmd],
               timeout=timeout)


def make_base(cache: Path, timings: dict) -> Path:
    base = cache / f"{PREFIX}base-{base_key()}" / "rootfs"
    if base.exists():
        return base
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (scripts/install.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}base-", dir=cache))
    try:
        with timed(timings, "debootstrap"):
            run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(work / "rootfs"),
                 MIRROR], timeout=1200)
        # apt's downloaded packages: not needed in the image
        shutil.rmtree(work / "rootfs/var/cache/apt/archives", ignore_errors=True)
        (work / "rootfs/var/cache/apt/archives/partial").mkdir(parents=True)
        base.parent.parent.mkdir(exist_ok=True)
        os.rename(work, base.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return base


def dependencies() -> list[str]:
    """The requirements of the ``[project] dependencies`` list in pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r"(?ms)^dependencies\s*=\s*\[(.*?)\]", text)
    if not m:
        raise ImageError("pyproject.toml: no [project] dependencies list")
    return re.findall(r'"([^"]+)"', m[1])


def make_wheelhouse(rootfs: Path, out: Path, timings: dict) -> None:
    """Monarch's wheel, built here as a user builds it, and wheels of its dependencies for the
    image's Python (asked of the host's pip: PyPI or its cache; the image needs no index)."""
    src = out.parent / "src"
    src.mkdir()
    for f in source_files():
        dest = src / f.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    with timed(timings, "wheel"):
        run([*pip, "wheel", "-q", "--no-deps", "-w", str(out), str(src)])
    shutil.rmtree(src)
    version = in_root(rootfs, "python3", "-c", "import sys; print('%d%d' % sys.version_info[:2])").strip()
    platforms = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux2010_x86_64",
                 "manylinux_2_12_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"]
    with timed(timings, "dependency wheels"):
        run([*pip, "download", "-q", "--only-binary=:all:", "--implementation", "cp", "--python-version", version,
             *[a for p in platforms for a in ("--platform", p)], "-d", str(out), *dependencies()])


def make_rootfs(cache: Path, key: str, timings: dict) -> Path:
    image = cache / f"{PREFIX}{key}"
    rootfs = image / "rootfs"
    if rootfs.exists():
        return rootfs
    base = make_base(cache, timings)
    image.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=image))
    try:
        with timed(timings, "copy base"):
            run(["cp", "-a", str(base), str(work / "rootfs")])
        wheels = work / "rootfs/tmp/wheelhouse"
        wheels.mkdir()
        make_wheelhouse(work / "rootfs", wheels, timings)
        with timed(timings, "venv and install"):
            in_root(work / "rootfs", "python3", "-m", "venv", VENV)
            in_root(work / "rootfs", f"{VENV}/bin/pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--find-links", "/tmp/wheelhouse", "monarch-staging")
        shutil.rmtree(wheels)
        # the image's environment, for a runtime that reads it (chroot_run.sh; podman import gets it too)
        with open(work / "rootfs/etc/environment", "a") as f:
            f.write(f'PATH="{PATH}"\n')
        # every library packaged and current: nothing is compiled at run time inside
        check = ("import monarch, pathlib; from monarch.shim import shim_library; "
                 "p = shim_library(); assert p.parent == pathlib.Path(monarch.__file__).parent / 'shim', p; print(p)")
        in_root(work / "rootfs", f"{VENV}/bin/python", "-c", check)
        os.rename(work / "rootfs", rootfs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rootfs


def rootless_home(cache: Path, user: str) -> Path:
    """``user``'s HOME for Podman. Keep it short: with a HOME of 38 characters or more this Podman
    (4.3) never learns that a container exited and waits 20 s for conmon on every run (a Unix
    socket's path under its storage grows too long); /var/tmp/monarch-podman-nobody works."""
    return cache / f"monarch-podman-{user}"


def podman_env(user: str | None, cache: Path) -> tuple[list[str], dict]:
    """How to call Podman as root, or as ``user`` (rootless) with its own storage."""
    if user is None:
        return ["podman"], dict(os.environ)
    home = rootless_home(cache, user)
    info = pwd.getpwnam(user)
    for d in (home, home / "run", home / ".config", home / ".config/containers"):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chown(d, info.pw_uid, info.pw_gid)
    # the kernel's overlay in the user namespace: left to choose, this Podman takes vfs, which
    # copies the whole image for every container (26 s a run here, against 0.2 s)
    conf = home / ".config/containers/storage.conf"
    if not conf.exists():
        conf.write_text('[storage]\ndriver = "overlay"\n')
        os.chown(conf, info.pw_uid, info.pw_gid)
    # runuser sets HOME from the password file (nobody's: /nonexistent); env sets it after
    return ["runuser", "-u", user, "--", "env", f"HOME={home}", f"XDG_RUNTIME_DIR={home / 'run'}", "podman"], \
        dict(os.environ)


def podman_images(cmd: list[str], env: dict) -> list[str]:
    out = run([*cmd, "images", "--format", "{{.Repository}}:{{.Tag}}"], env=env)
    return [line for line in out.split() if line.startswith(TAG + ":")]


def podman_import(rootfs: Path, key: str, user: str | None, timings: dict) -> str:
    """The root filesystem as a Podman image (every file owned by root: a rootless Podman with no
    subordinate ids maps that one id alone)."""
    name = f"{TAG}:{key}"
    cmd, env = podman_env(user, rootfs.parent.parent)
    if name in podman_images(cmd, env):
        return name
    tar = rootfs.parent / "rootfs.tar"
    with timed(timings, f"podman import ({user or 'root'})"):
        if not tar.exists():
            run(["tar", "-C", str(rootfs), "--numeric-owner", "--owner=0", "--group=0", "-cf", f"{tar}.tmp", "."])
            os.chmod(f"{tar}.tmp", 0o644)
            os.rename(f"{tar}.tmp", tar)
        run([*cmd, "import", "--change", f"ENV PATH={PATH}", str(tar), name], env=env)
    return name


def prune(cache: Path, keep: Path, podman: bool) -> None:
    """Remove this script's older images (the two newest stay), and their Podman tags."""
    images = sorted((p for p in cache.glob(f"{PREFIX}*") if p.is_dir() and not p.name.startswith(f"{PREFIX}base-")),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in images if p != keep][1:]:
        key = old.name[len(PREFIX):]
        if podman and shutil.which("podman"):
            for user in json.loads((old / "image.json").read_text()).get("podman", {}) if (
                    old / "image.json").exists() else ["root"]:
                cmd, env = podman_env(None if user == "root" else user, cache)
                subprocess.run([*cmd, "rmi", "-f", f"{TAG}:{key}"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(old, ignore_errors=True)
    bases = sorted(cache.glob(f"{PREFIX}base-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in bases[1:]:
        shutil.rmtree(old, ignore_errors=True)


def make(cache: Path, podman: bool, rootless_user: str | None) -> dict:
    if os.geteuid() != 0:
        raise ImageError("run it as root (debootstrap and chroot)")
    t0 = time.monotonic()
    timings: dict = {}
    with timed(timings, "digest"):
        key = image_key()
    with locked(cache):
        rootfs = make_rootfs(cache, key, timings)
        image = rootfs.parent
        (image / "run").mkdir(exist_ok=True)  # chroot_run.sh's mount points live beside the rootfs
        record_path = image / "image.json"
        record = json.loads(record_path.read_text()) if record_path.exists() else {
            "key": key, "rootfs": str(rootfs), "venv": VENV, "path": PATH, "podman": {}, "built": {}}
        if podman:
            record["podman"]["root"] = podman_import(rootfs, key, None, timings)
            if rootless_user:
                record["podman"][rootless_user] = podman_import(rootfs, key, rootless_user, timings)
                record.setdefault("podman_home", {})[rootless_user] = str(rootless_home(cache, rootless_user))
        (image / "rootfs.tar").unlink(missing_ok=True)
        if set(timings) - {"digest"}:
            record["built"].update(timings)
        record_path.write_text(json.dumps(record, indent=1))
        os.utime(image)
        prune(cache, image, podman)
    record["seconds"] = round(time.monotonic() - t0, 1)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default="/var/tmp", help="where images are kept (default /var/tmp)")
    p.add_argument("--podman", action="store_true", help="also import the image into root's Podman")
    p.add_argument("--rootless-user", default=None, help="and into this user's rootless Podman")
    args = p.parse_args(argv)
    try:
        record = make(Path(args.cache), args.podman, args.rootless_user)
    except (ImageError, subprocess.TimeoutExpired, OSError) as e:
        print(f"make_image: {e}", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
