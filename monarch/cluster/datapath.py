"""The peer data path in C (``datapath.c``): staged files between daemons with no Python on the way.

An installed wheel holds it built for the MPICH ABI (``PACKAGED``: MPICH, Intel MPI, Cray MPICH,
MVAPICH all load as ``libmpi.so.12``), linked to no MPI: it takes the symbols of the library
this process loaded. Under another MPI (Open MPI's ``libmpi.so.40``), or in a checkout, it is
built on first use against the MPI library this process loaded (its ``mpi.h`` beside it),
cached by the source's and the library's hash. It needs MPI_THREAD_MULTIPLE (``world.load_mpi`` asks for it): the Python engine keeps
the control plane on the cluster's communicator while this path's thread owns a Dup of it.
Whatever this path cannot do it hands back (``HANDED_BACK``): the caller then takes Python's
protocol, which does everything (staging on demand, chunks, compressed copies, refusals).
Without a compiler or ``mpi.h``, or with ``MONARCH_PEER_DATAPATH=0``, Python's protocol is
the only one.

The contract with the C side is ``datapath.h``: what a fetch answers (``HANDED_BACK``...,
its DATAPATH_ANSWERS without DP_), the limits (DATAPATH_LIMITS), the counters (``Counts``) and
the functions called here (``_PROTOTYPES``); ``tests/unit/cluster/test_datapath_header.py``
holds this module to it.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from pathlib import Path
from typing import Any

from monarch import protocol
from monarch.routes import ONE_MESSAGE_MAX  # noqa: F401 (datapath.h's DP_ONE_MESSAGE_MAX: the route table's)

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("datapath.c")
PACKAGED = SOURCE.with_name("libmonarch_datapath_mpich.so")  # the wheel's, for the MPICH ABI (setup.py)
MPICH_ABI = "libmpi.so.12"

# datapath.h is the one definition of each name below (DATAPATH_ANSWERS, DATAPATH_LIMITS, struct dp_counts)
# what a fetch answers for a file below 0 (>= 0: its bytes written)
HANDED_BACK, TIMEOUT, MPI_ERROR, CORRUPT, LOCAL_IO, STOPPED, LOST, COMING = -1, -2, -3, -4, -5, -6, -7, -8
BATCH_FILES_MAX = 64  # files in one request (fetch_many), ...
BATCH_BYTES_MAX = 4 << 20  # ... and their bytes together: one reply
KEY_MAX = 4096  # a key's bytes
RANGE_MAX = 8 << 20  # a span of a large file's blocks in one message (fetch_range)
MAX_PEERS = 65536  # nodes the path can tell lost
ENV_DATAPATH = "MONARCH_PEER_DATAPATH"


class Counts(ctypes.Structure):
    """dp_counts' record (struct dp_counts), by name."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "served_files", "served_bytes", "handed_back", "fetched_files", "fetched_bytes", "mpi_errors", "offered",
        "requests", "served_requests", "waits", "idle_sleeps", "served_ranges", "served_range_bytes",
        "fetched_ranges", "fetched_range_bytes")]


_vp, _i, _cp, _u64, _i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int64
_ip, _cpp, _u64p, _i64p = ctypes.POINTER(_i), ctypes.POINTER(_cp), ctypes.POINTER(_u64), ctypes.POINTER(_i64)
_PROTOTYPES = {
    "dp_thread_multiple": (_i, []),
    "dp_start": (_vp, [ctypes.c_ssize_t, _i]),
    "dp_tier": (None, [_vp, _i, _cp]),
    "dp_forget": (None, [_vp, _cp, _i]),
    "dp_blocks": (None, [_vp, _cp, _i, _i]),
    "dp_fetch_range": (_i64, [_vp, _i, _cp, _i, _u64, _i64, _u64, _u64, _i, _i]),
    "dp_fetch_pages": (_i64, [_vp, _i, _cp, _i, _u64, _i64, _u64, _u64, _cp, _i]),
    "dp_lost": (None, [_vp, _i]),
    "dp_index": (None, [_vp, _vp, _u64]),
    "dp_counts": (None, [_vp, ctypes.POINTER(Counts)]),
    "dp_stop": (None, [_vp]),
    # handed to the front door by address too (front_door_peers)
    "dp_staged": (None, [_vp, _cp, _i, _i]),
    "dp_fetch": (_i64, [_vp, _i, _cp, _i, _u64, _i, _i]),
    "dp_fetch_many": (_i, [_vp, _i, _i, _cpp, _ip, _u64p, _ip, _i64p, _i]),
    "dp_describe": (_i, [_vp, _i, _i, _cpp, _ip, _vp, _i64p, _i, _i]),
    "dp_take_wanted": (_i, [_vp, ctypes.POINTER(ctypes.c_uint32), _i, _i]),
    "dp_post": (_vp, [_vp, _i, _i, _cpp, _ip, _u64p, _i, _i, _ip]),
    "dp_test": (_i, [_vp, _vp]),
    "dp_take": (None, [_vp, _vp, _u64p, _i64p, _vp, _vp]),
}

_lib: ctypes.CDLL | None = None
_tried = False


def wanted() -> bool:
    return os.environ.get(ENV_DATAPATH, "1") not in ("0", "no", "off", "false")


def loaded_libmpi() -> Path | None:
    """The MPI library this process has mapped (mpi4py's), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                name = os.path.basename(path)
                if name.startswith("libmpi.so") or name.startswith("libmpi_abi.so"):
                    return Path(path)
    except OSError:
        pass
    return None


def library() -> ctypes.CDLL | None:
    """The data path's library, built for the loaded MPI; None (said once) when it cannot be."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    try:
        _lib = _load()
    except Exception as e:  # no compiler, no mpi.h: Python's protocol, never wrong
        log.info("the C peer data path is not available (%s); files cross through Python's protocol",
                 str(e).splitlines()[0] if str(e) else type(e).__name__)
    return _lib


def _load() -> ctypes.CDLL:
    from monarch.native.build import build_library, installed_current, sha256, source_digest
    libmpi = loaded_libmpi()
    if libmpi is None:
        raise OSError("no MPI library is loaded in this process")
    if libmpi.name.startswith(MPICH_ABI) and installed_current(PACKAGED, SOURCE):
        ctypes.CDLL(str(libmpi), mode=ctypes.RTLD_GLOBAL)  # its MPI symbols, for a library linked to none
        return _prototyped(ctypes.CDLL(str(PACKAGED)))
    include = libmpi.resolve().parent.parent / "include"
    if not (include / "mpi.h").exists():
        raise OSError(f"no mpi.h beside {libmpi} (looked in {include})")
    h = sha256(source_digest(SOURCE).encode() + str(libmpi.resolve()).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "monarch"
    built = cache / f"{h}-libmonarch_datapath.so"
    if not built.exists():
        build_library(built, SOURCE, "the C peer data path", extra=[f"-I{include}", str(libmpi)])
    return _prototyped(ctypes.CDLL(str(built)))


def _prototyped(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class DataPath:
    """One daemon's end of the data path, on ``comm`` (a communicator of its own)."""

    def __init__(self, lib: ctypes.CDLL, handle: int, comm: Any):
        self._lib = lib
        self._dp = handle
        self._comm = comm  # kept: the C side uses its handle
        self._stopped = False
        self._indexes: list = []  # the indexes lent (use_index): the owner's thread may read each until it stops

    @classmethod
    def start(cls, MPI: Any, comm: Any) -> DataPath | None:
        """Collective over ``comm``: a Dup of it for the data path on every node, used only
        when every node could start its end (else Python's protocol everywhere)."""
        lib = library() if wanted() else None
        ok = lib is not None and MPI.Query_thread() == MPI.THREAD_MULTIPLE
        dup = comm.Dup()
        dup.Set_errhandler(MPI.ERRORS_RETURN)
        handle = lib.dp_start(MPI._handleof(dup), dup.Get_attr(MPI.TAG_UB) or 32767) if ok else None
        if not comm.allreduce(int(bool(handle)), op=MPI.MIN):
            if handle:
                lib.dp_stop(handle)
            why = "off on some node" if ok else ("not at MPI_THREAD_MULTIPLE" if lib is not None else "not built")
            log.info("the C peer data path is not used (%s): files cross through Python's protocol", why)
            return None
        return cls(lib, handle, dup)

    # -- the owner's side: what it may answer itself --------------------------------------
    def tier(self, slot: int, path: str) -> None:
        self._lib.dp_tier(self._dp, slot, os.fsencode(path))

    def offer(self, key: str, slot: int) -> None:
        """``key`` is staged raw in tier ``slot``: answered from C from now on."""
        raw = protocol.key_bytes(key)
        self._lib.dp_staged(self._dp, raw, len(raw), slot)

    def withdraw(self, key: str) -> None:
        raw = protocol.key_bytes(key)
        self._lib.dp_forget(self._dp, raw, len(raw))

    def offer_blocks(self, key: str, slot: int) -> None:
        """Large file ``key`` is staged by blocks in tier ``slot`` (-1: no longer): spans of its
        staged blocks are answered from C."""
        raw = protocol.key_bytes(key)
        self._lib.dp_blocks(self._dp, raw, len(raw), slot)

    # -- the requester's side ------------------------------------------------------------------
    def fetch(self, owner: int, key: str, size: int, fd: int, timeout: float) -> int:
        """``key``'s ``size`` bytes from ``owner`` written into ``fd``: the bytes written, or
        one of HANDED_BACK, TIMEOUT, MPI_ERROR, CORRUPT, LOCAL_IO, STOPPED, LOST."""
        raw = protocol.key_bytes(key)
        return self._lib.dp_fetch(self._dp, owner, raw, len(raw), size, fd, max(1, int(timeout * 1000)))

    def fetch_range(self, owner: int, key: str, size: int, mtime_ns: int, offset: int, length: int, fd: int,
                    timeout: float) -> int:
        """Bytes [offset, offset + length) of large file ``key`` (``size`` bytes, ``mtime_ns``) from
        ``owner``'s staged blocks, written into ``fd`` at ``offset``: the bytes written, or one of
        HANDED_BACK (not all staged there, or longer than RANGE_MAX), TIMEOUT, MPI_ERROR, CORRUPT,
        LOCAL_IO, STOPPED, LOST."""
        raw = protocol.key_bytes(key)
        return self._lib.dp_fetch_range(self._dp, owner, raw, len(raw), size, mtime_ns, offset, length, fd,
                                        max(1, int(timeout * 1000)))

    def fetch_many(self, owner: int, items: list[tuple[str, int, int]], timeout: float) -> list[int]:
        """Many files from ``owner`` in one request and one reply: ``items`` (key, size, fd), each
        file written into its fd at offset 0. Per item: the bytes written, or one of
        HANDED_BACK, TIMEOUT, MPI_ERROR, CORRUPT, LOCAL_IO, STOPPED, LOST."""
        n = len(items)
        raws = [protocol.key_bytes(key) for key, _, _ in items]
        keys = (ctypes.c_char_p * n)(*raws)
        lens = (ctypes.c_int * n)(*map(len, raws))
        sizes = (ctypes.c_uint64 * n)(*(size for _, size, _ in items))
        fds = (ctypes.c_int * n)(*(fd for _, _, fd in items))
        results = (ctypes.c_int64 * n)()
        self._lib.dp_fetch_many(self._dp, owner, n, keys, lens, sizes, fds, results, max(1, int(timeout * 1000)))
        return list(results)

    def use_index(self, index: bytearray | mmap.mmap | None) -> None:
        """The index this node publishes, as the daemon holds it (its mapping: lent, held here while
        the path runs; None: none): a peer's DESCRIBE of a file this node describes there is answered
        from it (dp_describe), so that the peer never stats it on the PFS."""
        if index is None:
            self._lib.dp_index(self._dp, None, 0)
            return
        lent = (ctypes.c_char * len(index)).from_buffer(index)  # held: the bytes stay where they are
        self._indexes.append(lent)
        self._lib.dp_index(self._dp, ctypes.addressof(lent), len(index))

    def describe(self, owner: int, key: str, timeout: float, wanted: bool = False) -> bytes | int:
        """``key``'s INDEX_ENTRY as node ``owner``'s index has it, or why not (HANDED_BACK: not described
        there; COMING, with ``wanted``: not yet, its owner copies it now; another answer below 0)."""
        raw = key.encode("utf-8", "surrogateescape")
        out = ctypes.create_string_buffer(protocol.INDEX_ENTRY.size)
        result = (ctypes.c_int64 * 1)()
        self._lib.dp_describe(self._dp, owner, 1, (ctypes.c_char_p * 1)(raw), (ctypes.c_int * 1)(len(raw)), out, result,
                              int(wanted), max(1, int(timeout * 1000)))
        return out.raw if result[0] >= 0 else result[0]

    def describe_functions(self) -> tuple[int, int]:
        """The addresses of dp_describe and dp_take_wanted (front_door_peer_describe: the door describes
        another node's listed file from its owner's index; its lane copies first what peers want)."""
        return (ctypes.cast(self._lib.dp_describe, ctypes.c_void_p).value,
                ctypes.cast(self._lib.dp_take_wanted, ctypes.c_void_p).value)

    def fetch_many_function(self) -> int:
        """The address of dp_fetch_many (front_door_peers: the door's batched fetches)."""
        return ctypes.cast(self._lib.dp_fetch_many, ctypes.c_void_p).value

    def flight_functions(self) -> tuple[int, int, int]:
        """The addresses of dp_post, dp_test and dp_take (front_door_peers: the read-ahead lane
        keeps many owners' requests in flight at once from one thread)."""
        return tuple(ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value
                     for name in ("dp_post", "dp_test", "dp_take"))

    def fetch_pages_function(self) -> tuple[int, int]:
        """(address of dp_fetch_pages, this path's handle): for the front door to answer a shim's
        PAGES from the block's owner itself (front_door_pages)."""
        return ctypes.cast(self._lib.dp_fetch_pages, ctypes.c_void_p).value, self._dp

    def fetch_function(self) -> tuple[int, int, int]:
        """(address of dp_fetch, of dp_staged, this path's handle): for the front door to fetch
        other nodes' files, and offer its own copies, itself."""
        return (ctypes.cast(self._lib.dp_fetch, ctypes.c_void_p).value,
                ctypes.cast(self._lib.dp_staged, ctypes.c_void_p).value, self._dp)

    def lost(self, node: int) -> None:
        """``node`` is lost: its fetches end at once; with ULFM its failure is acknowledged on
        this path's communicator too, so that the owner's wildcard probe works again."""
        self._lib.dp_lost(self._dp, node)
        try:
            self._comm.Ack_failed()
        except Exception:  # MPICH, or an mpi4py without it: nothing to acknowledge
            pass

    def counts(self) -> dict[str, int]:
        c = Counts()
        self._lib.dp_counts(self._dp, ctypes.byref(c))
        return {name: getattr(c, name) for name, _ in Counts._fields_}

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._lib.dp_stop(self._dp)
