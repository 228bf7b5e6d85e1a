"""`monarch run` where HPC jobs run (DESIGN principle 9): under mpiexec and around it, a
torchrun-style spawn of workers, and two unscheduled runs side by side on one node.

The tests assert on what could be wrong whatever the tier layout: exit codes, the digests
the programs check, and the report's dataset, opened_from and PFS bytes.
"""

import os
import re
import sys
from pathlib import Path

import pytest

from support.harness import finish_group, load, monarch_env, reader, run_group, start_group, write_config

pytestmark = pytest.mark.mpi

HERE = Path(__file__).parent
MPI_READER = str(HERE / "mpi_reader.py")
SPAWN_READER = str(HERE / "spawn_reader.py")
MONARCH_RUN = [sys.executable, "-m", "monarch", "run"]
# whatever launched pytest must not name the runs of these tests
_LAUNCHER_VARS = re.compile(r"^(SLURM_|PMI_|PMIX_|OMPI_|HYDRA_|MPI_LOCAL|TORCHELASTIC_|MONARCH_(JOB|RUN)_ID$|"
                            r"(PBS_JOBID|LSB_JOBID|FLUX_JOB_ID|COBALT_JOBID)$)")


def unscheduled_env(base, **extra):
    """No scheduler, MPI launcher or outer run in sight; the default directories under ``base``."""
    env = {k: v for k, v in monarch_env().items() if not _LAUNCHER_VARS.match(k)}
    env.update(TMPDIR=base, MONARCH_SSD=base, **{k: str(v) for k, v in extra.items()})
    return env


def lines(out, prog):
    """The programs' result records, ``PROG k=v ... ;``: Hydra forwards the ranks' output in
    chunks, so one rank's record may share a line with another's."""
    return [dict(kv.split("=", 1) for kv in rec.split()) for rec in re.findall(rf"{prog} ([^;]*);", out)]


def assert_read_once(rep, ds, opens):
    """The report of a run that read ``opens`` files of ``ds``, all from the tiers: the PFS read once."""
    assert rep["dataset"] == {"files": len(ds.files), "bytes": ds.total}
    assert rep["pfs"]["staging_bytes"] == ds.total
    assert rep["pfs"]["app_bytes"] == 0 and rep["opened_from"]["pfs"]["opens"] == 0
    assert sum(s["opens"] for s in rep["opened_from"].values()) == opens


@pytest.mark.parametrize("ranks, flags, named", [(2, [], "mpich-"), (4, [], "mpich-"), (2, ["-pmi-port"], "hydra-")])
def test_mpiexec_runs_monarch_run_per_rank_sharing_one_daemon(mpiexec, dataset, short_tmp, ranks, flags, named):
    ds = dataset(files=96, size="8KiB")
    rank_var = "PMI_ID" if flags else "PMI_RANK"  # hydra's -pmi-port gives the rank as PMI_ID only
    cfg = write_config(short_tmp, ds.root, dirs=False, extra=f'report: "{short_tmp}/report-${{{rank_var}}}.json"\n')
    r = run_group([mpiexec, *flags, "-n", str(ranks), *MONARCH_RUN, "-c", cfg, "--", sys.executable, MPI_READER,
                   ds.root, ds.manifest, "--epochs", "2"], env=unscheduled_env(short_tmp), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = lines(r.stdout, "mpi_reader")
    assert sorted(int(s["rank"]) for s in seen) == list(range(ranks)) and all(s["bad"] == "0" for s in seen)
    assert sum(int(s["bytes"]) for s in seen) == ds.total  # the first epoch: every file once
    reports = [load(os.path.join(short_tmp, f"report-{k}.json")) for k in range(ranks)]
    # one run: every rank's launcher named it alike, exported it, and attached to one daemon,
    # which staged the dataset once for all ranks (each read files another rank read first)
    run_ids = {rep["job"]["run_id"] for rep in reports} | {s["run"] for s in seen}
    assert len(run_ids) == 1 and run_ids.pop().startswith(named)
    for rep in reports:
        assert rep["job"]["exit_code"] == 0
        assert_read_once(rep, ds, opens=2 * len(ds.files))


def test_mpiexec_ranks_print_the_node_report_once(mpiexec, dataset, short_tmp):
    """One launcher per rank: the node's report is printed once, by the last launcher to leave
    (its totals hold every rank's reads); each other rank prints one line pointing to the JSON."""
    import glob
    ranks = 3
    ds = dataset(files=60, size="8KiB")
    cfg = write_config(short_tmp, ds.root, dirs=False)
    r = run_group([mpiexec, "-n", str(ranks), *MONARCH_RUN, "-c", cfg, "--no-progress", "--", sys.executable,
                   MPI_READER, ds.root, ds.manifest, "--epochs", "2"], env=unscheduled_env(short_tmp), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.count("== Monarch access report ==") == 1, r.stderr
    pointers = re.findall(r"monarch: report of node 0: printed by this run's last launcher on the node to leave; "
                          r"JSON: (\S+)", r.stderr)
    (printed,) = re.findall(r"\nreport    : (\S+)", r.stderr)
    assert len(pointers) == ranks - 1 and set(pointers) == {printed}, r.stderr
    assert_read_once(load(printed), ds, opens=2 * len(ds.files))  # the printed totals: every rank's reads
    assert not glob.glob(os.path.join(short_tmp, "**", "launchers-*.lock"), recursive=True)


@pytest.mark.parametrize("ranks", [2, 4])
def test_monarch_run_wraps_mpiexec(mpiexec, dataset, short_tmp, ranks):
    ds = dataset(files=96, size="8KiB")
    cfg = write_config(short_tmp, ds.root, dirs=False)
    report = os.path.join(short_tmp, "report.json")
    r = run_group([*MONARCH_RUN, "-c", cfg, "--report", report, "--", mpiexec, "-n", str(ranks), sys.executable,
                   MPI_READER, ds.root, ds.manifest, "--epochs", "2"], env=unscheduled_env(short_tmp), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = lines(r.stdout, "mpi_reader")
    assert sorted(int(s["rank"]) for s in seen) == list(range(ranks)) and all(s["bad"] == "0" for s in seen)
    rep = load(report)
    # the outermost run named the run and every rank inherited the name
    assert rep["job"]["run_id"].startswith("run-") and {s["run"] for s in seen} == {rep["job"]["run_id"]}
    assert_read_once(rep, ds, opens=2 * len(ds.files))


def test_nested_monarch_run_joins_the_outer_run(dataset, short_tmp):
    ds = dataset(files=60, size="8KiB")
    cfg = write_config(short_tmp, ds.root, dirs=False)
    outer, inner = os.path.join(short_tmp, "outer.json"), os.path.join(short_tmp, "inner.json")
    r = run_group([*MONARCH_RUN, "-c", cfg, "--report", outer, "--", *MONARCH_RUN, "-c", cfg, "--report", inner, "--",
                   *reader(ds, epochs=2, workers=2)], env=unscheduled_env(short_tmp), timeout=180)
    assert r.returncode == 0, r.stderr
    outer, inner = load(outer), load(inner)
    # the inner launcher inherited the outer's name and attached to its daemon: one staging
    assert inner["job"]["run_id"] == outer["job"]["run_id"] and outer["job"]["run_id"].startswith("run-")
    assert_read_once(inner, ds, opens=2 * len(ds.files))
    assert_read_once(outer, ds, opens=2 * len(ds.files))
    # one report printed, by the outer launcher (the last of the run to leave)
    assert r.stderr.count("== Monarch access report ==") == 1 and "printed by this run's last launcher" in r.stderr


@pytest.mark.parametrize("torchelastic_run_id", [None, "te-7"])
def test_torchrun_style_spawned_workers_read_through_the_shim(dataset, short_tmp, torchelastic_run_id):
    ds = dataset(files=60, size="8KiB")
    cfg = write_config(short_tmp, ds.root, dirs=False)
    report = os.path.join(short_tmp, "report.json")
    extra = {"TORCHELASTIC_RUN_ID": torchelastic_run_id} if torchelastic_run_id else {}
    r = run_group([*MONARCH_RUN, "-c", cfg, "--report", report, "--", sys.executable, SPAWN_READER,
                   ds.root, ds.manifest, "3", "2"], env=unscheduled_env(short_tmp, **extra), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = lines(r.stdout, "spawn_reader")
    assert len(seen) == 3 and all(s["bad"] == "0" for s in seen)
    assert sum(int(s["files"]) for s in seen) == 2 * len(ds.files)
    rep = load(report)
    run_id = rep["job"]["run_id"]
    assert run_id == torchelastic_run_id if torchelastic_run_id else run_id.startswith("run-")
    assert {s["run"] for s in seen} == {run_id}
    assert_read_once(rep, ds, opens=2 * len(ds.files))


def test_two_unscheduled_runs_side_by_side_each_read_their_own_dataset(dataset, short_tmp):
    # the same relative names, different bytes; neither run is named by anything but itself
    a, b = dataset(files=80, size="6KiB", name="pfs-a"), dataset(files=80, size="6KiB", name="pfs-b", seed=1)
    assert set(a.files) == set(b.files) and a.files != b.files
    procs = {}
    for ds, me, other in ((a, "a", "b"), (b, "b", "a")):
        # each command waits until both launchers are attached, then reads its dataset for 2 epochs
        wait = (f"import os, subprocess, sys, time\n"
                f"open({os.path.join(short_tmp, me)!r}, 'w').close()\n"
                f"deadline = time.time() + 60\n"
                f"while not os.path.exists({os.path.join(short_tmp, other)!r}):\n"
                f"    if time.time() > deadline: sys.exit(3)\n"
                f"    time.sleep(0.02)\n"
                f"sys.exit(subprocess.run({reader(ds, epochs=2, workers=2)!r}).returncode)\n")
        # the shipped defaults: the run's directories and tiers come from its identity alone
        cmd = [*MONARCH_RUN, "--report", os.path.join(short_tmp, f"report-{me}.json"), "--", sys.executable, "-c", wait]
        procs[me] = start_group(cmd, unscheduled_env(short_tmp, MONARCH_DATASET=ds.root))
    results = {me: finish_group(p) for me, p in procs.items()}
    for me, ds in (("a", a), ("b", b)):
        r = results[me]
        assert r.returncode == 0, r.stdout + r.stderr  # the reader checked every byte against its own manifest
        assert_read_once(load(os.path.join(short_tmp, f"report-{me}.json")), ds, opens=2 * len(ds.files))
    ids = {load(os.path.join(short_tmp, f"report-{me}.json"))["job"]["run_id"] for me in "ab"}
    assert len(ids) == 2 and all(i.startswith("run-") for i in ids)
