#!/usr/bin/env bash
# Run a command in an unpacked image the way Apptainer (Singularity) and Enroot run one, with no
# runtime installed: a private mount namespace, the image's root filesystem under a throw-away
# overlay (the image itself is never written), the host's /proc, /sys and /dev (so the host's
# /dev/shm) bound, bind mounts, then chroot. The caller's uid, environment and PID namespace are
# kept, as both runtimes keep them. Needs root (unshare, mount, chroot).
#
#   chroot_run.sh [--bind SRC[:DST[:ro]][,SRC...]]... [--tmp host|private] [--pid]
#                 [--shm-size SIZE] [--user UID:GID] ROOTFS CMD [ARGS...]
#
#   --bind       as `apptainer exec --bind` (and Pyxis' --container-mounts, whose SRC:DST it takes):
#                SRC bound at DST (default: SRC), read-only with :ro; repeat or separate by commas
#   --tmp        host: the host's /tmp bound (Apptainer's default); private: a tmpfs of its own
#                (Enroot's default)
#   --pid        a private PID namespace (apptainer exec --pid, podman's default)
#   --shm-size   a private /dev/shm of that size (as podman --shm-size) instead of the host's
#   --user       run CMD as UID:GID (a container user other than the caller)
#
# PATH inside is the image's (its /etc/environment), as Apptainer and Enroot set it; the working
# directory is the caller's where the image has it, else /. Exit status: CMD's.
set -euo pipefail

binds=() tmp=host pid=0 shm="" user=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bind) IFS=, read -r -a more <<< "$2"; binds+=("${more[@]}"); shift 2 ;;
    --bind=*) IFS=, read -r -a more <<< "${1#--bind=}"; binds+=("${more[@]}"); shift ;;
    --tmp) tmp="$2"; shift 2 ;;
    --pid) pid=1; shift ;;
    --shm-size) shm="$2"; shift 2 ;;
    --user) user="$2"; shift 2 ;;
    --) shift; break ;;
    -*) echo "chroot_run.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "usage: chroot_run.sh [options] ROOTFS CMD [ARGS...]" >&2; exit 2; }
rootfs="$(cd "$1" && pwd)"; shift
[ -x "$rootfs/bin/sh" ] || { echo "chroot_run.sh: $rootfs is not a root filesystem" >&2; exit 2; }
case "$tmp" in host|private) ;; *) echo "chroot_run.sh: --tmp host|private, not $tmp" >&2; exit 2 ;; esac

# the namespace's scratch (overlay upper, the new root) lives on a tmpfs mounted over an empty
# folder beside the image; the folder itself is removed when the command ends
scratch="$(mktemp -d "$(dirname "$rootfs")/run/ns.XXXXXX" 2>/dev/null || mktemp -d /var/tmp/chroot-run.XXXXXX)"
trap 'rmdir "$scratch" 2>/dev/null || true' EXIT

setup() {
  # in the new namespaces: every mount here is private to them; the shim stays out of mount and chroot
  set -euo pipefail
  mount -t tmpfs -o mode=0700 tmpfs "$scratch"
  mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
  mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$scratch/upper,workdir=$scratch/work" "$scratch/root"
  local new="$scratch/root" spec src dst opt
  if [ "$pid" = 1 ]; then mount -t proc proc "$new/proc"; else mount --rbind /proc "$new/proc"; fi
  mount --rbind /sys "$new/sys"
  mount --rbind /dev "$new/dev"
  if [ -n "$shm" ]; then mount -t tmpfs -o "size=$shm,mode=1777,nosuid,nodev" shm "$new/dev/shm"; fi
  if [ "$tmp" = host ]; then mount --rbind /tmp "$new/tmp"; else mount -t tmpfs -o mode=1777 tmpfs "$new/tmp"; fi
  for spec in "${binds[@]}"; do
    [ -n "$spec" ] || continue
    IFS=: read -r src dst opt <<< "$spec"
    dst="${dst:-$src}"
    if [ -d "$src" ]; then mkdir -p "$new$dst"; else mkdir -p "$(dirname "$new$dst")"; touch "$new$dst"; fi
    mount --rbind "$src" "$new$dst"
    if [ "$opt" = ro ]; then mount -o remount,bind,ro "$new$dst"; fi
  done
  local path
  path="$(sed -n 's/^PATH="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$new/etc/environment" | tail -1)"
  export PATH="${path:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
  local cwd=/
  [ -d "$new$PWD" ] && cwd="$PWD"
  local as=()
  [ -z "$user" ] || as=(--userspec="$user")
  local run=(chroot "${as[@]}" "$new" /bin/sh -c 'cd "$0" && exec "$@"' "$cwd" "$@")
  # in a PID namespace of its own this shell stays its init (it reaps orphans), as a runtime's does
  if [ "$pid" = 1 ]; then LD_PRELOAD="$saved_preload" "${run[@]}"; exit $?; fi
  LD_PRELOAD="$saved_preload" exec "${run[@]}"
}

# mount(8), unshare(1) and chroot(8) themselves run without the shim; CMD gets LD_PRELOAD back
export saved_preload="${LD_PRELOAD:-}"
ns=(--mount --propagation private)
[ "$pid" = 0 ] || ns+=(--pid --fork)
export scratch rootfs tmp pid shm user
export -f setup
bindlist="$(printf '%s\n' "${binds[@]+"${binds[@]}"}")"
export bindlist
set +e
LD_PRELOAD= unshare "${ns[@]}" bash -c 'mapfile -t binds <<< "$bindlist"; setup "$@"' chroot_run "$@"
status=$?
exit $status
