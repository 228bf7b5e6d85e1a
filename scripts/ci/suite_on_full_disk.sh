#!/usr/bin/env bash
# The test suite on a nearly full disk: its result must not depend on how full the host's disk is.
#
#   sudo scripts/ci/suite_on_full_disk.sh [PYTEST ARGS...]     (default: the whole suite)
#
# Runs `python3 -m pytest ARGS` in a private mount namespace whose /tmp is a filesystem of its own
# (ext4 in a sparse file under /var/tmp, loop-mounted), filled to leave FREE_PCT percent of it free:
# less than the shipped filesystem_reserve (25%), so a tier a test puts on /tmp without setting its
# reserve takes nothing there. The host's /tmp is not touched; the image takes of the host's disk only
# what the tests write (the filler is fallocated: no blocks written), and is removed at the end.
#   SIZE_GIB  the filesystem's size (default 20)
#   FREE_PCT  the share of it left free (default 20): 4 GiB of 20, above what tests/conftest.py asks
# Needs root (unshare -m, mount -o loop), e2fsprogs and util-linux. Two tests cannot run inside a
# mount namespace of their own, whatever the disk, and are left out: rootless Podman's (its user's
# running pause process keeps the host's /tmp) and bench_cluster_blocks' (it binds mount namespaces
# of its own under /tmp, which fails with EINVAL inside this one).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_GIB="${SIZE_GIB:-20}"
FREE_PCT="${FREE_PCT:-20}"
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: needs root (a private mount namespace and a loop mount)" >&2
  exit 2
fi
image="$(mktemp /var/tmp/monarch-full-disk.XXXXXX.img)"
trap 'rm -f "$image"' EXIT
truncate -s "${SIZE_GIB}G" "$image"
mkfs.ext4 -q -F -m 0 "$image"
rc=0
unshare -m --propagation private bash -c '
  set -euo pipefail
  image=$1 free_pct=$2
  shift 2
  mount -o loop "$image" /tmp
  chmod 1777 /tmp
  size=$(df -B1 --output=size /tmp | tail -1)
  avail=$(df -B1 --output=avail /tmp | tail -1)
  fallocate -l $((avail - size * free_pct / 100)) /tmp/.filler
  export TMPDIR=/tmp
  echo "suite_on_full_disk: /tmp: $(df -h --output=size,used,avail,pcent /tmp | tail -1 | xargs)"
  exec python3 -m pytest "$@" \
    --deselect tests/containers/test_inside.py::test_inside_podman_rootless \
    --deselect "tests/integration/test_bench_smoke.py::test_bench_script_runs_and_prints_its_figures[bench_cluster_blocks]"
  ' bash "$image" "$FREE_PCT" "$@" || rc=$?
exit "$rc"
