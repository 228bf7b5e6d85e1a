"""The C peer data path between two real MPI ranks (test_datapath.py): node 1 offers staged
files, node 0 fetches them; every answer of dp_fetch is reached for real.

With ``index`` after the work directory, node 1 lends an index listing the files first (as a
cluster's daemon lends its snapshot's), so its offers are bytes at their entries; between the
rounds it lends none (every offer by key again), then a copy of it (the offers numbered anew,
their kept files with them), and at the end offers the files of an index of INDEXED files and
reports what that cost it."""

import ctypes
import json
import os
import shutil
import struct
import sys
import time

from monarch import index_layout, protocol
from monarch.cluster import datapath as dp
from monarch.cluster import world
from monarch.node.stage.block_map import (BLOCK, BLOCK_ABSENT, BLOCK_SHIFT, BLOCK_STAGED, BLOCKMAP_HEADER,
                                          BLOCKMAP_MAGIC, BLOCKMAP_VERSION)
from monarch.node.tiers.tiers import BLOCKMAP_DIR, BLOCKS_DIR



MALLINFO = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


def allocated() -> int:
    """The bytes malloc has handed out and not taken back, its heap's and its mmaps' (glibc's
    mallinfo2; before glibc 2.33 mallinfo, whose ints hold these few megabytes as well)."""
    libc = ctypes.CDLL(None)
    wide = hasattr(libc, "mallinfo2")
    fn = libc.mallinfo2 if wide else libc.mallinfo
    fn.restype = type("MallInfo", (ctypes.Structure,),
                      {"_fields_": [(name, ctypes.c_size_t if wide else ctypes.c_int) for name in MALLINFO]})
    info = fn()
    return info.uordblks + info.hblkhd


def lendable(index: bytes) -> bytearray:
    """``index`` (build_index's: up to its used end) as long as its file would be (its header's size)."""
    return bytearray(index).ljust(protocol.INDEX_HEADER.unpack_from(index)[15], b"\0")


work = sys.argv[1]
by_index = sys.argv[2:] == ["index"]
INDEXED = 200_000
MPI = world.load_mpi()
comm = MPI.COMM_WORLD
path = dp.DataPath.start(MPI, comm)
out = {"node": comm.rank, "started": path is not None, "thread_multiple": MPI.Query_thread() == MPI.THREAD_MULTIPLE}
if path is not None:
    # the owner's tier in RAM (tmpfs), as a RAM tier is: its kept files are also mapped
    tier = os.path.join(f"/dev/shm{work}" if comm.rank == 1 else work, f"tier{comm.rank}")
    files = {"0/a/small.bin": os.urandom(100), "0/a/mid.bin": os.urandom(200_000), "0/empty.bin": b"",
             "0/big.bin": os.urandom(dp.ONE_MESSAGE_MAX + 1), "0/not-offered.bin": os.urandom(10)}
    files = comm.bcast(files if comm.rank == 1 else None, root=1)
    if comm.rank == 1:
        for key, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(tier, key)), exist_ok=True)
            with open(os.path.join(tier, key), "wb") as f:
                f.write(data)
        path.tier(3, tier)
        if by_index:
            listed = [*files, "0/withdrawn.bin", "0/other.bin"]
            st = os.stat(os.path.join(tier, "0/a/small.bin"))
            index = index_layout.build_index([(key.encode(), st) for key in listed])
            path.use_index(lendable(index))
        for key in files:
            if key != "0/not-offered.bin":
                path.offer(key, 3)
        path.offer("0/withdrawn.bin", 3)
        path.withdraw("0/withdrawn.bin")
    comm.Barrier()
    if comm.rank == 0:
        got = {}

        def fetch(key, size, timeout=2.0):
            fd = os.open(os.path.join(work, "got"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                n = path.fetch(1, key, size, fd, timeout)
                os.lseek(fd, 0, os.SEEK_SET)
                return n, os.read(fd, size + 1) if n >= 0 else b""
            finally:
                os.close(fd)

        for key in ("0/a/small.bin", "0/a/mid.bin", "0/empty.bin"):
            n, data = fetch(key, len(files[key]))
            got[key] = [n, data == files[key]]
        got["big"] = fetch("0/big.bin", len(files["0/big.bin"]))[0]          # larger than one message
        got["not_offered"] = fetch("0/not-offered.bin", 10)[0]
        got["withdrawn"] = fetch("0/withdrawn.bin", 10)[0]
        got["other_size"] = fetch("0/a/small.bin", 99)[0]                   # the snapshot says another size
        got["self"] = path.fetch(0, "0/a/small.bin", 100, 1, 1.0)          # never asks itself
        out["fetched"] = got
        # hostile requests on the path's own communicator (a peer's bytes are not trusted): each
        # is dropped unanswered, and the owner goes on answering
        bad = [b"", b"\x10\x00\x00\x00", struct.pack("<II", 17, 0), struct.pack("<II", 18, 1000),
               struct.pack("<IIQII", 19, 1, 5, 999, 0) + b"0/a/small.bin",
               struct.pack("<IIQII", 20, 1, 1 << 40, 13, 0) + b"0/a/small.bin"]
        for msg in bad:
            path._comm.Send(msg, dest=1, tag=1)
        before = path.counts()["requests"]
        names = ["0/a/small.bin", "0/a/mid.bin", "0/empty.bin", "0/not-offered.bin", "0/a/small.bin"]
        sizes = [100, 200_000, 0, 10, 99]
        fds = [os.memfd_create("t") for _ in names]
        try:
            res = path.fetch_many(1, list(zip(names, sizes, fds)), 2.0)
            same = [os.pread(fd, size + 1, 0) == files[name] for fd, name, size in zip(fds, names, sizes)]
            out["batch"] = {"results": res, "same": same, "offsets": [os.lseek(fd, 0, os.SEEK_CUR) for fd in fds],
                            "requests": path.counts()["requests"] - before}
        finally:
            for fd in fds:
                os.close(fd)
        out["too_many"] = path.fetch_many(1, [("0/a/small.bin", 100, 1)] * (dp.BATCH_FILES_MAX + 1), 1.0)[0]
    comm.Barrier()
    out["counts"] = path.counts()
    if by_index and comm.rank == 1:  # none lent (every offer by key), then the same index anew: renumbered
        path.use_index(None)
        out["offered_without_index"] = path.counts()["offered"]
        path.use_index(lendable(index))
        out["offered_after_renumbering"] = path.counts()["offered"]
    comm.Barrier()
    # spans of a large file staged by blocks (its copy and map, as blocks.py writes them): those
    # whose blocks are all STAGED cross in C, written at their offset; anything else is handed back
    big_key, size, mtime = "0/tok.bin", 5 * BLOCK + 1000, 1_700_000_000_123_456_789
    tok = comm.bcast(os.urandom(size) if comm.rank == 1 else None, root=1)
    states = [BLOCK_STAGED, BLOCK_STAGED, BLOCK_ABSENT, BLOCK_STAGED, BLOCK_STAGED, BLOCK_STAGED]
    if comm.rank == 1:
        for sub, data in ((BLOCKS_DIR, tok), (BLOCKMAP_DIR, BLOCKMAP_HEADER.pack(
                BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT, size, mtime, len(states), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) + bytes(states))):
            os.makedirs(os.path.join(tier, sub, "0"), exist_ok=True)
            with open(os.path.join(tier, sub, big_key), "wb") as f:
                f.write(data)
        path.offer_blocks(big_key, 3)
    comm.Barrier()
    if comm.rank == 0:
        spans = {}

        def span(name, key, offset, length, version=(size, mtime), data=tok):
            fd = os.memfd_create("span")
            try:
                os.ftruncate(fd, len(data))
                n = path.fetch_range(1, key, *version, offset, length, fd, 2.0)
                whole = os.pread(fd, len(data) + 1, 0)
                spans[name] = [n, n < 0 or (whole[offset:offset + n] == data[offset:offset + n]
                                            and whole.count(0) == len(data) - n + data[offset:offset + n].count(0))]
            finally:
                os.close(fd)

        span("staged", big_key, 3 * BLOCK + 5, 2 * BLOCK + 995)         # blocks 3-5, to the file's end
        span("first_two", big_key, 0, 2 * BLOCK)
        span("absent", big_key, BLOCK, 2 * BLOCK)                       # block 2 not staged
        span("other_mtime", big_key, 0, BLOCK, (size, mtime + 1))
        span("other_size", big_key, 0, BLOCK, (size + 1, mtime))
        span("past_end", big_key, size - 10, 11)
        span("too_long", big_key, 0, dp.RANGE_MAX + 1)
        span("not_offered", "0/other.bin", 0, 10)
        span("whole_copy", "0/a/mid.bin", 1000, 5000, (200_000, 0), files["0/a/mid.bin"])  # offered whole
        bad = [struct.pack("<IHHQII", 21, 1, 2, size, len(big_key), 0) + struct.pack("<QQq", size, 10, mtime)
               + big_key.encode(),                                                  # past the end
               struct.pack("<IHHQII", 22, 2, 2, size, len(big_key), 0) + struct.pack("<QQq", 0, 10, mtime)
               + big_key.encode(),                                                  # two items
               struct.pack("<IHHQII", 23, 1, 2, size, len(big_key), 0) + struct.pack("<QQq", 0, 0, mtime)
               + big_key.encode()]                                                  # empty
        for msg in bad:
            path._comm.Send(msg, dest=1, tag=1)
        span("after_hostile", big_key, 0, BLOCK)
        out["spans"] = spans
    comm.Barrier()
    if comm.rank == 1:
        path.offer_blocks(big_key, -1)
    comm.Barrier()
    if comm.rank == 0:
        fd = os.memfd_create("span")
        out["spans"]["withdrawn"] = [path.fetch_range(1, big_key, size, mtime, 0, BLOCK, fd, 2.0), True]
        os.close(fd)
    comm.Barrier()
    out["range_counts"] = {k: v for k, v in path.counts().items() if "range" in k}
    comm.Barrier()
    # the owner keeps the descriptor of a file it read; a copy offered anew, or withdrawn and
    # offered again, is read afresh (its new bytes), and a withdrawn one's descriptor is closed
    def tier_fds():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(tier)
            except OSError:
                pass
        return n

    def tier_maps():
        with open("/proc/self/maps") as f:
            return sum(tier + "/" in line for line in f)

    def replace(key, data):            # a new copy renamed over the old, as a tier's copies are made
        with open(os.path.join(tier, key + ".new"), "wb") as f:
            f.write(data)
        os.replace(os.path.join(tier, key + ".new"), os.path.join(tier, key))

    small = "0/a/small.bin"
    for step, data in (("offered_anew", b"new1" * 25), ("withdrawn_and_offered", b"new2" * 25)):
        if comm.rank == 1:
            out.setdefault("kept_before", []).append(tier_fds())
            out.setdefault("maps_before", []).append(tier_maps())
            if step == "withdrawn_and_offered":
                path.withdraw(small)
            replace(small, data)
            path.offer(small, 3)
        comm.Barrier()
        if comm.rank == 0:
            n, got_bytes = fetch(small, 100)
            out[step] = [n, got_bytes == data]
        comm.Barrier()
    if comm.rank == 1:
        for key in files:
            path.withdraw(key)
        time.sleep(0.2)                # the owner's thread closes them at its next turn (1 ms idle at most)
        out["kept_after_withdrawal"] = tier_fds()
        out["maps_after_withdrawal"] = tier_maps()
    comm.Barrier()
    if by_index:  # a node's share of many files offered: their cost in the owner's memory
        keys = [f"0/many/d{i // 1000}/f{i}.bin" for i in range(INDEXED)]
        if comm.rank == 1:
            path.use_index(lendable(index_layout.build_index([(key.encode(), st) for key in keys])))
            os.makedirs(os.path.join(tier, "0/many/d7"))
            with open(os.path.join(tier, keys[7777]), "wb") as f:
                f.write(b"seven" * 20)
            before = allocated()
            for key in keys[:1000]:
                path.offer(key, 3)
            first = allocated() - before  # by key while the records weigh less than a byte a file
            for key in keys[1000:]:
                path.offer(key, 3)
            out["many"] = {"offered": path.counts()["offered"], "allocated": allocated() - before,
                           "first_thousand": first}
        comm.Barrier()
        if comm.rank == 0:
            n, data = fetch(keys[7777], 100)
            out["many_fetched"] = [n, data == b"seven" * 20]
        comm.Barrier()
        if comm.rank == 1:
            for key in keys:
                path.withdraw(key)
            out["many"]["after_withdrawal"] = path.counts()["offered"]
    comm.Barrier()
    if comm.rank == 1:
        path.stop()                    # its thread gone: a request to it is never answered
    comm.Barrier()
    if comm.rank == 0:
        t0 = time.monotonic()
        out["silent_owner"] = [fetch("0/a/small.bin", 100, timeout=0.3)[0], time.monotonic() - t0]
        t0 = time.monotonic()
        path.lost(1)
        out["lost_owner"] = [fetch("0/a/small.bin", 100)[0], time.monotonic() - t0]
        path.stop()
        out["stopped"] = fetch("0/a/small.bin", 100)[0]
if comm.rank == 1:
    shutil.rmtree(os.path.dirname(tier), ignore_errors=True)
print("RESULT " + json.dumps(out), flush=True)
