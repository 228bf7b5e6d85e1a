"""An emulated slow parallel filesystem: a FUSE view of a directory, read-only unless asked.

``monarch demo`` puts its dataset behind it (the point of Monarch shows only where opens are
slow); the tests and benchmarks measure a job's PFS traffic with it. It needs FUSE 3 (libfuse3,
``fusermount3``, /dev/fuse) and mfusepy (``pip install 'monarch-staging[demo]'``), imported only
where a mount is made: :func:`fuse_unavailable_reason` says why it cannot work here.

It adds a latency to every open (the metadata server round trip that dominates a
PFS with many small files), optionally to every read call, and caps the aggregate
bandwidth. The kernel caches nothing: files are opened with ``direct_io`` (no page
cache, every read reaches the filesystem) and entries and attributes expire at once
(every ``open`` reaches it too). With ``--page-cache`` the kernel keeps what a reader read
until the file is opened again, as a real PFS client does, and files can be mapped (the
large-file benchmark's ``np.memmap`` readers; a direct-io file refuses a shared mapping).
It counts opens, reads and bytes, in total and per
file, into a JSON file of its own, so a benchmark or a test measures the PFS traffic
of a job independently of what Monarch believes it did.

With ``--writable`` it takes writes too (create, write, truncate, fsync, rename, unlink, mkdir,
rmdir, chmod, chown, utimens, link, symlink), each done on SRC as the user running it, with a
latency per write call and an aggregate write bandwidth of their own. It then also counts the
writes and their bytes (per file too), the namespace operations, and keeps the last ones in
order (``ops``: "create a.tmp", "rename a.tmp a", ...), so a test sees in which order files
appeared under their final names.

Run it as a process::

    python -m monarch.tools.slowpfs SRC MOUNTPOINT --counters FILE \\
        [--open-latency-ms 2] [--read-latency-ms 0] [--bandwidth MBps] [--page-cache]
        [--writable [--write-latency-ms 0] [--write-bandwidth MBps]]

With ``--generate N`` it serves N files made by formula instead of SRC, nothing stored, read-only,
with totals counted but no ``files`` (:mod:`monarch.tools.slowpfs_generated`)::

    python -m monarch.tools.slowpfs --generate N [--per-dir 1000] [--file-size 1KiB-4KiB] [--seed 0] \\
        MOUNTPOINT --counters FILE [--open-latency-ms 2] [--lookup-latency-ms 0] ...

or from Python with the :class:`SlowPFS` context manager, which starts that process,
waits for the mount and always unmounts it.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monarch.errors import ConfigError, MonarchError
from monarch.tools import slowpfs_generated
# the books (re-exported: their readers import them from here)
from monarch.tools.slowpfs_counters import (COUNTER_KEYS, FLUSH_INTERVAL_S, METADATA_KEYS,  # noqa: F401
                                            OPS_KEPT, WRITE_IDLE_CREDIT_S, Counters, Throttle)
from monarch.tools.slowpfs_generated import Generated

MOUNT_TIMEOUT_S = 20.0
MAX_THREADS = 256  # requests the emulated PFS serves at once (libfuse's default is 10)


class SlowPFSError(MonarchError):
    """The emulated PFS could not be mounted or unmounted."""


@dataclass(frozen=True)
class Latency:
    """What the emulated PFS costs: seconds per open and per read call, bytes/s (0 = unlimited)."""

    open_s: float = 0.002
    read_s: float = 0.0
    bandwidth: float = 0.0
    lookup_s: float = 0.0
    page_cache: bool = False  # reads go through the kernel's page cache (mmap works); dropped at each open
    write_s: float = 0.0  # per write call (writable mounts)
    write_bandwidth: float = 0.0  # bytes/s of every write together, apart from the reads' (0 = unlimited)


# --------------------------------------------------------------------------- the filesystem


def _operations_class(writable: bool = False, generated: bool = False):
    """Build the FUSE operations class (mfusepy is imported only where FUSE is used): read-only, or
    with writes (``slowpfs_writes``) when ``writable``, or serving a generated tree (``slowpfs_generated``)
    when ``generated``; a read-only mount registers no write callback."""
    import mfusepy

    class SlowOperations(mfusepy.Operations):
        use_ns = True
        writable = False

        def __init__(self, src: str | Generated, latency: Latency, counters: Counters) -> None:
            self.src = src if isinstance(src, Generated) else os.path.realpath(src)
            self.latency = latency
            self.counters = counters
            self.throttle = Throttle(latency.bandwidth)
            self.write_throttle = Throttle(latency.write_bandwidth, WRITE_IDLE_CREDIT_S)

        def _real(self, path: str) -> str:
            return os.path.join(self.src, path.lstrip("/"))

        def init_with_config(self, conn_info, config_3) -> None:
            if config_3 is not None:
                # Nothing cached by the kernel: every lookup, open and read reaches us.
                config_3.entry_timeout = 0.0
                config_3.attr_timeout = 0.0
                config_3.negative_timeout = 0.0
                config_3.direct_io = 0 if self.latency.page_cache else 1
                config_3.kernel_cache = 0
                config_3.auto_cache = 0
                # an unlink or a rename over a file still open acts on SRC, as it would there, rather
                # than libfuse hiding it as .fuse_hidden* until its last close
                config_3.hard_remove = 1 if self.writable else 0

        def _metadata(self, key: str) -> None:
            """A metadata server's round trip (``METADATA_KEYS``): counted, and the lookup latency."""
            self.counters.add(key)
            if self.latency.lookup_s:
                time.sleep(self.latency.lookup_s)

        def getattr(self, path: str, fh=None) -> dict[str, Any]:
            self._metadata("lookups")
            # None: a file unlinked while open (a writable mount), asked by its descriptor
            st = os.fstat(fh.fh) if path is None and fh is not None else os.lstat(self._real(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino",
                    "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blocks", "st_blksize")
            attrs = {k: getattr(st, k) for k in keys}
            # mfusepy (use_ns) expects the times under their plain names, in nanoseconds.
            for k in ("st_atime", "st_mtime", "st_ctime"):
                attrs[k] = attrs.pop(k + "_ns")
            if not self.writable:
                attrs["st_mode"] &= ~0o222  # read-only, as far as anyone asks
            return attrs

        def readlink(self, path: str) -> str:
            return os.readlink(self._real(path))

        def readdir(self, path: str, fh: int):
            self._metadata("readdirs")
            return [".", "..", *os.listdir(self._real(path))]

        def opendir(self, path: str) -> int:
            self.counters.add("opendirs")
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            self.counters.add("statfs")
            sv = os.statvfs(self._real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                    "f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(sv, k) for k in keys}

        def access(self, path: str, amode: int) -> int:
            self._metadata("accesses")
            if amode & os.W_OK and not self.writable:
                raise mfusepy.FuseOSError(errno.EROFS)
            if not os.access(self._real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def open(self, path: str, fi) -> int:
            if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            self._open(path, fi, os.O_RDONLY)
            return 0

        def _open(self, path: str, fi, flags: int, mode: int = 0o666) -> None:
            self.counters.opening(1)
            try:
                if self.latency.open_s:
                    time.sleep(self.latency.open_s)
                fi.fh = self._open_file(path, flags, mode)
            finally:
                self.counters.opening(-1)
            fi.direct_io = 0 if self.latency.page_cache else 1  # no page cache: every read() reaches read()
            fi.keep_cache = 0  # with one, what an earlier open cached is dropped
            self.counters.add("opens", path.lstrip("/"))

        def _open_file(self, path: str, flags: int, mode: int) -> int:
            return os.open(self._real(path), flags, mode)

        def _pread(self, fh: int, size: int, offset: int) -> bytes:
            return os.pread(fh, size, offset)

        def read(self, path: str, size: int, offset: int, fi) -> bytes:
            if self.latency.read_s:
                time.sleep(self.latency.read_s)
            data = self._pread(fi.fh, size, offset)
            self.throttle.wait(len(data))
            self.counters.add("reads", path and path.lstrip("/"), nbytes=len(data))  # None: unlinked while open
            return data

        def release(self, path: str, fi) -> int:
            os.close(fi.fh)
            return 0

    if generated:
        return slowpfs_generated.generated_operations(SlowOperations)
    if not writable:
        return SlowOperations
    from monarch.tools.slowpfs_writes import writable_operations
    return writable_operations(SlowOperations)


def mount(src: str | Generated, mountpoint: str, counters_path: str, latency: Latency, debug: bool = False,
          max_threads: int = MAX_THREADS, writable: bool = False) -> None:
    """Mount ``src``, a directory or a generated tree, at ``mountpoint`` (read-only unless ``writable``);
    serve it until unmounted or signalled."""
    generated = isinstance(src, Generated)
    if generated and writable:
        raise SlowPFSError("slowpfs: a generated tree is read-only (--writable needs SRC)")
    if not generated and not os.path.isdir(src):
        raise SlowPFSError(f"slowpfs: source {src!r} is not a directory")
    from monarch.tools.slowpfs_writes import fuse_class
    if writable:
        os.umask(0)  # the kernel applied the caller's umask to a create's or mkdir's mode: not twice
    counters = Counters(counters_path, per_file=not generated)  # millions of files: no entry each
    counters.start()
    ops = _operations_class(writable, generated)(src, latency, counters)
    fsname = f"slowpfs:generated-{src.files}" if generated else f"slowpfs:{os.path.realpath(src)}"
    try:
        # libfuse installs its own SIGTERM/SIGINT/SIGHUP handlers (exit the loop, unmount).
        # libfuse serves requests on at most max_threads threads (default 10): a PFS serves
        # hundreds of clients at once, and a read-ahead keeps that many opens in flight.
        fuse_class()(ops, mountpoint, raw_fi=True, foreground=True, nothreads=False, debug=debug,
                     ro=not writable, fsname=fsname, subtype="slowpfs",
                     direct_io=not latency.page_cache, max_threads=max_threads, max_idle_threads=max_threads)
    except RuntimeError as exc:
        # libfuse's fuse_main returns 8 whenever its loop ended by a signal (SIGTERM, SIGINT):
        # that is the normal way to stop it, the mount is already gone.
        if str(exc) != "8":
            raise
    finally:
        counters.stop()


# --------------------------------------------------------------------------- client side


def fuse_unavailable_reason(probe: bool = False) -> str | None:
    """Why a FUSE mount cannot work here (a reason to skip a test), or None if it can.

    ``probe=True`` also mounts an empty directory once (cached per process): /dev/fuse
    can exist where mounting is still refused (a container without CAP_SYS_ADMIN)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None and os.geteuid() != 0:
        return "fusermount3 not found (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return (f"mfusepy or libfuse3 not usable: {exc} (pip install 'monarch-staging[demo]' or mfusepy; "
                "apt-get install fuse3)")
    return _probe_mount() if probe else None


@functools.lru_cache(maxsize=1)
def _probe_mount() -> str | None:
    with tempfile.TemporaryDirectory(prefix="slowpfs-probe-") as tmp:
        src = os.path.join(tmp, "src")
        os.mkdir(src)
        try:
            with SlowPFS(src, os.path.join(tmp, "mnt"), os.path.join(tmp, "c.json"), open_latency_ms=0,
                         timeout=10):
                return None
        except SlowPFSError as exc:
            return f"a test mount failed: {exc}"


def is_mounted(mountpoint: str) -> bool:
    """True if ``mountpoint`` is in the mount table, even when its FUSE process is dead
    (``os.path.ismount`` says False then: stat fails with ENOTCONN)."""
    path = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 1 and _unescape_mount(fields[1]) == path:
                    return True
    except OSError:
        return os.path.ismount(path)
    return False


def _unescape_mount(field: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def unmount(mountpoint: str) -> None:
    """Unmount ``mountpoint`` if mounted: ``fusermount3 -u``, then lazily (``-uz``)."""
    if not is_mounted(mountpoint):
        return
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    attempts = [[tool, "-u", mountpoint], [tool, "-uz", mountpoint]] if tool else []
    attempts += [["umount", mountpoint], ["umount", "-l", mountpoint]]
    for cmd in attempts:
        subprocess.run(cmd, capture_output=True, timeout=10)
        if not is_mounted(mountpoint):
            return
    raise SlowPFSError(f"slowpfs: could not unmount {mountpoint}; try: fusermount3 -uz {mountpoint}")


class SlowPFS:
    """Run the emulated PFS as a subprocess for the life of a ``with`` block.

    ``with SlowPFS(src, mnt, counters_json, open_latency_ms=2) as pfs:`` mounts ``src`` at
    ``mnt``; ``pfs.counters()`` reads the traffic so far, ``pfs.reset_counters()`` starts
    a new measurement. On exit, even by an exception, the process is stopped and the mount
    removed. ``writable=True`` takes writes (``write_latency_ms``, ``write_bandwidth_mbps``). ``src`` may
    be a :class:`Generated` tree instead of a directory: ``SlowPFS(Generated(files=10**6), mnt)``.
    """

    def __init__(self, src: str | os.PathLike | Generated, mountpoint: str | os.PathLike,
                 counters: str | os.PathLike | None = None, *, open_latency_ms: float = 2.0,
                 read_latency_ms: float = 0.0, bandwidth_mbps: float = 0.0,
                 lookup_latency_ms: float = 0.0, page_cache: bool = False, writable: bool = False,
                 write_latency_ms: float = 0.0, write_bandwidth_mbps: float = 0.0,
                 timeout: float = MOUNT_TIMEOUT_S) -> None:
        if writable and isinstance(src, Generated):
            raise SlowPFSError("slowpfs: a generated tree is read-only: writable=True needs a directory")
        self.src = src if isinstance(src, Generated) else os.fspath(src)
        self.mountpoint = os.path.abspath(os.fspath(mountpoint))
        self._own_counters = counters is None
        self.counters_path = os.fspath(counters) if counters is not None else os.path.join(
            tempfile.mkdtemp(prefix="slowpfs-"), "counters.json")
        self.options = dict(open_latency_ms=open_latency_ms, read_latency_ms=read_latency_ms,
                            bandwidth=bandwidth_mbps, lookup_latency_ms=lookup_latency_ms, page_cache=page_cache)
        self.writable = writable
        self.write_options = dict(write_latency_ms=write_latency_ms, write_bandwidth=write_bandwidth_mbps)
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self._stderr = None
        self._baseline: dict[str, Any] | None = None

    def command(self) -> list[str]:
        o = self.options
        from monarch.launch.service import python_command  # this package, not a monarch/ of the cwd
        source = self.src.argv() if isinstance(self.src, Generated) else [self.src]
        return [*python_command("monarch.tools.slowpfs"), *source, self.mountpoint,
                "--counters", self.counters_path,
                "--open-latency-ms", str(o["open_latency_ms"]),
                "--read-latency-ms", str(o["read_latency_ms"]),
                "--lookup-latency-ms", str(o["lookup_latency_ms"]),
                "--bandwidth", str(o["bandwidth"])] + (["--page-cache"] if o["page_cache"] else []) + (
            ["--writable", "--write-latency-ms", str(self.write_options["write_latency_ms"]),
             "--write-bandwidth", str(self.write_options["write_bandwidth"])] if self.writable else [])

    def start(self) -> SlowPFS:
        reason = fuse_unavailable_reason()
        if reason:
            raise SlowPFSError(f"slowpfs: FUSE is not usable here: {reason}")
        os.makedirs(self.mountpoint, exist_ok=True)
        if is_mounted(self.mountpoint):
            raise SlowPFSError(f"slowpfs: {self.mountpoint} is already a mount point")
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        here = Path(__file__).resolve()  # <dir>/monarch/tools/slowpfs.py: this very monarch, installed or a checkout
        paths = [str(here.parents[2])] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.pop("LD_PRELOAD", None)  # never serve the PFS through a preloaded shim
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=self._stderr,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None:
                err = self._read_stderr()
                self.stop()
                raise SlowPFSError(f"slowpfs: mounting {self.src} at {self.mountpoint} failed "
                                   f"(exit {self.proc.returncode}):\n{err}")
            if time.monotonic() > deadline:
                err = self._read_stderr()
                self.stop()
                raise SlowPFSError(f"slowpfs: {self.mountpoint} not mounted after {self.timeout:.0f} s:\n{err}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop the process and remove the mount; safe to call twice."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    unmount(self.mountpoint)
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait(timeout=5)
        finally:
            unmount(self.mountpoint)
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None

    def _read_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def raw_counters(self, settle: float = 3 * FLUSH_INTERVAL_S) -> dict[str, Any]:
        """The emulator's counters file as written (waits ``settle`` s for the last flush)."""
        if settle:
            time.sleep(settle)
        with open(self.counters_path) as f:
            return json.load(f)

    def counters(self, settle: float = 3 * FLUSH_INTERVAL_S) -> dict[str, Any]:
        """Traffic since the start (or the last :meth:`reset_counters`): totals, ``files``, and
        ``ops``, the namespace operations in order (the last ``OPS_KEPT`` at most)."""
        now = self.raw_counters(settle)
        base = self._baseline
        if base is None:
            return now
        out: dict[str, Any] = {k: now.get(k, 0) - base.get(k, 0) for k in COUNTER_KEYS}
        out["opening_peak"] = now.get("opening_peak", 0)  # a gauge since the start, not a count
        out["ops_total"] = now.get("ops_total", 0) - base.get("ops_total", 0)
        out["ops"] = now.get("ops", [])[-out["ops_total"]:] if out["ops_total"] else []
        files = {}
        for path, per in now["files"].items():
            old = base["files"].get(path, {})
            diff = {k: v - old.get(k, 0) for k, v in per.items()}
            if any(diff.values()):
                files[path] = diff
        out["files"] = files
        return out

    def reset_counters(self, settle: float = 3 * FLUSH_INTERVAL_S) -> None:
        """Start a new measurement: later :meth:`counters` count from now."""
        self._baseline = self.raw_counters(settle)

    def __enter__(self) -> SlowPFS:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monarch.tools.slowpfs", description=__doc__.split("\n\n")[0],
                                usage="%(prog)s {SRC | --generate N} MOUNTPOINT --counters FILE [options]")
    # with --generate the one positional is the mount point (intermixed: SRC and MOUNTPOINT apart still work)
    p.add_argument("src", metavar="SRC", help="directory to serve (read-only unless --writable); none with --generate")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?")
    p.add_argument("--counters", required=True, help="JSON file the counters are written to")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="added to every open (default 2)")
    p.add_argument("--read-latency-ms", type=float, default=0.0, help="added to every read call (default 0)")
    p.add_argument("--lookup-latency-ms", type=float, default=0.0,
                   help="added to every metadata operation: getattr, readdir, access (default 0)")
    p.add_argument("--bandwidth", type=float, default=0.0, metavar="MBps",
                   help="aggregate read bandwidth cap in MB/s (10^6 bytes/s; 0 = unlimited)")
    p.add_argument("--max-threads", type=int, default=MAX_THREADS,
                   help=f"requests served at once (libfuse worker threads; default {MAX_THREADS})")
    p.add_argument("--page-cache", action="store_true",
                   help="read through the kernel's page cache (dropped at each open), so files can be mapped")
    p.add_argument("--writable", action="store_true",
                   help="take writes (create, write, truncate, fsync, rename, unlink, mkdir, ...), done on SRC")
    p.add_argument("--write-latency-ms", type=float, default=0.0, help="added to every write call (default 0)")
    p.add_argument("--write-bandwidth", type=float, default=0.0, metavar="MBps",
                   help="aggregate write bandwidth cap in MB/s, apart from the reads' (0 = unlimited)")
    p.add_argument("--debug", action="store_true", help="libfuse debug output")
    slowpfs_generated.add_arguments(p)
    args = p.parse_intermixed_args(argv)
    try:
        generated = slowpfs_generated.from_args(args)
    except ConfigError as exc:
        p.error(str(exc))
    if generated is not None and (args.mountpoint is not None or args.writable):
        p.error("--generate N takes no SRC (only MOUNTPOINT) and no --writable")
    if generated is None and args.mountpoint is None:
        p.error("the following arguments are required: MOUNTPOINT")
    src, mountpoint = (generated, args.src) if generated is not None else (args.src, args.mountpoint)
    if not args.writable and (args.write_latency_ms or args.write_bandwidth):
        p.error("--write-latency-ms and --write-bandwidth need --writable")
    latency = Latency(open_s=args.open_latency_ms / 1e3, read_s=args.read_latency_ms / 1e3,
                      bandwidth=args.bandwidth * 1e6, lookup_s=args.lookup_latency_ms / 1e3,
                      page_cache=args.page_cache, write_s=args.write_latency_ms / 1e3,
                      write_bandwidth=args.write_bandwidth * 1e6)
    try:
        mount(src, mountpoint, args.counters, latency, debug=args.debug, max_threads=args.max_threads,
              writable=args.writable)
    except (SlowPFSError, RuntimeError, OSError) as exc:
        print(f"slowpfs: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
