"""Each way a container keeps its application from Monarch, made by changing one thing in a
documented line of docs/containers.md (daemon outside): the job still exits 0 and reads no wrong
byte, and the fallback is said once on stderr (a line starting `monarch: `) and in the report's
`fallbacks` with its reason and fix."""

import os
import shutil

import pytest

from containerjobs import (DATASET, OTHER_UID, Runner, doc_block, job_config, open_to_all, reader_line,
                           substitute)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FILES = 300
PODMAN_ENV = " --env LD_PRELOAD --env 'MONARCH_*'"
SHM_BIND = " -v /dev/shm:/dev/shm"
TMP_BIND = ' -v "${TMPDIR:-/tmp}:${TMPDIR:-/tmp}"'


def edited(block: str, old: str, new: str) -> str:
    assert old in block, (old, block)
    return block.replace(old, new)


def run_case(image, shim_dir, folder, ds, block, image_name, manifest=None, root=None):
    """``block`` run with the job's dataset at ``root`` on the host (default: where it is) and the
    reader checking ``manifest`` (default: the dataset's)."""
    report = os.path.join(folder, "report.json")
    root = root or ds.root
    job_config(folder, root, report, shared_bases=True)
    script = substitute(block, root=root, train=reader_line(root, manifest or ds.manifest), image=image_name)
    return Runner(image, folder, shim_dir).run(script, report)


@pytest.mark.parametrize("runtime", ["podman", "apptainer"])
def test_a_root_that_names_other_files_inside_is_read_directly(runtime, image, shim_dir, dataset, short_tmp, request):
    """On the host the root holds other files at the same names (a node's own /data); the
    container's root is bound from the real dataset. The daemon's copies of the host's files are
    never served to it."""
    host = dataset(files=FILES, size="8KiB", name="data", seed=1)
    real = dataset(files=FILES, size="8KiB", name="real", seed=2)
    assert set(host.files) == set(real.files) and host.files != real.files
    if runtime == "podman":
        request.getfixturevalue("podman")
        block = edited(doc_block("outside-podman"), f"-v {DATASET}:{DATASET}:ro", f"-v {real.root}:{DATASET}:ro")
        name = image.podman_image()
    else:
        block = edited(doc_block("outside-apptainer"), f"--bind {DATASET},", f"--bind {real.root}:{DATASET},")
        name = image.rootfs
    job = run_case(image, shim_dir, short_tmp, host, block, name, manifest=real.manifest)
    job.assert_fell_back("root-elsewhere")
    assert host.root in job.report["fallbacks"][0]["detail"]


def test_a_private_dev_shm_hides_the_ram_tier(podman, shim_dir, dataset, short_tmp):
    """The RAM tier's folder is not there (Podman's own /dev/shm), the SSD tier's is (bound with
    TMPDIR): the opens read the PFS without asking the daemon each time for a copy it staged
    where the application cannot see it."""
    ds = dataset(files=FILES, size="8KiB")
    block = edited(doc_block("outside-podman"), SHM_BIND, "")
    job = run_case(podman, shim_dir, short_tmp, ds, block, podman.podman_image())
    job.assert_fell_back("tiers-unseen")
    (node,) = job.report["nodes"]
    assert node["resolves"].get("already_staged", 0) == 0, node["resolves"]  # opens the daemon answered with a copy


def test_a_run_folder_not_bound(podman, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    seen = os.path.join(short_tmp, "manifest")  # the reader's manifest, bound apart
    os.mkdir(seen)
    manifest = shutil.copy(ds.manifest, seen)
    block = edited(doc_block("outside-podman"), TMP_BIND, f" -v {seen}:{seen}:ro")
    run_case(podman, shim_dir, short_tmp, ds, block, podman.podman_image(),
             manifest=manifest).assert_fell_back("daemon-unreachable", reported=("shim-idle", "no-shim"))


def test_a_container_user_of_another_uid(podman, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    open_to_all(short_tmp)  # the dataset and its manifest are readable by that user, as on a PFS
    block = edited(doc_block("outside-podman"), "podman run --rm", f"podman run --rm --user {OTHER_UID}:{OTHER_UID}")
    run_case(podman, shim_dir, short_tmp, ds, block, podman.podman_image()).assert_fell_back(
        "uid-mismatch", reported=("shim-idle", "no-shim"))


def test_podman_not_passed_the_environment(podman, shim_dir, dataset, short_tmp):
    """Podman's own processes ran with the shim, the readers without it."""
    ds = dataset(files=FILES, size="8KiB")
    block = edited(doc_block("outside-podman"), PODMAN_ENV, "")
    run_case(podman, shim_dir, short_tmp, ds, block, podman.podman_image()).assert_fell_back("shim-idle")


def test_ld_preload_dropped_before_the_runtime(podman, shim_dir, dataset, short_tmp):
    ds = dataset(files=FILES, size="8KiB")
    block = edited(doc_block("outside-podman"), "-- podman run", "-- env -u LD_PRELOAD podman run")
    run_case(podman, shim_dir, short_tmp, ds, block, podman.podman_image()).assert_fell_back("no-shim")
