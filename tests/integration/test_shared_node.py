"""Safe on a shared node: another user (``nobody``) cannot read, poison or hijack a job's data.

Run as root with a second user through ``runuser``; each test asserts the application got
the PFS's bytes only, no other user can read a staged copy or reach the daemon, and nothing
outside Monarch's own directories is touched.
"""

import glob
import json
import os
import subprocess
import sys

import pytest

from support.harness import NO_RESERVE, load, monarch, monarch_env, reader, write_config, write_tier_config

pytestmark = pytest.mark.integration

NOBODY = 65534


def shared_base(path: str) -> str:
    """A base every user may write, like /tmp (sticky)."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o1777)
    return path


def open_path_to(path: str) -> None:
    """Let a second user reach ``path`` (the test's temporary directory is private)."""
    while path not in ("/", "/tmp"):
        os.chmod(path, os.stat(path).st_mode | 0o711)
        path = os.path.dirname(path)


def config(short_tmp, root, run_base, ram_base, ssd_base) -> str:
    return write_tier_config(short_tmp, root, run_base, ram_base, ssd_base)


def test_a_run_directory_made_first_by_another_user_is_refused(dataset, short_tmp, as_other_user):
    ds = dataset(files=50, size="4KiB")
    base = shared_base(os.path.join(short_tmp, "shared-tmp"))
    open_path_to(base)
    evil = os.path.join(base, f"monarch-{os.getuid()}")
    r = as_other_user(["-c", f"import os; os.mkdir({evil!r}, 0o777); os.chmod({evil!r}, 0o777);"
                             f"open(os.path.join({evil!r}, 'planted'), 'w').close()"])
    assert r.returncode == 0, r.stderr
    cfg = config(short_tmp, ds.root, base, os.path.join(short_tmp, "ram"), os.path.join(short_tmp, "ssd"))
    marker = os.path.join(short_tmp, "preload.txt")
    script = f"import os; open({marker!r}, 'w').write(os.environ.get('LD_PRELOAD', ''))"
    r = monarch("run", "-c", cfg, "--", "sh", "-c", f"{' '.join(reader(ds, epochs=1))} && {sys.executable} -c \"{script}\"")
    assert r.returncode == 0, r.stderr  # the job ran, on the PFS (the reader checked every digest)
    assert "not active for this run" in r.stderr and f"owned by uid {NOBODY}" in r.stderr
    assert open(marker).read() == ""  # nothing of anyone's was preloaded
    assert os.path.exists(os.path.join(evil, "planted"))  # and nothing of theirs was deleted


def test_planted_tier_files_are_never_served(dataset, short_tmp, as_other_user):
    ds = dataset(files=100, size="4KiB")
    ram = shared_base(os.path.join(short_tmp, "shm"))
    open_path_to(ram)
    evil = os.path.join(ram, f"monarch-{os.getuid()}")
    # the attacker makes the victim's directory and plants poisoned copies at every name it can guess
    plant = (f"import os\nos.mkdir({evil!r}, 0o777); os.chmod({evil!r}, 0o777)\n"
             f"for run in ('local', 'job', 'r'):\n"
             f"    for rel in {sorted(ds.files)!r}:\n"
             f"        p = os.path.join({evil!r}, run + '-node0', '0', rel)\n"
             f"        os.makedirs(os.path.dirname(p), exist_ok=True)\n"
             f"        open(p, 'wb').write(b'POISON' * 700)\n")
    assert as_other_user(["-c", plant]).returncode == 0
    cfg = config(short_tmp, ds.root, os.path.join(short_tmp, "run"), ram, os.path.join(short_tmp, "ssd"))
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=2), env=monarch_env(MONARCH_JOB_ID="job"))
    assert r.returncode == 0, r.stderr  # every digest checked against the source
    rep = load(report)
    (node,) = rep["nodes"]
    assert f"owned by uid {NOBODY}" in node["tier_errors"]["ram"]
    assert rep["opened_from"]["ssd"]["opens"] == 200 and "ram" not in rep["opened_from"]  # skipped, said why


def test_a_symlink_planted_as_the_users_directory_is_refused_and_its_target_untouched(dataset, short_tmp,
                                                                                     as_other_user):
    ds = dataset(files=20, size="4KiB")
    base = shared_base(os.path.join(short_tmp, "shared-tmp"))
    open_path_to(base)
    victim = os.path.join(short_tmp, "victims-files")
    os.makedirs(victim)
    with open(os.path.join(victim, "start.lock"), "w") as f:
        f.write("precious")
    link = os.path.join(base, f"monarch-{os.getuid()}")
    assert as_other_user(["-c", f"import os; os.symlink({victim!r}, {link!r})"]).returncode == 0
    cfg = config(short_tmp, ds.root, base, os.path.join(short_tmp, "ram"), os.path.join(short_tmp, "ssd"))
    r = monarch("run", "-c", cfg, "--", *reader(ds, epochs=1))
    assert r.returncode == 0, r.stderr
    assert "is a symlink" in r.stderr
    assert os.listdir(victim) == ["start.lock"] and open(os.path.join(victim, "start.lock")).read() == "precious"


PROBE_AS_NOBODY = """
import os, subprocess, sys
copies = []
for entry in os.environ["MONARCH_PROBE"].split(":"):
    d = entry.split("=", 1)[1]
    assert os.stat(d).st_mode & 0o077 == 0, oct(os.stat(d).st_mode)
    for dirpath, _, names in os.walk(d):
        copies += [os.path.join(dirpath, n) for n in names if not n.startswith(".monarch")]
assert copies
for c in copies:
    assert os.stat(c).st_mode & 0o077 == 0, (c, oct(os.stat(c).st_mode))
sock = os.environ["MONARCH_SOCKET"]
assert os.stat(sock).st_mode & 0o077 == 0, oct(os.stat(sock).st_mode)
code = "import sys\\nfor p in sys.argv[1:]:\\n    try:\\n        open(p, 'rb').read(1); print('READ', p)\\n    except OSError: pass"
out = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", code, *copies],
                     capture_output=True, text=True).stdout
assert "READ" not in out, out
"""


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_staged_copies_of_a_private_dataset_stay_private(dataset, short_tmp, as_other_user, umask):
    ds = dataset(files=30, size="4KiB")
    for dirpath, dirs, names in os.walk(ds.root):
        os.chmod(dirpath, 0o700)
        for n in names:
            os.chmod(os.path.join(dirpath, n), 0o600)
    cfg = config(short_tmp, ds.root, os.path.join(short_tmp, "run"), shared_base(os.path.join(short_tmp, "shm")),
                 shared_base(os.path.join(short_tmp, "ssd")))
    open_path_to(os.path.join(short_tmp, "shm"))
    script = f"import subprocess, sys\nsubprocess.run({reader(ds, epochs=1)!r}, check=True)\n" + PROBE_AS_NOBODY
    old = os.umask(umask)
    try:
        r = monarch("run", "-c", cfg, "--", sys.executable, "-c", script)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr


def test_a_tier_base_holding_the_users_files_keeps_them(dataset, short_tmp):
    ds = dataset(files=50, size="4KiB")
    scratch = os.path.join(short_tmp, "scratch-of-user")
    os.makedirs(os.path.join(scratch, "results"))
    with open(os.path.join(scratch, "results", "model.pt"), "w") as f:
        f.write("weights")
    cfg = config(short_tmp, ds.root, os.path.join(short_tmp, "run"), scratch, scratch)
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=2))
    assert r.returncode == 0, r.stderr
    assert load(report)["opened_from"]["ram"]["opens"] == 100
    assert sorted(os.listdir(scratch)) == ["monarch-%d" % os.getuid(), "results"]
    assert open(os.path.join(scratch, "results", "model.pt")).read() == "weights"
    assert os.listdir(os.path.join(scratch, f"monarch-{os.getuid()}")) == []  # the run's copies are gone


IDLE_CLIENTS = """
import os, socket, subprocess, sys
idle = []
for _ in range(100):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["MONARCH_SOCKET"])
    idle.append(s)
subprocess.run(sys.argv[1:], check=True)
"""


def test_a_hundred_idle_connections_do_not_stall_the_job(dataset, short_tmp):
    ds = dataset(files=300, size="4KiB")
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--", sys.executable, "-c",
                IDLE_CLIENTS, *reader(ds, epochs=2, workers=4))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    (node,) = rep["nodes"]
    assert rep["opened_from"]["ram"]["opens"] == 600 and rep["opened_from"]["pfs"]["opens"] == 0
    assert not any(k.startswith("pfs:timeout") for k in node["resolves"])


def one_tier_config(short_tmp, root, tier_base, policy="on-access") -> str:
    """A configuration whose only tier is ``tier_base`` (run base made here; the tier base is
    the test's to make or plant)."""
    run_base = os.path.join(short_tmp, "run")
    os.makedirs(run_base, exist_ok=True)
    path = os.path.join(short_tmp, "one-tier.yaml")
    with open(path, "w") as f:
        f.write(f'dataset: {{roots: ["{root}"]}}\nrun_base: "{run_base}"\n'
                f'tiers: [{{name: ssd, path: "{tier_base}", capacity: 1GiB}}]\n'
                f'staging: {{policy: {policy}, threads: 2, share: false}}\n' + NO_RESERVE)
    return path


@pytest.mark.parametrize("swapped", [False, True], ids=["planted", "swapped-after-the-check"])
def test_a_tier_base_planted_as_a_symlink_by_another_user_is_refused(dataset, short_tmp, as_other_user, swapped):
    """Another user plants the (missing) base as a symlink to a root-owned sticky directory,
    which a check that follows links passes; then (swapped) points it at a tree of their own
    while the job runs. The base is refused at the start: nothing is made in either target."""
    ds = dataset(files=30, size="4KiB")
    shared = shared_base(os.path.join(short_tmp, "shared-tmp"))
    open_path_to(shared)
    sticky = shared_base(os.path.join(short_tmp, "root-sticky"))  # root's, 1777, like /dev/shm
    with open(os.path.join(sticky, "precious"), "w") as f:
        f.write("root's")
    link = os.path.join(shared, "ssd")
    theirs = os.path.join(shared, "theirs")
    r = as_other_user(["-c", f"import os; os.mkdir({theirs!r}, 0o755); os.symlink({sticky!r}, {link!r})"])
    assert r.returncode == 0, r.stderr
    cfg = one_tier_config(short_tmp, ds.root, link)
    swap = f"runuser -u nobody -- ln -sfn {theirs} {link} && " if swapped else ""
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", "sh", "-c", swap + " ".join(reader(ds, epochs=2)))
    assert r.returncode == 0, r.stderr  # the reader checked every digest: the PFS's bytes
    said = [line for line in r.stderr.splitlines() if "tier ssd is not used" in line]
    assert len(said) == 1 and link in said[0] and f"owned by uid {NOBODY}" in said[0], r.stderr
    rep = load(report)
    assert rep["opened_from"]["pfs"]["opens"] == 60 and "ssd" not in rep["opened_from"]
    assert os.listdir(sticky) == ["precious"] and open(os.path.join(sticky, "precious")).read() == "root's"
    assert os.listdir(theirs) == []  # nothing of the job's went into the other user's tree
