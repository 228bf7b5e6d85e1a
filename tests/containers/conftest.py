"""Monarch in containers (docs/containers.md): real jobs in an image made by
scripts/container/make_image.py, under Podman (as root and rootless) and under the chroot that
stands in for Apptainer and Enroot (scripts/container/chroot_run.sh, through the stand-ins in
bin/). The image is made once per session, and only when its inputs changed (cached in
/var/tmp); from nothing it takes about two minutes here (debootstrap, the wheel)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from containerjobs import CONTAINERS_CONF, ROOTLESS_USER, Image, podman_prefix
from support.harness import REPO

MAKE_IMAGE = Path(REPO) / "scripts" / "container" / "make_image.py"


def _why_no_chroot() -> str | None:
    if os.geteuid() != 0:
        return "the chroot that stands in for Apptainer and Enroot needs root"
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        return "no unshare(1) or chroot(8)"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs tmpfs /mnt && mkdir /mnt/l /mnt/u /mnt/w /mnt/m && "
                        "mount -t overlay overlay -o lowerdir=/mnt/l,upperdir=/mnt/u,workdir=/mnt/w /mnt/m"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"a private mount namespace with an overlay is not permitted: {r.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def image() -> Image:
    """The test image, made (or found in the cache) by scripts/container/make_image.py."""
    why = _why_no_chroot()
    if why:
        pytest.skip(why)
    cmd = [sys.executable, str(MAKE_IMAGE)]
    if shutil.which("podman"):
        cmd += ["--podman", "--rootless-user", ROOTLESS_USER]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads(r.stdout)
    print(f"container image {record['key']}: {record['seconds']} s ({r.stderr.strip()})")
    return Image(record)


@pytest.fixture(scope="session")
def shim_dir():
    """XDG_CACHE_HOME of the host's Monarch in these tests: where it builds the shim from this
    checkout, readable by every user (a container user of another uid loads it)."""
    d = tempfile.mkdtemp(prefix="monarch-test-shim-", dir="/var/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _podman_probe(image: Image, user: str) -> str | None:
    name = image.podman_image(user)
    if name is None:
        return "podman is not installed (scripts/install.sh installs it)"
    r = subprocess.run([*podman_prefix(image, user), "podman", "run", "--rm", name, "true"],
                       env={**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        return f"podman ({user}) cannot run a container here: {r.stderr.strip()[-400:]}"
    return None


@pytest.fixture(scope="session")
def podman(image) -> Image:
    why = _podman_probe(image, "root")
    if why:
        pytest.skip(why)
    return image


@pytest.fixture(scope="session")
def podman_rootless(image) -> Image:
    why = _podman_probe(image, ROOTLESS_USER)
    if why:
        pytest.skip(why)
    return image
