"""Monarch inside the container (docs/containers.md "Inside the container"): `monarch run` in the
image, its daemon and tiers in the container; each documented line run as written (Podman as
root and rootless, Apptainer's and Pyxis' through the chroot stand-ins), and a 64 MiB /dev/shm
with a dataset three times its size. Every job: exit 0, every digest right, every open from a
tier, the PFS read once."""

import os
import shutil

import pytest

from containerjobs import ROOTLESS_USER, Runner, doc_block, give_to, job_config, reader_line, substitute

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FILES = 300


def inside_job(image, shim_dir, folder, ds, block, image_name, user="root"):
    report = os.path.join(folder, "report.json")
    job_config(folder, ds.root, report, shared_bases=False)
    script = substitute(doc_block(block), root=ds.root, train=reader_line(ds.root, ds.manifest), image=image_name)
    if user != "root":
        os.chmod(folder, 0o755)
        give_to(folder, user)
    return Runner(image, folder, shim_dir).run(script, report, user=user)


def test_inside_podman(podman, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    job = inside_job(podman, shim_dir, short_tmp, ds, "inside-podman", podman.podman_image())
    job.assert_served(FILES)


def test_inside_podman_rootless(podman_rootless, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    job = inside_job(podman_rootless, shim_dir, short_tmp, ds, "inside-podman",
                     podman_rootless.podman_image(ROOTLESS_USER), user=ROOTLESS_USER)
    job.assert_served(FILES)


def test_inside_apptainer(image, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    job = inside_job(image, shim_dir, short_tmp, ds, "inside-apptainer", image.rootfs)
    job.assert_served(FILES)


def test_inside_pyxis(image, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    job = inside_job(image, shim_dir, short_tmp, ds, "inside-pyxis", image.rootfs)
    job.assert_served(FILES)


def test_inside_podman_with_a_64_mib_dev_shm_and_a_200_mib_dataset(podman, shim_dir, dataset, short_tmp):
    """The reader hands every file over /dev/shm as a DataLoader's workers hand their batches
    (shm_reader.py: a few MiB at once, and its pools' semaphores). The RAM tier stops at its
    filesystem's reserve, so the reader finds room (no ENOSPC), and the rest of the dataset is
    served from the next tier."""
    files = 200
    ds = dataset(files=files, size="1MiB")
    report = os.path.join(short_tmp, "report.json")
    job_config(short_tmp, ds.root, report, shared_bases=False)
    shutil.copy(os.path.join(os.path.dirname(__file__), "shm_reader.py"), short_tmp)
    block = doc_block("inside-podman")
    assert "--shm-size=16g" in block
    script = substitute(block.replace("--shm-size=16g", "--shm-size=64m"), root=ds.root,
                        train=f"python shm_reader.py {ds.root} --manifest {ds.manifest} --epochs 2 --workers 2",
                        image=podman.podman_image())
    job = Runner(podman, short_tmp, shim_dir).run(script, report)
    job.assert_served(files)
    (node,) = job.report["nodes"]
    ram = next(t for t in node["tiers"] if t["name"] == "ram")
    assert ram["filesystem_reserve"] >= 16 << 20 and ram["refused"].get("filesystem_reserve", 0) > 0, ram
    assert job.report["opened_from"]["ssd"]["opens"] > 0
