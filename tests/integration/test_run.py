"""``monarch run`` end to end: real launcher, real daemon, real shim, real readers."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from monarch.node.tiers.resources import mount_of
from monarch.tools.slowpfs import fuse_unavailable_reason
from support.harness import load, monarch, monarch_env, reader, run_dirs, write_config

pytestmark = pytest.mark.integration


def test_three_shuffled_epochs_read_the_pfs_once(dataset, short_tmp):
    ds = dataset(files=2000, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=3, workers=4))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    assert rep["dataset"] == {"files": 2000, "bytes": ds.total}
    # every byte from the PFS exactly once, by the stager; none by the application
    assert rep["pfs"]["staging_bytes"] == ds.total
    assert rep["pfs"]["app_bytes"] == 0 and rep["opened_from"]["pfs"]["opens"] == 0
    assert rep["pfs"]["total_bytes"] == ds.total
    # all three epochs read from the RAM tier, with correct bytes (the reader checks digests)
    assert rep["opened_from"]["ram"] == {"opens": 3 * 2000, "bytes": 3 * ds.total, "opens_uncounted": 0,
                                         "opens_stdio": 0, "mapped_bytes": 0}
    assert rep["pfs"]["without_monarch_bytes"] == 3 * ds.total
    assert rep["staging"] == {"files": 2000, "bytes": ds.total, "failures": {}}
    assert rep["front_door"]["copies"] > 0  # the misses went through the daemon's C front door
    assert "Monarch access report" in r.stderr and "1.00x the dataset" in r.stderr
    # nothing left behind: the run's RAM tier directory removed, socket gone
    assert not any(files for _, _, files in os.walk(f"/dev/shm{short_tmp}"))
    assert not glob.glob(os.path.join(short_tmp, "run0", "*", "*", "daemon.sock"))


def test_pfs_bytes_counted_independently_by_the_emulated_pfs(dataset, short_tmp, slow_pfs):
    ds = dataset(files=400, size="8KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = ds.__class__(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    cfg = write_config(short_tmp, mounted.root)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(mounted, epochs=3, workers=2))
    assert r.returncode == 0, r.stderr
    counted = pfs.counters()
    assert counted["bytes"] == ds.total  # the filesystem itself saw each byte once
    assert counted["opens"] == 400
    assert load(report)["pfs"]["total_bytes"] == ds.total


@pytest.mark.parametrize("kind", ["os", "mmap"])
def test_other_readers_get_the_same_bytes(dataset, short_tmp, kind):
    ds = dataset(files=200, size="16KiB")
    report = os.path.join(short_tmp, "report.json")
    # the readers wait for the snapshot (a first open past the default wait reads the PFS: fail open), which
    # an emulated arm64 daemon (the arm64 stage, qemu-user) took 26 s to walk in one run (its report said so)
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--",
                *reader(ds, epochs=2, workers=2, reader_kind=kind), env=monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    node = rep["nodes"][0]
    assert rep["opened_from"]["ram"]["opens"] == 400 and rep["opened_from"]["pfs"]["opens"] == 0, (
        rep["opened_from"], node.get("snapshot"), node.get("snapshot_ready_seconds"), node.get("metadata"),
        node.get("resolves"), r.stderr[-2000:])
    assert rep["pfs"]["staging_bytes"] == ds.total


def test_c_programs_and_numpy_through_monarch_run(dataset, short_tmp):
    np = pytest.importorskip("numpy")
    ds = dataset(files=20, size="4KiB")
    arr = np.arange(100_000, dtype=np.float64)
    np.save(os.path.join(ds.root, "array.npy"), arr)
    files = sorted(glob.glob(os.path.join(ds.root, "*", "*.bin")))
    expected = subprocess.run(["md5sum", *files], capture_output=True, text=True, check=True).stdout
    script = (f"import numpy, subprocess, sys\n"
              f"a = numpy.load({os.path.join(ds.root, 'array.npy')!r})\n"
              f"assert (a == numpy.arange(100_000, dtype=numpy.float64)).all()\n"
              f"for _ in range(2):\n"
              f"    out = subprocess.run(['md5sum', *{files!r}], capture_output=True, text=True).stdout\n"
              f"    assert out == {expected!r}, out\n"
              f"    subprocess.run(['cat', *{files!r}], stdout=subprocess.DEVNULL, check=True)\n")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--", sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    rep = load(report)
    # numpy once, md5sum and cat twice each over 20 files: all opens served, the PFS read once
    assert rep["opened_from"]["ram"]["opens"] + rep["opened_from"]["pfs"]["opens"] == 1 + 4 * 20
    assert rep["opened_from"]["pfs"]["opens"] == 0
    assert rep["pfs"]["staging_bytes"] == ds.total + os.path.getsize(os.path.join(ds.root, "array.npy"))
    # md5sum and numpy read through stdio: fread is counted, the rest marked as bounds
    assert rep["opened_from"]["ram"]["opens_uncounted"] == 2 * 20 + 1  # and numpy's fdopen'd FILE
    assert "≥" in r.stderr


def test_full_tiers_pin_what_they_hold_and_the_rest_stays_on_the_pfs(dataset, short_tmp):
    ds = dataset(files=100, size="10KiB")
    report = os.path.join(short_tmp, "report.json")
    cap = ds.total // 4
    cfg = write_config(short_tmp, ds.root, ram=cap, ssd=cap)
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=3, workers=2))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    staged = rep["staging"]["files"]
    assert 0 < staged < 100 and rep["staging"]["failures"] == {"no_room": 100 - staged}
    # the staged set is read from the tiers every epoch (never evicted), the rest from the PFS
    tier_opens = rep["opened_from"]["ram"]["opens"] + rep["opened_from"]["ssd"]["opens"]
    assert tier_opens == 3 * staged
    assert rep["opened_from"]["pfs"]["opens"] == 3 * (100 - staged)
    assert rep["pfs"]["staging_bytes"] == rep["staging"]["bytes"] <= 2 * cap


def test_a_tier_with_no_room_beside_the_filesystem_reserve_is_said_at_the_start_and_in_the_report(dataset, short_tmp):
    """A reserve larger than any filesystem here leaves both tiers no room (as 25% does a host whose
    disk is more than 75% full): the job reads the PFS, and the launcher says at its start, and the
    report under each tier, why and which key changes it."""
    ds = dataset(files=20, size="4KiB")
    report = os.path.join(short_tmp, "report.json")
    cfg = write_config(short_tmp, ds.root, policy="read-ahead", reserve="4096TiB")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=2, workers=1))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    assert rep["staging"]["files"] == 0 and rep["opened_from"]["pfs"]["opens"] == 40
    # the reserve is said of the tier's mount point; where the mount table does not show one (a
    # chroot whose root is no mount, as the arm64 stage's), of the tier's own directory
    why = (r" less than the 4096\.0 TiB it leaves free for the application: 4096\.0 TiB \(filesystem_reserve\) on {}; "
           r"a smaller filesystem_reserve \(a size, a share, or 0\) lets it take files$")
    start, end = r.stderr.split("Monarch access report", 1)
    table = end.split("\ntier ", 1)[1].splitlines()  # the report's table of the tiers
    for name, base in (("ram", "/dev/shm"), ("ssd", f"{short_tmp}/ssd0")):
        mount = mount_of(base)[0]
        because = why.format(re.escape(mount) if mount else re.escape(os.path.realpath(base)) + "/[^;]*")
        (said,) = [line for line in start.splitlines() if f"tier {name} takes no file: its filesystem has " in line]
        assert re.search(r" free," + because, said), said
        under = table[next(i for i, line in enumerate(table) if line.startswith(f"{name} ")) + 1].strip()
        assert under.startswith("could take no file: its filesystem had ") and \
            re.search(r" free when the daemon started," + because, under), end


def test_read_ahead_stages_everything_in_the_background(dataset, short_tmp):
    ds = dataset(files=300, size="4KiB")
    report = os.path.join(short_tmp, "report.json")
    cfg = write_config(short_tmp, ds.root, policy="read-ahead")
    script = "import time; time.sleep(2)"
    r = monarch("run", "-c", cfg, "--report", report, "--", sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    rep = load(report)
    assert rep["staging"]["files"] == 300 and rep["pfs"]["staging_bytes"] == ds.total


def test_exit_code_is_the_commands(dataset, short_tmp):
    ds = dataset(files=5)
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--", "sh", "-c", "exit 7")
    assert r.returncode == 7


def test_sigterm_is_forwarded_to_the_command(dataset, short_tmp):
    ds = dataset(files=5)
    marker = os.path.join(short_tmp, "got-term")
    script = (f"import signal, sys, time\n"
              f"def bye(*_):\n    open({marker!r}, 'w').close(); sys.exit(42)\n"
              f"signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", write_config(short_tmp, ds.root), "--",
                          sys.executable, "-c", script], env=monarch_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 42
    assert os.path.exists(marker)


def test_bad_config_stops_before_anything_runs(short_tmp):
    bad = os.path.join(short_tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write("dataset: {roots: [/x]}\ntiers:\n  - {name: ram, path: /dev/shm/x, capacity: lots}\n")
    marker = os.path.join(short_tmp, "ran")
    r = monarch("run", "-c", bad, "--", "touch", marker)
    assert r.returncode == 2
    assert f"config {bad}: tiers[0].capacity" in r.stderr
    assert not os.path.exists(marker)


def test_daemon_killed_mid_run_the_app_completes_with_correct_bytes(dataset, short_tmp):
    ds = dataset(files=200, size="8KiB")
    cfg = write_config(short_tmp, ds.root)
    # epoch 1 stages through the daemon; then the daemon is SIGKILLed; epochs 2-3 still verify
    epoch = reader(ds, epochs=1, workers=2)
    script = (f"import os, signal, subprocess\n"
              f"subprocess.run({epoch!r} + ['--seed', '1'], check=True)\n"
              f"pid_file = os.path.join(os.path.dirname(os.environ['MONARCH_SOCKET']), 'daemon.pid')\n"
              f"os.kill(int(open(pid_file).read()), signal.SIGKILL)\n"
              f"for seed in ('2', '3'):\n"
              f"    subprocess.run({epoch!r} + ['--seed', seed], check=True)\n")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    assert "daemon was lost" in r.stderr
    rep = load(report)
    # staged files kept being read from the tier; bytes verified by the reader's digests
    assert rep["opened_from"]["ram"]["opens"] >= 200
    assert rep["opened_from"]["ram"]["opens"] + rep["opened_from"]["pfs"]["opens"] == 600


def test_two_launchers_of_one_job_share_one_daemon(dataset, short_tmp):
    ds = dataset(files=300, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    env = monarch_env(MONARCH_JOB_ID="shared-job")
    reports = [os.path.join(short_tmp, f"r{i}.json") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", rp, "--",
                               *reader(ds, epochs=2, workers=2)], env=env, stderr=subprocess.PIPE, text=True)
             for rp in reports]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    last = max((load(rp) for rp in reports), key=lambda rep: rep["opened_from"]["ram"]["opens"])
    # one daemon: the dataset was staged once for both launchers
    assert last["pfs"]["staging_bytes"] == ds.total
    assert last["opened_from"]["ram"]["opens"] + last["opened_from"]["pfs"]["opens"] == 2 * 2 * 300
    (run_dir,) = run_dirs(short_tmp)
    assert os.path.basename(run_dir) == "shared-job-node0"
    deadline = time.time() + 10
    while os.path.exists(os.path.join(run_dir, "daemon.sock")) and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(os.path.join(run_dir, "daemon.sock"))


def test_report_command_prints_a_saved_report(dataset, short_tmp):
    ds = dataset(files=10)
    report = os.path.join(short_tmp, "report.json")
    assert monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--", "true").returncode == 0
    r = monarch("report", report)
    assert r.returncode == 0 and "Monarch access report" in r.stdout
    bad = os.path.join(short_tmp, "not-a-report.json")
    open(bad, "w").write("{}")
    r = monarch("report", bad)
    assert r.returncode == 2 and "not a Monarch report" in r.stderr


def test_demo_runs_the_main_job_on_the_embedded_default(short_tmp):
    env = monarch_env(TMPDIR=short_tmp)
    r = monarch("demo", "--files", "200", "--epochs", "2", "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert "= 1.00x the dataset" in r.stderr
    # it says every byte was checked, and shows each epoch read directly beside Monarch's
    summary = r.stdout.split("== demo ==", 1)[1]
    for how in ("directly", "under Monarch"):
        assert f"read {how}: every byte checked: 400 reads (2 epochs x 200 files," in summary
    rows = [line.split() for line in summary.splitlines() if line[:1].isdigit()]  # numbered as its workload prints them (0-based)
    assert [row[0] for row in rows] == ["0", "1"] and all(len(row) == 6 and row[2] == row[4] == "s" for row in rows)
    # the dataset sits behind the emulated slow PFS (where FUSE works), whose own counters say
    # what each read cost it: every epoch directly, the dataset once under Monarch
    if fuse_unavailable_reason(probe=True) is None:
        assert "demo: the dataset is behind an emulated slow PFS" in r.stdout
        (pfs_line,) = [line for line in summary.splitlines() if line.startswith("PFS read, as the emulated PFS")]
        assert " = 2.00x the dataset; under Monarch " in pfs_line and pfs_line.endswith(" = 1.00x the dataset")
    else:
        assert "demo: no emulated slow PFS here" in r.stdout
    (report,) = glob.glob(os.path.join(short_tmp, f"monarch-{os.getuid()}", "demo-*-node0", "report.json"))
    rep = load(report)
    assert rep["opened_from"]["ram"]["opens"] == 400 and rep["pfs"]["app_bytes"] == 0
    # each file copied once, whether the read-ahead, the front door or a demand got to it first
    assert rep["staging"]["files"] == 200 and rep["pfs"]["staging_bytes"] == rep["dataset"]["bytes"]


def standing_daemon(cfg, short_tmp, env):
    """A standing ``monarch serve`` of ``cfg`` (write_config's run base), once its socket is up:
    the process and the socket's path."""
    serve = subprocess.Popen([sys.executable, "-m", "monarch", "serve", "-c", cfg], env=env,
                             stderr=subprocess.PIPE, text=True)
    sock = os.path.join(short_tmp, "run0", f"monarch-{os.getuid()}", "local-node0", "daemon.sock")
    deadline = time.time() + 30
    while not os.path.exists(sock) and time.time() < deadline:
        time.sleep(0.05)
    return serve, sock


def test_standing_daemon_serves_several_runs_and_reports_at_stop(dataset, short_tmp):
    ds = dataset(files=200, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    env = monarch_env()
    serve, sock = standing_daemon(cfg, short_tmp, env)
    try:
        runs = []
        for i in range(2):
            report = os.path.join(short_tmp, f"r{i}.json")
            r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=1, workers=2), env=env)
            assert r.returncode == 0, r.stderr
            runs.append(load(report))
        # each run reports its own session: the first staged everything, the second read it all from RAM
        assert [rp["opened_from"]["ram"]["opens"] for rp in runs] == [200, 200]
        assert [rp["pfs"]["staging_bytes"] for rp in runs] == [ds.total, 0]
        assert serve.poll() is None  # runs attach; they never stop a daemon they did not start
        assert monarch("stop", "-c", cfg, env=env).returncode == 0
        assert serve.wait(timeout=30) == 0
    finally:
        serve.kill()
    rep = load(os.path.join(os.path.dirname(sock), "report.json"))
    assert rep["opened_from"]["ram"]["opens"] == 400 and rep["pfs"]["total_bytes"] == ds.total
    r = monarch("stop", "-c", cfg, env=env)
    assert r.returncode == 2 and "no Monarch daemon answers" in r.stderr


@pytest.mark.parametrize("differs", [("capacity: 1GiB, keep", "capacity: 512MiB, keep"),
                                     ("policy: on-access", "policy: read-ahead")], ids=["tier-capacity", "staging"])
def test_a_run_whose_configuration_differs_gets_a_daemon_of_its_own(dataset, short_tmp, differs):
    """The job's standing daemon serves the same roots, but not the same tiers or staging: the
    run says so in one line and runs on a private daemon, not silently on the other one."""
    ds = dataset(files=100, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    other = os.path.join(short_tmp, "other.yaml")
    with open(cfg) as f, open(other, "w") as g:
        text = f.read()
        assert differs[0] in text
        g.write(text.replace(differs[0], differs[1], 1))
    env = monarch_env()
    serve, sock = standing_daemon(cfg, short_tmp, env)
    try:
        report = os.path.join(short_tmp, "r.json")
        r = monarch("run", "-c", other, "--report", report, "--", *reader(ds, epochs=1, workers=2), env=env)
        assert r.returncode == 0, r.stderr
        key = "tiers[0].capacity" if "capacity" in differs[0] else "staging.policy"
        assert f"serves another configuration ({key}: " in r.stderr and "this run does not use it" in r.stderr
        rep = load(report)
        assert "scope" not in rep["job"]  # the run's own daemon, not its part of the standing one's
        assert rep["opened_from"]["ram"]["opens"] == 100 and rep["pfs"]["staging_bytes"] == ds.total
        assert monarch("stop", "-c", cfg, env=env).returncode == 0
        assert serve.wait(timeout=30) == 0
    finally:
        serve.kill()
    standing = load(os.path.join(os.path.dirname(sock), "report.json"))
    assert sum(c["opens"] for c in standing["opened_from"].values()) == 0  # nothing of the run went to it


def test_the_command_inherits_every_descriptor_monarch_run_got(dataset, short_tmp):
    # an MPI launcher hands its ranks a PMI socket as a bare inherited fd (PMI_FD): it must reach the command
    ds = dataset(files=5)
    read_end, write_end = os.pipe()
    script = "import os, sys; os.write(int(sys.argv[1]), b'through monarch run'); os.close(int(sys.argv[1]))"
    try:
        p = subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", write_config(short_tmp, ds.root), "--",
                              sys.executable, "-c", script, str(write_end)], env=monarch_env(), pass_fds=[write_end],
                             stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert os.read(read_end, 100) == b"through monarch run"
    finally:
        os.close(read_end)


def test_the_report_keeps_the_run_and_its_job_apart(dataset, short_tmp):
    """A job step's run is ``job.step``; the report names both, not the run as the job."""
    ds = dataset(files=20, size="4KiB")
    report = os.path.join(short_tmp, "report.json")
    env = monarch_env(SLURM_JOB_ID="4242", SLURM_STEP_ID="3")
    for key in ("MONARCH_JOB_ID", "MONARCH_RUN_ID"):
        env.pop(key, None)
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--",
                *reader(ds, epochs=1, workers=1), env=env)
    assert r.returncode == 0, r.stderr
    job = load(report)["job"]
    assert (job["run_id"], job["job_id"]) == ("4242.3", "4242")


def test_a_stat_only_command_is_not_told_the_dataset_bypassed_monarch(dataset, short_tmp):
    """A command that only stats the dataset has its stats answered from the index
    (metadata.local), so it is not told "the dataset was not read through Monarch"."""
    ds = dataset(files=20, size="1KiB")
    report = os.path.join(short_tmp, "report.json")
    code = f"import glob, os\nfor p in sorted(glob.glob({ds.root!r} + '/*/*.bin')): os.stat(p)\n"
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--", sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    rep = load(report)
    assert rep["metadata"]["local"] >= 20 and sum(c["opens"] for c in rep["opened_from"].values()) == 0
    assert "not read through Monarch" not in r.stderr
    assert f"monarch: warning: no file of the dataset was opened through Monarch, though {rep['metadata']['local']} " \
           "stat or listing call(s)" in r.stderr
