"""One node daemon outside, shared by the node's containers (docs/containers.md): the daemon on the
host, the application in the container with the shim, the run folder, the tier folders and the
environment passed in, each documented line run as written (Podman's for real, Apptainer's and
Pyxis' through the chroot stand-ins); and a job in a private PID namespace sharing the host's
/dev/shm while a second job starts on the host. Every job: exit 0, every digest right, every open
from a tier, the PFS read once, no fallback."""

import os
import subprocess
import time

import pytest

from containerjobs import Job, Runner, doc_block, job_config, reader_line, substitute
from support.harness import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FILES = 300


def outside_job(image, shim_dir, folder, ds, block, image_name, **env):
    report = os.path.join(folder, "report.json")
    job_config(folder, ds.root, report, shared_bases=True)
    script = substitute(doc_block(block), root=ds.root, train=reader_line(ds.root, ds.manifest), image=image_name)
    return Runner(image, folder, shim_dir).run(script, report, **env)


def test_outside_podman(podman, shim_dir, dataset, short_tmp):
    """Podman's container has its own PID namespace too: the daemon's pid means nothing there."""
    ds = dataset(files=FILES, size="8KiB")
    outside_job(podman, shim_dir, short_tmp, ds, "outside-podman", podman.podman_image()).assert_served(FILES)


def test_outside_apptainer(image, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    outside_job(image, shim_dir, short_tmp, ds, "outside-apptainer", image.rootfs).assert_served(FILES)


def test_outside_pyxis_a_standing_daemon_and_monarch_run_in_the_container(image, shim_dir, dataset, short_tmp):
    """The batch script's lines without Slurm: `monarch serve` for `monarch serve --slurm`, the job's
    identity in MONARCH_JOB_ID, MONARCH_CLUSTER=1 where Slurm's node index and a cluster
    configuration would say it: the launcher in the container waits for the host's daemon."""
    ds = dataset(files=FILES, size="8KiB")
    block = doc_block("outside-pyxis")
    assert "monarch serve --slurm -c job.yaml &" in block
    report = os.path.join(short_tmp, "report.json")
    job_config(short_tmp, ds.root, report, shared_bases=True)
    script = substitute(block.replace("monarch serve --slurm", "monarch serve"), root=ds.root,
                        train=reader_line(ds.root, ds.manifest), image=image.rootfs)
    job = Runner(image, short_tmp, shim_dir).run(script, report, MONARCH_CLUSTER="1")
    # report.json is the host daemon's, written at its stop (after the container's run wrote its
    # part there): its counts are the container's readers'
    job.assert_served(FILES)


@pytest.mark.parametrize("runtime", ["apptainer", "podman"])
def test_a_job_in_a_private_pid_namespace_keeps_its_copies_when_a_job_starts_on_the_host(runtime, image, shim_dir,
                                                                                         dataset, short_tmp, request):
    """All inside a container of its own PID namespace that shares the host's /dev/shm (Apptainer's
    --pid, Podman's default with /dev/shm bound), staging private to the job; between its two
    epochs a second job runs on the host with the same tier bases. The first job's copies are
    live (its daemon's lock is held): they stay, and its second epoch is served from them."""
    if runtime == "podman":
        request.getfixturevalue("podman")
    ds = dataset(files=FILES, size="8KiB")
    report = os.path.join(short_tmp, "report.json")
    job_config(short_tmp, ds.root, report, shared_bases=True)
    ready, go = os.path.join(short_tmp, "ready"), os.path.join(short_tmp, "go")
    epoch = reader_line(ds.root, ds.manifest, epochs=1)
    cmd = f"sh -c '{epoch} && touch {ready} && while [ ! -e {go} ]; do sleep 0.05; done && {epoch}'"
    if runtime == "apptainer":
        line = f"apptainer exec --pid --bind {short_tmp} {image.rootfs} monarch run -c job.yaml -- {cmd}"
    else:
        # the host's name (as with --network=host): a maker's pid is judged on its host only
        line = (f"podman run --rm --uts=host -v /dev/shm:/dev/shm -v {short_tmp}:{short_tmp} -w {short_tmp} "
                f"{image.podman_image()} monarch run -c job.yaml -- {cmd}")
    runner = Runner(image, short_tmp, shim_dir)
    first = subprocess.Popen(["bash", "-c", line], cwd=short_tmp, env=runner.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(ready), first.communicate(timeout=60)
        second = runner.run(f"monarch run -c job.yaml --report {short_tmp}/second.json -- "
                            f"{reader_line(ds.root, ds.manifest, epochs=1)}", None)
        assert second.rc == 0, second.err
        open(go, "w").close()
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    Job(first.returncode, out, err, load(report) if os.path.exists(report) else None).assert_served(FILES)
