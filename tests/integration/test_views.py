"""The application's view of the node is not always the daemon's: in a container, a chroot or any
mount namespace a dataset root may name other files, and the daemon's tier and run folders may be
missing. Each case is made here with a private mount namespace (``unshare -m``, as a container
runtime makes one) around the command that ``monarch run`` runs; the daemon stays outside. The
reader checks every byte against the files its own view holds; the fallback is said once, with its
reason, on stderr and in the report."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from support.harness import load, monarch, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _can_unshare():
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"unshare -m is not permitted here: {r.stderr.strip()}"


WHY_NOT = _can_unshare()
needs_unshare = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def in_namespace(setup: str, *cmd: str) -> list[str]:
    """``cmd`` in a private mount namespace after the shell lines ``setup`` (mounts, made without the
    shim, as a container runtime makes them before the container's first process)."""
    script = f"set -e\nmount() {{ LD_PRELOAD= command mount \"$@\"; }}\n{setup}\nexec \"$@\""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *cmd]


def reader(ds, epochs=2, workers=2, out=None):
    cmd = [sys.executable, "-m", "monarch.tools.workload", "read", ds.root, "--epochs", str(epochs),
           "--workers", str(workers), "--manifest", ds.manifest]
    return cmd + (["--json", out] if out else [])


def run(base, root, *cmd, **config):
    report = os.path.join(base, "report.json")
    r = monarch("run", "-c", write_config(base, root, **config), "--report", report, "--no-progress", "--", *cmd)
    return r, load(report) if os.path.exists(report) else None


def reasons(report):
    return [f["reason"] for f in report["fallbacks"]]


def said(stderr, words):
    """The lines of the shim's (``monarch: ...``) that hold ``words``."""
    return [line for line in stderr.splitlines() if line.startswith("monarch: ") and words in line]


@needs_unshare
def test_a_root_that_names_other_files_inside_is_read_directly_and_said(dataset, short_tmp):
    """The daemon serves /…/pfs; inside, the same path is bound from another dataset with the same
    names (a container's own /data). Every byte read is the inside files', none the daemon's copies."""
    served = dataset(files=120, size="8KiB", name="pfs", seed=1)
    inside = dataset(files=120, size="8KiB", name="other", seed=2)
    assert set(served.files) == set(inside.files)
    cmd = reader(inside)
    cmd[cmd.index(inside.root)] = served.root  # read at the served path: the inside files are there
    r, report = run(short_tmp, served.root, *in_namespace(f"mount --bind {inside.root} {served.root}", *cmd),
                    policy="read-ahead")
    assert r.returncode == 0, r.stderr  # on the daemon's copies: "file(s) read wrong bytes"
    assert len(said(r.stderr, "is not the dataset root the daemon serves")) == 1, r.stderr
    assert reasons(report) == ["root-elsewhere"]
    assert served.root in report["fallbacks"][0]["detail"]
    assert sum(c["opens"] for name, c in report["opened_from"].items() if name != "pfs") == 0


@needs_unshare
def test_tier_folders_not_visible_are_said_once_and_cost_no_request_per_open(dataset, short_tmp):
    """A private /dev/shm and /tmp-like tier base inside: no tier folder of the daemon's is there.
    The reads are right, the fallback said once, and no open asks the daemon (whose answers would
    name folders that are not there)."""
    ds = dataset(files=150, size="8KiB")
    hide = f"mount -t tmpfs none /dev/shm\nfor d in {short_tmp}/ssd*; do mount -t tmpfs none \"$d\"; done"
    r, report = run(short_tmp, ds.root, *in_namespace(hide, *reader(ds)))
    assert r.returncode == 0, r.stderr
    assert len(said(r.stderr, "tier folder(s) are not visible here")) == 1, r.stderr
    assert reasons(report) == ["tiers-unseen"]
    assert report["opened_from"]["pfs"]["opens"] == 2 * len(ds.files)
    assert report["nodes"][0]["resolves"] == {}  # no OPEN reached the daemon


@needs_unshare
def test_an_unreachable_run_folder_passes_through_and_is_said(dataset, short_tmp):
    """The run folder hidden inside (not bound): every process reads the dataset directly, said once
    for the process tree (its forked workers and their children say nothing more)."""
    ds = dataset(files=100, size="8KiB")
    r, report = run(short_tmp, ds.root, *in_namespace(f"for d in {short_tmp}/run*; do mount -t tmpfs none \"$d\"; done", *reader(ds)))
    assert r.returncode == 0, r.stderr
    assert len(said(r.stderr, "run folder of the node's daemon is not reachable here")) == 1, r.stderr
    assert reasons(report) == ["no-shim"]  # no process could count itself: the shim's own line says why


def test_a_daemon_of_another_uid_is_said_once_and_never_asked_again(dataset, short_tmp):
    """The reader runs as another user than the daemon (a container user mapped to another uid): its
    shim sees the run folder's files are not its user's and passes through, said once."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to run the reader as another user")
    ds = dataset(files=60, size="8KiB")
    for d in (short_tmp, *(os.path.join(dp, n) for dp, dns, _ in os.walk(ds.root) for n in dns), ds.root):
        os.chmod(d, 0o755)
    for dp, _, names in os.walk(ds.root):
        for n in names:
            os.chmod(os.path.join(dp, n), 0o644)
    from monarch.shim import shim_library
    shim = os.path.join(short_tmp, "libmonarch_shim.so")  # where another user can load it
    shutil.copy(shim_library(), shim)
    os.chmod(shim, 0o755)
    files = sorted(os.path.join(ds.root, rel) for rel in ds.files)
    script = f"LD_PRELOAD={shim} exec setpriv --reuid 65534 --regid 65534 --clear-groups md5sum \"$@\""
    r, report = run(short_tmp, ds.root, "sh", "-c", script, "sh", *files)
    assert r.returncode == 0, r.stderr
    assert len(said(r.stderr, "runs as another user than this process (uid 65534)")) == 1, r.stderr
    import hashlib
    want = {p: hashlib.md5(open(p, "rb").read()).hexdigest() for p in files}
    got = {line.split(None, 1)[1]: line.split()[0] for line in r.stdout.splitlines()}
    assert got == want


def test_processes_that_never_touch_a_root_are_not_counted_as_readers(dataset, short_tmp):
    """A wrapper that runs with the shim and starts the readers without it (as a container runtime
    does when LD_PRELOAD is not passed in): the report says the shim ran only in processes that made
    no call under the roots, not "N processes ran with the shim"."""
    ds = dataset(files=50, size="8KiB")
    wrapper = "import os, subprocess, sys; env = dict(os.environ); env.pop('LD_PRELOAD'); " \
              "sys.exit(subprocess.call(sys.argv[1:], env=env))"
    r, report = run(short_tmp, ds.root, sys.executable, "-c", wrapper, *reader(ds))
    assert r.returncode == 0, r.stderr
    assert report["processes_with_shim"] >= 1 and report["processes_at_roots"] == 0
    assert reasons(report) == ["shim-idle"]
    assert "the shim ran only in processes that made no call under the dataset roots" in r.stderr
    assert json.dumps(report["fallbacks"]).count("shim-idle") == 1
