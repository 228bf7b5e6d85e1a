#!/usr/bin/env bash
# Install everything Monarch, its tests and benchmarks need on a fresh Debian machine:
# a C compiler and FUSE 3 from Debian, then Monarch itself (which compiles the shim)
# with its MPI, test and benchmark extras from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v objdump >/dev/null 2>&1 || need+=(binutils)  # the glibc 2.17 import check reads the shim with it
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
[ -e /usr/lib/x86_64-linux-gnu/libfuse3.so.3 ] || ls /usr/lib/*/libfuse3.so.3 >/dev/null 2>&1 || need+=(libfuse3-3)
# the shim decodes compressed copies with the system's libzstd (dlopen; without it the daemon
# decodes them): the tests of that path need it
ls /usr/lib/*/libzstd.so.1 /lib/*/libzstd.so.1 >/dev/null 2>&1 || need+=(libzstd1)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check ".[mpi,test,bench]"
# under pyenv, new console scripts (monarch, mpiexec) need their shims made
if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
echo "install: Monarch $(python3 -c 'import monarch; print(monarch.__version__)') and its dependencies are installed"
